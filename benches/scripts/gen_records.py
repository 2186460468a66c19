#!/usr/bin/env python3
"""Write N cpt records as JSON Lines to stdout, independently of cpt's own code.

    gen_records.py N [SEED]

Each record follows one of 2 000 call chains (2-5 frames drawn from a pool
of 320 frames of 8 services, every frame spelled out in full: name,
service, file, line), as requests of a service follow its code paths; its
4-15 segments are prefixes of that chain (so a profile has some 10 000
distinct stacks), with kinds mostly busy, labels, an endpoint, a start
time spread over six hours, and one record in ten forced. About 2.3 kB a
record. The same N and SEED always give the same bytes.
"""
import json
import random
import sys

n = int(sys.argv[1])
rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 25)
services = ["frontend", "search", "geo", "rate", "profile", "user", "reserve", "recommend"]
frames = []
for s in services:
    for i in range(40):
        frames.append(json.dumps({"name": f"{s}::handler_{i}", "service": s,
                                  "file": f"{s}/src/handler_{i % 7}.rs", "line": 10 + i},
                                 separators=(",", ":")))
kinds = ["busy"] * 12 + ["queueing", "network", "unattributed", "blind_spot"]
endpoints = ["/search", "/book", "/user", "/recommend"]
hour0 = 1_700_000_000_000_000_000
chains = []
for _ in range(2000):
    depth = rng.randrange(2, 6)
    chains.append([frames[rng.randrange(40)]] + [frames[rng.randrange(len(frames))] for _ in range(depth - 1)])
out = sys.stdout
for i in range(n):
    chain = chains[rng.randrange(len(chains))]
    segs = []
    total = 0
    for _ in range(rng.randrange(4, 16)):
        d = rng.randrange(1, len(chain) + 1)
        ns = rng.randrange(1000, 2_000_000)
        total += ns
        kind = rng.choice(kinds)
        k = "" if kind == "busy" else f',"kind":"{kind}"'
        segs.append(f'{{"stack":[{",".join(chain[:d])}],"ns":{ns}{k}}}')
    trigger = "forced" if rng.randrange(10) == 0 else "sampled"
    start = hour0 + rng.randrange(6 * 3_600_000_000_000)
    out.write(
        f'{{"service":"frontend","endpoint":"{rng.choice(endpoints)}","trigger":"{trigger}",'
        f'"latency_ns":{total},"start_unix_nanos":{start},"request_id":"req-{i}",'
        f'"labels":{{"arm":"{"ab"[rng.randrange(2)]}","region":"eu-{rng.randrange(3)}"}},'
        f'"path":[{",".join(segs)}]}}\n'
    )
