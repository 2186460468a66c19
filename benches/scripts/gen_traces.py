#!/usr/bin/env python3
"""Generate a large synthetic trace file (Zipkin v2 or OTLP JSON) for memory
measurements of `cpt traces`. Not committed output: write it to /tmp.

    python3 benches/scripts/gen_traces.py zipkin 100 /tmp/big.zipkin.json
    python3 benches/scripts/gen_traces.py otlp 100 /tmp/big.otlp.json
    /usr/bin/time -v target/release/cpt traces convert -q --from zipkin -o /dev/null /tmp/big.zipkin.json

Each trace: a root SERVER span, 8 CLIENT calls each with a shared-id SERVER
half on another host and 2 children under it (33 records); sizes in MB
(10^6 bytes) of JSON, deterministic.
"""
import json
import sys


def zipkin_trace(t):
    tid = f"{t:016x}"
    base = 1_700_000_000_000_000 + t * 10_000
    root = f"{t:08x}00000000"
    ep = lambda s, ip: {"serviceName": s, "ipv4": ip, "port": 8080}
    out = [{"traceId": tid, "id": root, "kind": "SERVER", "name": "get /api",
            "timestamp": base, "duration": 9000, "localEndpoint": ep("front", "10.0.0.1"),
            "tags": {"http.method": "GET", "http.path": "/api"}}]
    for c in range(8):
        cid = f"{t:08x}{c + 1:08x}"
        s = base + 100 + c * 1000
        out.append({"traceId": tid, "parentId": root, "id": cid, "kind": "CLIENT",
                    "name": f"call {c}", "timestamp": s, "duration": 900,
                    "localEndpoint": ep("front", "10.0.0.1"),
                    "remoteEndpoint": ep(f"svc{c}", f"10.0.1.{c}")})
        out.append({"traceId": tid, "parentId": root, "id": cid, "kind": "SERVER",
                    "shared": True, "name": f"call {c}", "timestamp": s + 50, "duration": 800,
                    "localEndpoint": ep(f"svc{c}", f"10.0.1.{c}"),
                    "tags": {"http.status_code": "200"}})
        for g in range(2):
            out.append({"traceId": tid, "parentId": cid, "id": f"{t:08x}{c + 1:04x}{g + 1:04x}",
                        "name": f"db {g}", "timestamp": s + 100 + g * 300, "duration": 250,
                        "localEndpoint": ep(f"svc{c}", f"10.0.1.{c}"),
                        "tags": {"db.statement": "SELECT * FROM t WHERE id = ?"}})
    return out


def otlp_trace(t):
    tid = f"{t:032x}"
    base = 1_700_000_000_000_000_000 + t * 10_000_000
    def span(sid, parent, name, kind, start, dur):
        return {"traceId": tid, "spanId": sid, "parentSpanId": parent, "name": name,
                "kind": kind, "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + dur),
                "attributes": [{"key": "http.method", "value": {"stringValue": "GET"}}],
                "status": {}}
    root = f"{t:08x}00000000"
    res = [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "front"}},
                                        {"key": "host.name", "value": {"stringValue": "h0"}}]},
            "scopeSpans": [{"scope": {"name": "gen"}, "spans": [span(root, "", "get /api", 2, base, 9_000_000)]
                            + [span(f"{t:08x}{c + 1:08x}", root, f"call {c}", 3, base + 100_000 + c * 1_000_000, 900_000)
                               for c in range(8)]}]}]
    for c in range(8):
        cid = f"{t:08x}{c + 1:08x}"
        s = base + 100_000 + c * 1_000_000
        spans = [span(f"{t:08x}{c + 1:04x}0000", cid, f"call {c}", 2, s + 50_000, 800_000)]
        spans += [span(f"{t:08x}{c + 1:04x}{g + 1:04x}", f"{t:08x}{c + 1:04x}0000", f"db {g}", 3,
                       s + 100_000 + g * 300_000, 250_000) for g in range(2)]
        res.append({"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": f"svc{c}"}},
                                                {"key": "host.name", "value": {"stringValue": f"h{c + 1}"}}]},
                    "scopeSpans": [{"scope": {"name": "gen"}, "spans": spans}]})
    return res


def main():
    fmt, mb, path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    limit = int(mb * 1e6)
    size, t = 0, 0
    with open(path, "w") as f:
        if fmt == "zipkin":
            f.write("[")
            first = True
            while size < limit:
                for s in zipkin_trace(t):
                    chunk = ("" if first else ",\n") + json.dumps(s, separators=(",", ":"))
                    first = False
                    f.write(chunk)
                    size += len(chunk)
                t += 1
            f.write("]\n")
        elif fmt == "otlp":
            # One document per line (the collector's file exporter), 50 traces a line.
            while size < limit:
                res = []
                for _ in range(50):
                    res += otlp_trace(t)
                    t += 1
                line = json.dumps({"resourceSpans": res}, separators=(",", ":")) + "\n"
                f.write(line)
                size += len(line)
        else:
            sys.exit(f"unknown format {fmt!r} (zipkin or otlp)")
    print(f"{path}: {t} traces, {size / 1e6:.1f} MB", file=sys.stderr)


if __name__ == "__main__":
    main()
