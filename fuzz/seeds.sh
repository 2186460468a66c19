#!/bin/sh
# Seeds for the `import` target from the repository's trace data: each file
# is one byte (bits 0-1 the format: 0 Jaeger, 1 Zipkin, 2 OTLP, 3 Nezha;
# bit 2 orphans as roots; bit 3 CRISP's accounting), then a small document
# in that format.
set -eu
cd "$(dirname "$0")"
out=corpus/import
mkdir -p "$out"
data=../testdata/traces
seed() { # format-byte name < document
  { printf "\\$(printf '%03o' "$1")"; cat; } > "$out/$2"
}
# Jaeger: the first traces of one TraceWeaver file, a document each.
python3 - "$data/traceweaver-hotel/hotel_load25.jaeger.json.gz" "$out" <<'PY'
import gzip, json, sys
doc = json.load(gzip.open(sys.argv[1]))
for n, t in enumerate(doc["data"][:8]):
    with open(f"{sys.argv[2]}/jaeger-{n}", "wb") as f:
        f.write(b"\0" + json.dumps({"data": [t]}).encode())
PY
# Zipkin v2: Zipkin Lens's fixtures.
for f in "$data"/zipkin-lens/*.json; do
  seed 1 "zipkin-$(basename "$f" .json)" < "$f"
done
# OTLP: one document with a client and a server span, one line.
seed 2 otlp-1 <<'JSON'
{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"front"}}]},"scopeSpans":[{"scope":{"name":"x"},"spans":[{"traceId":"aa","spanId":"01","name":"GET /","kind":2,"startTimeUnixNano":"1700000000000000000","endTimeUnixNano":"1700000000000009000"},{"traceId":"aa","spanId":"02","parentSpanId":"01","name":"call","kind":3,"startTimeUnixNano":"1700000000000001000","endTimeUnixNano":"1700000000000008000"}]}]},{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"back"}}]},"scopeSpans":[{"scope":{"name":"x"},"spans":[{"traceId":"aa","spanId":"03","parentSpanId":"02","name":"serve","kind":2,"startTimeUnixNano":"1700000000000002000","endTimeUnixNano":"1700000000000007000"}]}]}]}
JSON
# Nezha: the first rows of one span CSV.
gzip -dc "$data/nezha-trainticket/fault/2023-01-29_10_20_trace.csv.gz" | head -40 | seed 3 nezha-1
# Each again with orphans kept as roots and CRISP's accounting (bits 2, 3).
for f in "$out"/jaeger-* "$out"/zipkin-* "$out"/otlp-* "$out"/nezha-*; do
  case $f in *-x) continue ;; esac
  b=$(od -An -tu1 -N1 "$f" | tr -d ' ')
  { printf "\\$(printf '%03o' $((b | 12)))"; tail -c +2 "$f"; } > "$f-x"
done
echo "$(ls "$out" | wc -l) inputs in fuzz/$out"
