#!/usr/bin/env python3
"""Per-request instruction counts of two fig1 configurations and their largest per-function
differences, from the `callgrind_annotate` files `fig1_callgrind.sh` writes.

    python3 benches/scripts/callgrind_diff.py OUT_DIR TRACED UNTRACED [ROWS]
"""
import collections
import re
import sys

# quanta's TSC calibration runs once per process for a timing-dependent number of rounds.
CALIBRATION = "call_once_force::{{closure}}'2"


def load(path):
    counts = collections.Counter()
    for line in open(path):
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(.*)$", line)
        if m and "PROGRAM TOTALS" not in line and CALIBRATION not in line:
            counts[m.group(2).strip()] += int(m.group(1).replace(",", ""))
    return counts


def per_request(out, config):
    big = load(f"{out}/cg.{config}.200.txt")
    small = load(f"{out}/cg.{config}.40.txt")
    return {k: (big[k] - small.get(k, 0)) / 400 for k in set(big) | set(small)}


def main():
    out, a, b = sys.argv[1:4]
    rows = int(sys.argv[4]) if len(sys.argv) > 4 else 40
    ta, tb = per_request(out, a), per_request(out, b)
    diff = {k: ta.get(k, 0) - tb.get(k, 0) for k in set(ta) | set(tb)}
    print(f"config {a}: {sum(ta.values()) / 1000:.1f} k instructions per request")
    print(f"config {b}: {sum(tb.values()) / 1000:.1f} k instructions per request")
    print(f"difference: {sum(diff.values()) / 1000:.1f} k per request; largest by function:")
    for name, v in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:rows]:
        print(f"{v:9.0f}  {name[:160]}")


if __name__ == "__main__":
    main()
