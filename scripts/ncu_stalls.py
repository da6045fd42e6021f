"""Summarise an `ncu --page source --print-source sass --csv` dump: the SASS instructions with the
most warp-stall samples, and the stall reasons summed over the kernel.

    python3 scripts/ncu_stalls.py dump.csv [top]"""
import csv
import sys
from collections import Counter


def main(path, top=30):
    rows = list(csv.reader(open(path, newline="")))
    head_i = next(i for i, r in enumerate(rows) if any("Warp Stall Sampling (All Samples)" in c for c in r))
    head = rows[head_i]
    col = {name: i for i, name in enumerate(head)}
    samples = col["Warp Stall Sampling (All Samples)"]
    source = next(i for i, name in enumerate(head) if name in ("Source", "# Source"))
    address = next((i for i, name in enumerate(head) if name == "Address"), None)
    reasons = [i for i, name in enumerate(head) if name.startswith("stall_") or name.startswith("smsp__pcsamp")]
    body = [r for r in rows[head_i + 1:] if len(r) == len(head) and r[samples].replace(",", "").isdigit()]
    total = sum(int(r[samples].replace(",", "")) for r in body)
    print(f"{len(body)} SASS lines, {total} stall samples")
    by_reason = Counter()
    for r in body:
        for i in reasons:
            v = r[i].replace(",", "")
            if v.replace(".", "").isdigit():
                by_reason[head[i]] += float(v)
    for name, v in by_reason.most_common(12):
        print(f"  {name:50} {v:10.0f} ({v / max(total, 1):.1%})")
    for r in sorted(body, key=lambda r: -int(r[samples].replace(",", "")))[:top]:
        n = int(r[samples].replace(",", ""))
        print(f"{n:7d} {n / max(total, 1):6.1%}  {r[address] if address is not None else ''}  {r[source][:110]}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30)
