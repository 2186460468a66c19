#!/usr/bin/env python3
"""Time `cpt profile` over JSON Lines, Parquet and a store against DuckDB's
per-stack sums over the same JSON Lines and Parquet files (see
profile_sources.sh, which prepares the files and calls this).

    profile_sources.py CPT DIR ROUNDS DUCKDB_PYTHON

Runs alternate (cpt Parquet, DuckDB Parquet, cpt JSON Lines, DuckDB JSON
Lines, cpt store) so that load on the machine falls on both sides alike.
Each run is timed with /usr/bin/time -v (wall clock and peak RSS). Prints
every run, the medians, the ratios cpt / DuckDB, and both totals: the
profile's critical_path_sum over all stacks and DuckDB's sum of per-stack
sums, which must be equal.
"""
import gzip
import os
import re
import statistics
import subprocess
import sys

cpt, d, rounds, duck_py = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
jsonl = os.path.join(d, "records.jsonl")
pq = os.path.join(d, "pq")
store = os.path.join(d, "cpt.db")
out = os.path.join(d, "out.pb.gz")

DUCK = """
import duckdb, sys
src = sys.argv[1]
con = duckdb.connect()
con.execute('SET enable_progress_bar = false')
rows = con.execute(f'''with r as (select unnest(path) as seg from {src} where trigger = 'sampled')
  select list_transform(seg.stack, lambda f: f.service || ':' || f.name) as st, sum(seg.ns) as ns
  from r group by st''').fetchall()
print(len(rows), sum(int(r[1]) for r in rows))
"""


def varint(b, i):
    v = s = 0
    while True:
        x = b[i]
        i += 1
        v |= (x & 0x7F) << s
        s += 7
        if x < 0x80:
            return v, i


def fields(b):
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        f, t = key >> 3, key & 7
        if t == 0:
            v, i = varint(b, i)
        elif t == 2:
            n, i = varint(b, i)
            v, i = b[i:i + n], i + n
        elif t == 1:
            v, i = b[i:i + 8], i + 8
        elif t == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {t}")
        yield f, t, v


def packed(v, t):
    if t == 0:
        return [v]
    out, i = [], 0
    while i < len(v):
        x, i = varint(v, i)
        out.append(x)
    return out


def critical_path_sum(path):
    """The sum over samples of the critical_path_sum value of a pprof profile."""
    b = gzip.decompress(open(path, "rb").read())
    types, samples, strings = [], [], []
    for f, t, v in fields(b):
        if f == 1:
            types.append(dict((ff, vv) for ff, _, vv in fields(v)).get(1, 0))
        elif f == 2:
            vals = []
            for ff, tt, vv in fields(v):
                if ff == 2:
                    vals.extend(packed(vv, tt))
            samples.append(vals)
        elif f == 6:
            strings.append(v.decode())
    k = [strings[t] for t in types].index("critical_path_sum")
    return sum(s[k] for s in samples)


def timed(args):
    r = subprocess.run(["/usr/bin/time", "-v"] + args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{args}: exit {r.returncode}\n{r.stderr}")
    wall = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", r.stderr)
    h, m, s = wall.groups()
    secs = int(h or 0) * 3600 + int(m) * 60 + float(s)
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1)) / 1024
    return secs, rss, r.stdout


runs = {
    "cpt parquet": (lambda: [cpt, "profile", "-o", out, pq], "cpt"),
    "duckdb parquet": (lambda: [duck_py, "-c", DUCK, f"read_parquet('{pq}/**/*.parquet')"], "duck"),
    "cpt jsonl": (lambda: [cpt, "profile", "-o", out, jsonl], "cpt"),
    "duckdb jsonl": (lambda: [duck_py, "-c", DUCK, f"read_json('{jsonl}', format='newline_delimited')"], "duck"),
    "cpt store": (lambda: [cpt, "profile", "-o", out, "--store", store], "cpt"),
}
times = {k: [] for k in runs}
rss = {k: [] for k in runs}
totals = {}
for rnd in range(rounds):
    for name, (args, kind) in runs.items():
        secs, mib, stdout = timed(args())
        times[name].append(secs)
        rss[name].append(mib)
        total = critical_path_sum(out) if kind == "cpt" else int(stdout.split()[-1])
        totals.setdefault(name, total)
        if totals[name] != total:
            sys.exit(f"{name}: total {total} differs from the first run's {totals[name]}")
        print(f"round {rnd + 1}  {name:15} {secs:7.2f} s  peak {mib:7.0f} MiB", flush=True)

med = {k: statistics.median(v) for k, v in times.items()}
print()
print(f"{'':16}{'median s':>10}{'min s':>8}{'max s':>8}{'peak MiB':>10}")
for k in runs:
    print(f"{k:16}{med[k]:10.2f}{min(times[k]):8.2f}{max(times[k]):8.2f}{max(rss[k]):10.0f}")
print()
print(f"cpt parquet / duckdb parquet: {med['cpt parquet'] / med['duckdb parquet']:.2f}x")
print(f"cpt jsonl   / duckdb jsonl:   {med['cpt jsonl'] / med['duckdb jsonl']:.2f}x")
print(f"cpt store   / duckdb parquet: {med['cpt store'] / med['duckdb parquet']:.2f}x")
print()
for k in runs:
    print(f"total {k:15} {totals[k]}")
cpt_totals = {totals[k] for k in runs if k.startswith("cpt")}
duck_totals = {totals[k] for k in runs if k.startswith("duckdb")}
print("totals equal" if len(cpt_totals | duck_totals) == 1 else "TOTALS DIFFER")
