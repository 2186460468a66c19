#!/bin/bash
# `cpt profile` over the same records as JSON Lines, Parquet (`cpt export`) and a store
# (`cpt import`), side by side with DuckDB computing the same per-stack sums with one SQL query
# over the JSON Lines and the Parquet files.
#
#   benches/scripts/profile_sources.sh [N [DIR [ROUNDS]]]
#
# N records (default 1000000) from gen_records.py, kept in DIR (default /tmp/cpt-profile-bench)
# and reused while N is the same; ROUNDS (default 3) alternating rounds. Builds `cpt` in release,
# installs DuckDB (`pip install duckdb`) in a venv in DIR, and prints every run (wall clock and
# peak RSS from /usr/bin/time -v), medians, the ratios cpt / DuckDB and both totals (the profile's
# critical_path_sum summed over stacks; DuckDB's sum of per-stack sums), which must be equal.
# Needs python3 and GNU time.
set -euo pipefail
N=${1:-1000000}
DIR=$(realpath -m "${2:-/tmp/cpt-profile-bench}")
ROUNDS=${3:-3}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$DIR"
cd "$ROOT"
cargo build --release -p cpt-collector --bin cpt
CPT="$ROOT/target/release/cpt"
if [ "$(cat "$DIR/N" 2>/dev/null)" != "$N" ]; then
  rm -rf "$DIR/records.jsonl" "$DIR/pq" "$DIR/cpt.db" "$DIR/cpt.db-wal" "$DIR/cpt.db-shm" "$DIR/N"
  echo "generating $N records" >&2
  python3 "$ROOT/benches/scripts/gen_records.py" "$N" > "$DIR/records.jsonl.tmp"
  mv "$DIR/records.jsonl.tmp" "$DIR/records.jsonl"
  "$CPT" export "$DIR/records.jsonl" --parquet-dir "$DIR/pq"
  "$CPT" import --store "$DIR/cpt.db" "$DIR/records.jsonl"
  echo "$N" > "$DIR/N"
fi
if [ ! -x "$DIR/venv/bin/python" ] || ! "$DIR/venv/bin/python" -c 'import duckdb' 2>/dev/null; then
  python3 -m venv "$DIR/venv"
  "$DIR/venv/bin/pip" install -q duckdb
fi
echo "records: $N; JSON Lines $(du -h "$DIR/records.jsonl" | cut -f1), Parquet $(du -sh "$DIR/pq" | cut -f1), store $(du -h "$DIR/cpt.db" | cut -f1); cpt $(git rev-parse --short HEAD); duckdb $("$DIR/venv/bin/python" -c 'import duckdb; print(duckdb.__version__)'); $(nproc) cores"
python3 "$ROOT/benches/scripts/profile_sources.py" "$CPT" "$DIR" "$ROUNDS" "$DIR/venv/bin/python"
