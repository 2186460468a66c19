#!/usr/bin/env python3
"""Evaluate `cpt traces anomalies` on every labelled injection of the Nezha
TrainTicket set (docs/src/guide/mystery.md, "Anomalies"): train on the two fault-free
minutes, test on the injection minute and the two after it, label the test
requests that start after the injection and call the injected service, and
collect precision / recall at k = positives / 2 and k = positives for the
PCA ranking and the latency-only ranking.

    python3 docs/mystery/trainticket_faults.py [CPT] > table.md
"""
import datetime
import glob
import json
import os
import re
import subprocess
import sys

CPT = sys.argv[1] if len(sys.argv) > 1 else "target/release/cpt"
D = "testdata/traces/nezha-trainticket"
ROW = re.compile(r"^\s*(\d+)\s+([\d.]+) / ([\d.]+)\s+([\d.]+) / ([\d.]+)")

rows = []
for lst in sorted(glob.glob(f"{D}/fault/*-fault_list.json")):
    for hour in json.load(open(lst)).values():
        for f in hour:
            t = datetime.datetime.strptime(f["inject_time"], "%Y-%m-%d %H:%M:%S")
            svc = re.sub(r"-[0-9a-f]+-[0-9a-z]+$", "", f["inject_pod"])
            files = [
                f"{D}/fault/{(t + datetime.timedelta(minutes=m)).strftime('%Y-%m-%d_%H_%M')}_trace.csv.gz"
                for m in range(3)
            ]
            files = [x for x in files if os.path.exists(x)]
            if not files:
                continue
            out = subprocess.run(
                [CPT, "traces", "anomalies", "--from", "nezha", "-q", "--top", "0",
                 *sorted(glob.glob(f"{D}/normal/*.gz")), "--test", *files,
                 "--fault", f"{svc}@{t.isoformat()}Z"],
                capture_output=True, text=True, check=True,
            ).stdout
            m = re.search(r"(\d+) of (\d+) test requests labelled faulty", out)
            at = {int(r[1]): tuple(map(float, r.groups()[1:])) for r in map(ROW.match, out.splitlines()) if r}
            pos, n = int(m[1]), int(m[2])
            rows.append((f["inject_type"], svc, f["inject_time"], pos, n, at.get(pos // 2), at.get(pos)))

print("| fault | service | injected (UTC) | positives | PCA P/R at k = pos/2 | latency P/R at pos/2 | PCA P=R at k = pos | latency P=R at pos |")
print("|---|---|---|---:|---|---|---:|---:|")
for ty, svc, t, pos, n, half, full in rows:
    h = f"{half[0]:.2f} / {half[1]:.2f}" if half else "—"
    hl = f"{half[2]:.2f} / {half[3]:.2f}" if half else "—"
    fp = f"{full[0]:.2f}" if full else "—"
    fl = f"{full[2]:.2f}" if full else "—"
    print(f"| {ty} | {svc} | {t} | {pos} of {n} | {h} | {hl} | {fp} | {fl} |")
print()
print("| fault type | injections | mean PCA P=R at k = pos | mean latency P=R at k = pos | PCA better / latency better |")
print("|---|---:|---:|---:|---|")
for ty in sorted({r[0] for r in rows}):
    rs = [r for r in rows if r[0] == ty and r[6]]
    if not rs:
        continue
    p = sum(r[6][0] for r in rs) / len(rs)
    l = sum(r[6][2] for r in rs) / len(rs)
    b = sum(r[6][0] > r[6][2] for r in rs)
    w = sum(r[6][0] < r[6][2] for r in rs)
    print(f"| {ty} | {len(rs)} | {p:.3f} | {l:.3f} | {b} / {w} |")
