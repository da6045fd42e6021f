"""One line per demo result: the seed MLP's latencies and ratios, GPT-2's MLP/block ratios per shape.

    python3 scripts/demo_summary.py OUT_DIR   (reads mlp.json and gpt2.json written by the demos' --out)"""
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
d = json.loads((out / "mlp.json").read_text())
print("seed MLP", {k: round(v, 1) for k, v in d["latency_us"].items()}, "ratio", round(d["ratio"], 3),
      "graph", round(d["ratio_graph"], 3))
for t in json.loads((out / "gpt2.json").read_text())["timings"]:
    print("gpt2", t["shape"], "mlp eager", round(t["mlp_ratio"], 3), "graph", round(t["mlp_ratio_graph"], 3),
          "block", round(t["block_ratio"], 3))
