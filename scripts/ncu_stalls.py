"""Where a kernel's warps wait: summarises Nsight Compute's source page (SASS with warp-stall
sampling) into the stall reasons summed over the kernel, the loops that hold the most samples, and
the SASS instructions with the most samples. Reads a CSV export, needs no GPU:

    ncu --profile-from-start off -k regex:deepgemm_kernel --set full -o prof \\
        python3 scripts/ncu_shapes.py 512x3072x768 'v5:{"DG_BN": 128, "DG_STAGES": 6}'
    ncu -i prof.ncu-rep --page source --print-source sass --csv > dump.csv
    python3 scripts/ncu_stalls.py dump.csv --top 40
"""
from __future__ import annotations

import argparse
import csv
import re
from collections import Counter

# A branch and its target address: `@!P0  BRA 0x7f...`, `BRA.U.ANY 0x7f...`.
_BRANCH = re.compile(r"\bBRA(?:\.[A-Z.]+)?\s+(0x[0-9a-fA-F]+)")


def _number(text: str) -> float | None:
    text = text.replace(",", "")
    return float(text) if text.replace(".", "", 1).isdigit() else None


def loops(lines: list[tuple[int, str, int]]) -> list[tuple[int, int, int, int]]:
    """(first address, last address, samples, instructions) of every loop, the most samples first.
    lines: (address, SASS text, samples) in address order. A loop is the span from a backward
    branch's target to the branch; a loop's samples are what a profile spread over many lines of
    one loop adds up to (a loop of 40 instructions at 1 % each is where the warps are)."""
    found = []
    for i, (address, text, _) in enumerate(lines):
        m = _BRANCH.search(text)
        if not m or int(m.group(1), 16) > address:
            continue
        target = int(m.group(1), 16)
        body = [n for a, _, n in lines[:i + 1] if a >= target]
        found.append((target, address, sum(body), len(body)))
    return sorted(found, key=lambda x: -x[2])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="ncu --page source --print-source sass --csv output")
    ap.add_argument("--top", type=int, default=30, help="SASS lines to list (default: 30)")
    ap.add_argument("--loops", type=int, default=5, help="loops to list (default: 5)")
    args = ap.parse_args(argv)

    with open(args.csv, newline="") as f:
        rows = list(csv.reader(f))
    head_i = next((i for i, r in enumerate(rows) if any("Warp Stall Sampling (All Samples)" in c for c in r)), None)
    if head_i is None:
        ap.error("no 'Warp Stall Sampling (All Samples)' column: was the report taken with --set full?")
    head = rows[head_i]
    samples = head.index(next(c for c in head if "Warp Stall Sampling (All Samples)" in c))
    source = next(i for i, name in enumerate(head) if name in ("Source", "# Source"))
    address = next((i for i, name in enumerate(head) if name == "Address"), None)
    reasons = [i for i, name in enumerate(head) if name.startswith(("stall_", "smsp__pcsamp"))]
    body = [r for r in rows[head_i + 1:] if len(r) == len(head) and _number(r[samples]) is not None]
    count = {id(r): int(_number(r[samples])) for r in body}
    total = sum(count.values())
    print(f"{len(body)} SASS lines, {total} stall samples")
    by_reason = Counter()
    for r in body:
        for i in reasons:
            v = _number(r[i])
            if v is not None:
                by_reason[head[i]] += v
    for name, v in by_reason.most_common(12):
        print(f"  {name:50} {v:10.0f} ({v / max(total, 1):.1%})")
    if address is not None:
        def at(r):
            try:
                return int(r[address], 16)
            except ValueError:
                return None
        sass = sorted(line for line in ((at(r), r[source], count[id(r)]) for r in body) if line[0] is not None)
        found = loops(sass)
        for first, last, n, size in found[:args.loops]:
            # innermost: no other loop inside it (an outer loop's samples include its inner loops')
            inner = not any(f >= first and l <= last and (f, l) != (first, last) for f, l, _, _ in found)
            print(f"loop {first:#x}-{last:#x} ({size} instructions): {n} samples ({n / max(total, 1):.1%})"
                  + (", innermost" if inner else ""))
    for r in sorted(body, key=lambda r: -count[id(r)])[:args.top]:
        n = count[id(r)]
        print(f"{n:7d} {n / max(total, 1):6.1%}  {r[address] if address is not None else ''}  {r[source][:110]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
