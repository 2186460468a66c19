#!/bin/bash
# Instructions per request of the Figure 1 bench, by configuration and by function.
#
#   benches/scripts/fig1_callgrind.sh OUT_DIR [TRACED UNTRACED [ROWS]]
#
# Builds `fig1` in release, runs each configuration alone under `valgrind --tool=callgrind` at
# 40 and 200 requests (CPT_BENCH_WORK=0: bare RPCs), and prints the per-request instructions of
# TRACED and UNTRACED (default 0 = cpt traced, 1 = cpt middleware with sampling off; 2 = no cpt,
# 3 = tracing-opentelemetry) and the functions whose per-request count differs most between them.
# Per request = (count at 200 - count at 40) / 400: each round runs n sequential and n concurrent
# requests after n/4 + 1 of each as warm-up, so start-up and connection set-up cancel out.
# Callgrind counts are repeatable run to run, unlike times on a shared machine; quanta's one-time
# TSC calibration (timing-dependent) is left out. Needs valgrind and python3.
set -euo pipefail
OUT=$(realpath -m "$1"); A=${2:-0}; B=${3:-1}; ROWS=${4:-40}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"
cd "$ROOT"
BIN=$(cargo bench -p cpt-benches --bench fig1 --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="fig1" and m.get("executable"): print(m["executable"])' | tail -1)
cd "$OUT"
for only in "$A" "$B"; do
  for n in 40 200; do
    CPT_BENCH_WORK=0 CPT_BENCH_ONLY=$only CPT_BENCH_ROUNDS=1 CPT_BENCH_REQUESTS=$n \
      valgrind --tool=callgrind --callgrind-out-file="cg.$only.$n" "$BIN" > "out.$only.$n" 2>&1 &
  done
done
wait
for only in "$A" "$B"; do
  for n in 40 200; do
    callgrind_annotate --auto=no --threshold=100 "cg.$only.$n" > "cg.$only.$n.txt"
  done
done
python3 "$ROOT/benches/scripts/callgrind_diff.py" "$OUT" "$A" "$B" "$ROWS"
