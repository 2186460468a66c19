#!/usr/bin/env python3
"""cpt_aggregate.py: fold cpt records (Parquet, schema cpt.records.v1) on Apache Spark.

The same selection and the same fold as `cpt profile`, so

    spark-submit collector/spark/cpt_aggregate.py s3a://bucket/cpt-records \
        --service A --label arm=b --percentile p95-p100 --output s3a://bucket/agg/a-slow
    cpt profile --from-aggregate agg/a-slow -o a-slow.pb.gz

writes the profile `cpt profile --service A --label arm=b --percentile p95-p100
s3a://bucket/cpt-records` would (the agreement test in tests/tests/spark.rs checks
that they are byte for byte the same). Without spark-submit, `python cpt_aggregate.py
...` runs Spark in local[*] mode (pip install pyspark).

Selection (as `cpt profile`, see collector/src/records/selection.rs): --service,
--endpoint, --since/--until (on the request's start; Unix ns, a number with unit
s/ms/us/ns, or RFC 3339), --label K=V (repeatable, all must match), --trigger
(sampled by default: forced traces are not a random sample; `all` when --request-id or
--trace-id is given), --request-id, --trace-id, and --percentile pLO-pHI, the latency
band over the records every other filter keeps. The band is exact: records are ranked
by (path latency, input order) with a distributed range sort, and ranks
[round(n*lo/100), round(n*hi/100)) are kept (at least one), exactly as `cpt profile`
does; input order is (file path by component, row in file), the order in which `cpt
profile` reads a Parquet directory.

The fold (collector/src/profile/aggregate): every segment with a positive duration
contributes its nanoseconds to its sample stack: the segment's frames, plus a synthetic
leaf `[queueing]`, `[unattributed]`, `[network]` or `[blind spot]` (service "") for a
non-busy kind other than a named wait (`wait`, whose stack ends in its wait frame), or
`[no frames]` when that leaves nothing. Per request the stack's time
is summed; per stack the job keeps the sum, the number of requests it is on, the sum of
squares of the per-request time and its log-linear histogram (what `cpt diff` and `cpt
histogram` need); overall the request count, latency sum, sum of squares and histogram,
the accounting sums and the start-time range.

Output: one JSON Lines file `cpt.aggregate.v1` (format in
collector/src/profile/aggregate/file.rs), written by Spark as a directory `--output`
holding a single part file; `cpt profile --from-aggregate DIR` reads it.
"""

import argparse
import json
import math
import re
import sys
from datetime import datetime, timezone

FORMAT = "cpt.aggregate.v1"
SCHEMA = "cpt.records.v1"
I64_MAX = 2**63 - 1
U64_MAX = 2**64 - 1
KIND_FRAMES = {
    "queueing": "[queueing]",
    "unattributed": "[unattributed]",
    "network": "[network]",
    "blind_spot": "[blind spot]",
}
NO_FRAMES = "[no frames]"
KEY_TYPE = "array<struct<service:string,name:string,file:string,line:bigint>>"
ACCOUNTING = [
    "network_ns",
    "overcount_ns",
    "blind_spot_ns",
    "unattributed_ns",
    "queueing_ns",
    "truncated_ns",
    "clock_skew_ns",
]
REQUIRED_COLUMNS = [
    "service",
    "endpoint",
    "trigger",
    "latency_ns",
    "start_unix_nanos",
    "request_id",
    "trace_id",
    "labels",
    "path",
] + ACCOUNTING


class UsageError(Exception):
    pass


# ---------------------------------------------------------------- selection parsing


def parse_time(s):
    """collector/src/records/selection.rs parse_time: Unix ns, N{s,ms,us,ns}, RFC 3339."""
    t = s.strip()
    m = re.fullmatch(r"(\d+)(ns|us|ms|s)?", t)
    if m:
        mult = {None: 1, "ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}[m.group(2)]
        v = int(m.group(1)) * mult
        if v > 2**64 - 1:
            raise UsageError(f"time {s!r}: out of range")
        return v
    m = re.fullmatch(
        r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})?",
        t,
    )
    if not m:
        raise UsageError(
            f"time {s!r}: expected Unix nanoseconds, a number with unit s/ms/us/ns, "
            "or RFC 3339 like 2026-11-21T22:00:00Z"
        )
    y, mo, d, h, mi, sec = (int(x) for x in m.groups()[:6])
    frac = (m.group(7) or "").ljust(9, "0")
    tz = m.group(8)
    offset = 0
    if tz and tz not in ("Z", "z"):
        sign = 1 if tz[0] == "+" else -1
        offset = sign * (int(tz[1:3]) * 3600 + int(tz[4:6]) * 60)
    try:
        base = datetime(y, mo, d, h, mi, sec, tzinfo=timezone.utc)
    except ValueError as e:
        raise UsageError(f"time {s!r}: {e}") from None
    secs = int(base.timestamp()) - offset
    if secs < 0:
        raise UsageError(f"time {s!r}: before 1970")
    return secs * 1_000_000_000 + int(frac)


def parse_band(s):
    """PercentileBand::parse: both bounds, `p95-p100`, `95-100`, `p99.9-p100`."""

    def num(t):
        t = t.strip()
        if t[:1] in ("p", "P"):
            t = t[1:]
        try:
            v = float(t)
        except ValueError:
            raise UsageError(
                f'percentile band {s!r}: {t!r} is not a number (expected e.g. "p95-p100" or "p0-p50")'
            ) from None
        if not math.isfinite(v):
            raise UsageError(f"percentile band {s!r}: {t!r} is not a number")
        return v

    if "-" not in s:
        v = num(s)
        raise UsageError(
            f'percentile band {s!r}: give both bounds, e.g. "p{v:g}-p100" for the slowest '
            f'{100 - v:g}% or "p0-p{v:g}" for the rest'
        )
    a, b = s.split("-", 1)
    lo, hi = num(a), num(b)
    if not (0 <= lo <= 100 and 0 <= hi <= 100):
        raise UsageError(f"percentile band {s}: bounds must be within 0..=100")
    if lo >= hi:
        raise UsageError(f"percentile band {s}: the lower bound must be below the upper")
    return lo, hi


def round_half_away(x):
    """Rust's f64::round for x >= 0 (Python's round() rounds half to even)."""
    i = math.floor(x)
    return i + 1 if x - i >= 0.5 else i


def band_ranks(lo, hi, n):
    """PercentileBand::ranks: the 0-based ranks [lo, hi) kept out of n."""
    if n == 0:
        return 0, 0
    at = lambda p: round_half_away(float(n) * p / 100.0)
    r_lo = min(at(lo), n - 1)
    r_hi = min(max(at(hi), r_lo + 1), n)
    return r_lo, r_hi


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="cpt_aggregate.py",
        description="Fold cpt records (Parquet) into a cpt.aggregate.v1 file for "
        "`cpt profile --from-aggregate`, with cpt profile's selection.",
    )
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="Parquet files or directories (cpt export / cpt serve --parquet-dir)")
    p.add_argument("-o", "--output", required=True, help="output directory (one part file, JSON Lines)")
    p.add_argument("--service")
    p.add_argument("--endpoint")
    p.add_argument("--since")
    p.add_argument("--until")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--percentile", metavar="BAND")
    p.add_argument("--trigger", choices=["sampled", "forced", "all"])
    p.add_argument("--request-id")
    p.add_argument("--trace-id")
    p.add_argument("--no-histograms", action="store_true", help="skip per-stack histograms (cpt histogram then refuses the file)")
    p.add_argument("--master", help="Spark master when not run by spark-submit (default local[*])")
    p.add_argument("--timings", metavar="FILE", help="write the wall time of each phase as JSON (for the benchmark)")
    a = p.parse_args(argv)
    sel = {"pairs": []}
    try:
        for key in ("service", "endpoint", "request_id", "trace_id"):
            v = getattr(a, key)
            if v is not None and v == "":
                raise UsageError(f"{key.replace('_', '-')}: empty value")
        if a.trace_id:
            a.trace_id = a.trace_id.lower()
        a.since_ns = parse_time(a.since) if a.since is not None else None
        a.until_ns = parse_time(a.until) if a.until is not None else None
        a.labels = []
        for lv in a.label:
            if "=" not in lv or lv.split("=", 1)[0] == "":
                raise UsageError(f"--label {lv!r}: expected KEY=VALUE, e.g. arm=b")
            a.labels.append(tuple(lv.split("=", 1)))
        a.band = parse_band(a.percentile) if a.percentile is not None else None
    except UsageError as e:
        p.error(str(e))
    if a.trigger is None:
        a.trigger = "all" if (a.request_id or a.trace_id) else "sampled"
    # The selection as Selection::set_pair pairs (the header's "selection").
    pairs = []
    if a.service is not None:
        pairs.append(f"service={a.service}")
    if a.endpoint is not None:
        pairs.append(f"endpoint={a.endpoint}")
    if a.since_ns is not None:
        pairs.append(f"since={a.since_ns}")
    if a.until_ns is not None:
        pairs.append(f"until={a.until_ns}")
    for k, v in a.labels:
        pairs.append(f"label={k}={v}")
    if a.percentile is not None:
        pairs.append(f"percentile={a.percentile.strip()}")
    if a.request_id is not None:
        pairs.append(f"request_id={a.request_id}")
    if a.trace_id is not None:
        pairs.append(f"trace_id={a.trace_id}")
    pairs.append(f"trigger={a.trigger}")
    a.pairs = pairs
    return a


# ---------------------------------------------------------------- partitions


def partition_hours(path):
    """The UTC hour [start, end) in ns of a file under date=YYYY-MM-DD/hour=HH (its two
    parent directories), or None: collector/src/records/parquet/scan.rs partition_hours."""
    parts = path.rstrip("/").split("/")
    if len(parts) < 3 or not parts[-2].startswith("hour=") or not parts[-3].startswith("date="):
        return None
    hour, date = parts[-2][len("hour="):], parts[-3][len("date="):]
    if not re.fullmatch(r"\+?[0-9]+", hour) or int(hour) >= 24:
        return None
    ymd = date.split("-", 2)
    if len(ymd) != 3 or not re.fullmatch(r"[+-]?[0-9]+", ymd[0]):
        return None
    if not all(re.fullmatch(r"\+?[0-9]+", x) for x in ymd[1:]):
        return None
    y, m, d = int(ymd[0]), int(ymd[1]), int(ymd[2])
    if not (1 <= m <= 12 and 1 <= d <= 31):
        return None
    # Howard Hinnant's days_from_civil.
    y = y - 1 if m <= 2 else y
    era, yoe = y // 400, y % 400
    mp = m - 3 if m > 2 else m + 9
    doy = (153 * mp + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    days = era * 146_097 + doe - 719_468
    if days < 0:
        return None
    start = (days * 86_400 + int(hour) * 3600) * 1_000_000_000
    if start + 3_600_000_000_000 > U64_MAX:
        return None
    return start, start + 3_600_000_000_000


def in_range(path, since, until):
    """False when the file's date=/hour= partition lies outside [since, until): its
    records all started in that hour (or have no start time), so the selection keeps
    none of them."""
    if since is None and until is None:
        return True
    hours = partition_hours(path)
    if hours is None:
        return True
    lo, hi = since or 0, U64_MAX if until is None else until
    return not (hours[1] <= lo or hours[0] >= hi)


# ---------------------------------------------------------------- the job

BUCKET_SQL = (
    "CASE WHEN {v} < 16 THEN {v} "
    "ELSE 16 + (length(bin({v})) - 5) * 8 + (shiftright({v}, length(bin({v})) - 4) & 7) END"
)


def fail(msg):
    print(f"cpt_aggregate.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def list_files(spark, inputs):
    """The Parquet files under the inputs, as Spark lists them (recursively; names
    starting with `.` or `_` skipped), without opening any of them."""
    from pyspark.sql.utils import AnalysisException

    try:
        # A given schema: listing alone, no footer read to infer one.
        listing = (
            spark.read.schema("start_unix_nanos long")
            .option("recursiveFileLookup", "true")
            .parquet(*inputs)
        )
    except AnalysisException as e:
        fail(f"{', '.join(inputs)}: {str(e).splitlines()[0]}")
    files = listing.inputFiles()
    if not files:
        fail(f"{', '.join(inputs)}: no Parquet files (an empty directory?); give a "
             "directory `cpt export --parquet-dir` or `cpt serve --parquet-dir` wrote")
    return sorted(files, key=lambda f: f.split("/"))


def check_schema(spark, df, first, inputs):
    from pyspark.sql import types as T

    cols = {f.name: f.dataType for f in df.schema.fields}
    missing = [c for c in REQUIRED_COLUMNS if c not in cols]
    if missing:
        fail(
            f"{', '.join(inputs)}: not cpt records (schema {SCHEMA}): no column(s) "
            f"{', '.join(missing)}; write them with `cpt export --parquet-dir`"
        )
    if not isinstance(cols["path"], T.ArrayType) or not isinstance(cols["labels"], T.MapType):
        fail(f"{', '.join(inputs)}: columns path / labels are not a list / map: not {SCHEMA} records")
    # The footer's key-value metadata names the schema (checked on the first file read: a
    # driver-side footer read per file would not scale to a fleet's files).
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    try:
        hin = jvm.org.apache.parquet.hadoop.util.HadoopInputFile.fromPath(
            jvm.org.apache.hadoop.fs.Path(first), conf
        )
        reader = jvm.org.apache.parquet.hadoop.ParquetFileReader.open(hin)
        try:
            kv = reader.getFooter().getFileMetaData().getKeyValueMetaData()
            got = kv.get("cpt.schema")
        finally:
            reader.close()
    except Exception as e:  # noqa: BLE001 (a py4j error; report it plainly)
        fail(f"{first}: cannot read the Parquet footer: {e}")
    if got != SCHEMA:
        fail(
            f"{first}: not a cpt records file (schema {got}, expected {SCHEMA}); "
            "write it with `cpt export`"
        )


def session(master):
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("cpt_aggregate").config(
        "spark.ui.showConsoleProgress", "false"
    )
    if master:
        builder = builder.master(master)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def main(argv):
    # --batch FILE: one command line per line (a JSON list of arguments), all run in one
    # Spark session (the agreement test runs its cases this way: one JVM start, not one
    # per case).
    if argv[:1] == ["--batch"] and len(argv) in (2, 4):
        master = argv[3] if len(argv) == 4 and argv[2] == "--master" else None
        with open(argv[1]) as f:
            runs = [parse_args(json.loads(line)) for line in f if line.strip()]
        spark = session(master)
        for a in runs:
            run(spark, a)
        spark.stop()
        return
    a = parse_args(argv)
    spark = session(a.master)
    run(spark, a)
    spark.stop()


def selection(a):
    """Selection::matches as one condition on the record columns (the band aside)."""
    from pyspark.sql import functions as F

    cond = F.lit(True)
    if a.trigger != "all":
        cond = cond & (F.col("trigger") == a.trigger)
    if a.request_id is not None:
        cond = cond & (F.col("request_id") == a.request_id)
    if a.trace_id is not None:
        cond = cond & (F.lower(F.col("trace_id")) == a.trace_id)
    if a.service is not None:
        cond = cond & (F.col("service") == a.service)
    if a.endpoint is not None:
        cond = cond & (F.col("endpoint") == a.endpoint)
    if a.since_ns is not None or a.until_ns is not None:
        start = F.col("start_unix_nanos")
        cond = cond & start.isNotNull()
        if a.since_ns is not None:
            cond = cond & (start >= a.since_ns) if a.since_ns <= I64_MAX else F.lit(False)
        if a.until_ns is not None and a.until_ns <= I64_MAX:
            cond = cond & (start < a.until_ns)
    for k, v in a.labels:
        cond = cond & (F.col("labels").getItem(k) == v)
    return cond


def path_latency():
    """The record's path latency: the sum of its segments' positive durations. Reads
    only the `path.ns` column of the files."""
    from pyspark.sql import functions as F

    zero = F.lit(0).cast("long")
    return F.aggregate(F.col("path.ns"), zero, lambda acc, ns: acc + F.when(ns > 0, ns).otherwise(zero))


def band_condition(spark, sel, band, timings, t0):
    """The percentile band, exact, as a condition on (latency, file, row), and the number
    of records it ranks. One scan of the narrow columns (the selection's and path.ns),
    cached while the ranks are found."""
    import time

    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keys = sel.select(
        path_latency().alias("latency"),
        F.col("_metadata.file_path").alias("_path"),
        F.col("_metadata.row_index").alias("_row"),
    ).persist(StorageLevel.MEMORY_AND_DISK)
    file_of = lambda: F.split(F.col("_path"), "/")  # noqa: E731 (input order: by component)
    parts = max(1, spark.sparkContext.defaultParallelism)
    ordered = (
        keys.repartitionByRange(parts, F.col("latency"), file_of(), F.col("_row"))
        .withColumn("_pid", F.spark_partition_id())
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    counts = {r["_pid"]: r["count"] for r in ordered.groupBy("_pid").count().collect()}
    keys.unpersist()
    matched = sum(counts.values())
    r_lo, r_hi = band_ranks(band[0], band[1], matched)
    if r_lo >= r_hi:
        ordered.unpersist()
        return F.lit(False), matched
    offset, acc = {}, 0
    for pid in sorted(counts):
        offset[pid] = acc
        acc += counts[pid]
    off = F.create_map(*[x for pid in sorted(offset) for x in (F.lit(pid), F.lit(offset[pid]))])
    w = Window.partitionBy("_pid").orderBy(F.col("latency"), file_of(), F.col("_row"))
    ranked = ordered.withColumn("_rank", F.row_number().over(w) - 1 + F.element_at(off, F.col("_pid")))
    ends = {
        r["_rank"]: (r["latency"], r["_path"].split("/"), r["_row"])
        for r in ranked.where(F.col("_rank").isin(r_lo, r_hi - 1)).collect()
    }
    ordered.unpersist()
    timings["band_s"] = time.monotonic() - t0
    lo, hi = ends[r_lo], ends[r_hi - 1]
    # Compared against the full scan's own columns: the latency again from path.ns.
    lat, fil, row = path_latency(), F.split(F.col("_metadata.file_path"), "/"), F.col("_metadata.row_index")

    def ge(k):
        return (lat > k[0]) | ((lat == k[0]) & ((fil > F.lit(k[1])) | ((fil == F.lit(k[1])) & (row >= k[2]))))

    def le(k):
        return (lat < k[0]) | ((lat == k[0]) & ((fil < F.lit(k[1])) | ((fil == F.lit(k[1])) & (row <= k[2]))))

    return ge(lo) & le(hi), matched


def fold(sel):
    """One pass over the selected records: per (kind, stack hash, log-linear bucket) the
    count, sum, sum of squares, min and max of the value, where a record contributes one
    row of kind 0 (its latency, start time and accounting, for the totals) and one row of
    kind 1 per distinct sample stack on its path (the stack's time in this request); and,
    observed on the way, the set of (stack hash, frames) pairs."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    def frame(service, name):
        return F.struct(
            F.lit(service).alias("service"), F.lit(name).alias("name"),
            F.lit(None).cast("string").alias("file"), F.lit(None).cast("long").alias("line"),
        )

    def stack_of(seg):
        kind = seg["kind"]
        kind_frame = None
        for k, name in KIND_FRAMES.items():
            w = kind_frame.when if kind_frame is not None else F.when
            kind_frame = w(kind == k, frame("", name))
        kind_frame = kind_frame.otherwise(F.raise_error(F.concat(F.lit("unknown segment kind "), kind)))
        frames = F.transform(
            seg["stack"],
            lambda f: F.struct(
                f["service"].alias("service"), f["name"].alias("name"), f["file"].alias("file"),
                F.when(f["file"].isNull(), F.lit(None).cast("long"))
                .otherwise(F.coalesce(f["line"].cast("long"), F.lit(0).cast("long"))).alias("line"),
            ),
        )
        # Only a busy segment without frames has an empty stack (the others get a leaf). A
        # named wait's stack ends in its wait frame already (`[sleep src/main.rs:88]`).
        return (
            F.when((kind == "busy") & (F.size(seg["stack"]) == 0), F.array(frame("", NO_FRAMES)))
            .when((kind == "busy") | (kind == "wait"), frames)
            .otherwise(F.concat(frames, F.array(kind_frame)))
        )

    zero = F.lit(0).cast("long")
    no_long = F.lit(None).cast("long")
    segs = F.filter(F.col("path"), lambda s: s["ns"] > 0)
    totals = ["start_unix_nanos", *ACCOUNTING]
    # Each step its own projection, so that no array is computed twice: the segments'
    # stacks and their hashes, then the distinct hashes, then per hash the summed time.
    per_seg = sel.select(*totals, segs.alias("_segs")).select(
        *totals,
        F.aggregate(F.col("_segs"), zero, lambda acc, s: acc + s["ns"]).alias("_latency"),
        F.transform(
            F.col("_segs"), lambda s: F.struct(s["ns"].alias("ns"), stack_of(s).alias("key"))
        ).alias("_k"),
    ).select(
        *totals, "_latency",
        F.transform(
            F.col("_k"),
            lambda x: F.struct(x["ns"].alias("ns"), x["key"].alias("key"), F.xxhash64(x["key"]).alias("h")),
        ).alias("_st"),
    )
    per_stack = per_seg.select(
        *totals, "_latency", "_st",
        F.array_distinct(F.transform(F.col("_st"), lambda x: x["h"])).alias("_hs"),
    ).select(
        *totals, "_latency",
        F.transform(
            F.col("_hs"),
            lambda h: F.filter(F.col("_st"), lambda x: x["h"] == h),
        ).alias("_groups"),
    )
    entry = lambda tag, h, v, key, start, acc: F.struct(  # noqa: E731
        F.lit(tag).alias("tag"), h.alias("h"), v.alias("v"), key.alias("key"),
        start.alias("start"), *[c.alias(n) for c, n in zip(acc, ACCOUNTING)],
    )
    record = entry(
        0, zero, F.col("_latency"), F.lit(None).cast(KEY_TYPE), F.col("start_unix_nanos"),
        [F.col(c) for c in ACCOUNTING],
    )
    stacks = F.transform(
        F.col("_groups"),
        lambda g: entry(
            1, g[0]["h"], F.aggregate(g, zero, lambda acc, x: acc + x["ns"]), g[0]["key"].cast(KEY_TYPE),
            no_long, [no_long] * len(ACCOUNTING),
        ),
    )
    rows = per_stack.select(F.explode(F.concat(F.array(record), stacks)).alias("e")).select("e.*")
    # The stacks' frames ride along the same pass as an observed metric (a set per task,
    # merged on the driver: one entry per distinct stack, so a hash seen with two frame
    # lists is a collision); the aggregation itself holds only numbers, so Spark runs it
    # as a generated hash aggregation however many (stack, bucket) groups there are.
    keys = Observation()
    rows = rows.observe(
        keys, F.to_json(F.collect_set(F.when(F.col("tag") == 1, F.struct("h", "key")))).alias("keys")
    )
    dec = lambda c: F.col(c).cast("decimal(38,0)")  # noqa: E731
    agg = rows.groupBy("tag", "h", F.expr(BUCKET_SQL.format(v="v")).alias("b")).agg(
        F.count(F.lit(1)).alias("c"), F.sum("v").alias("s"),
        F.sum(dec("v") * dec("v")).alias("sq"), F.min("v").alias("mn"), F.max("v").alias("mx"),
        F.min("start").alias("first"), F.max("start").alias("last"),
        *[F.sum(c).alias(c) for c in ACCOUNTING],
    )
    return agg, keys


def java_error(e):
    """A Java exception's messages down its causes, first lines only (no stack traces)."""
    msgs, t = [], e.java_exception
    while t is not None and len(msgs) < 8:
        m = t.getMessage()
        if m:
            first = str(m).strip().splitlines()[0]
            if first not in msgs:
                msgs.append(first)
        t = t.getCause()
    # Spark's wrappers ("Job aborted due to stage failure: ...", "Exception thrown in
    # awaitResult") say where, not what; the causes below them say what.
    what = [
        m for m in msgs
        if not m.startswith(("Job aborted due to stage failure", "Exception thrown in awaitResult"))
    ]
    return "; caused by: ".join(what or msgs) or str(e).splitlines()[0]


def fold_all(spark, a, kept, timings, t0):
    """Read the kept files once; the totals (collected) and the cached per-bucket rows."""
    import time

    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    raw = spark.read.parquet(*kept)
    check_schema(spark, raw, kept[0], a.inputs)
    # The per-stack bucket lists are collected per task in a hash map of stacks.
    spark.conf.set("spark.sql.objectHashAggregate.sortBased.fallbackThreshold", str(1 << 16))
    sel = raw.where(selection(a))
    matched = None
    if a.band is not None:
        band, matched = band_condition(spark, sel, a.band, timings, t0)
        sel = sel.where(band)
    agg, observed = fold(sel)
    # The per-bucket rows are few next to the records: cached in as many partitions as
    # there are cores (not spark.sql.shuffle.partitions, each a task for every later read).
    agg = agg.coalesce(max(1, spark.sparkContext.defaultParallelism)).persist(StorageLevel.MEMORY_AND_DISK)
    tot = agg.where(F.col("tag") == 0).collect()
    timings["fold_s"] = time.monotonic() - t0
    # No record selected: adaptive execution may drop the empty plan's observation
    # (waiting for it would never end), and there is no stack to name.
    text = (observed.get.get("keys") or "[]") if sum(r["c"] for r in tot) else "[]"
    seen = json.loads(text)
    if len({e["h"] for e in seen}) != len(seen):
        fail("two sample stacks share a 64-bit hash (vanishingly rare); report it")
    keys = (
        spark.createDataFrame([(text,)], "j string")
        .select(F.explode(F.from_json("j", f"array<struct<h:long,key:{KEY_TYPE}>>")).alias("e"))
        .select(F.col("e.h").alias("h"), F.col("e.key").alias("frames"))
    )
    if matched is None:
        matched = sum(r["c"] for r in tot)
    return tot, (agg, keys), matched


def write(spark, a, tot, agg, matched):
    """The header from the totals, then one line per stack from the cached rows."""
    from pyspark.sql import functions as F

    requests = sum(r["c"] for r in tot)
    firsts = [r["first"] for r in tot if r["first"] is not None]
    lasts = [r["last"] for r in tot if r["last"] is not None]
    if any(r["sq"] is None for r in tot):
        fail("the latency sum of squares overflowed decimal(38,0)")
    header = {
        "kind": "header",
        "format": FORMAT,
        "selection": a.pairs,
        "requests": requests,
        "matched": matched,
        "latency_sum_ns": sum(r["s"] for r in tot),
        "latency_sum_sq": str(sum(int(r["sq"]) for r in tot)),
        "latency_hist": {
            "buckets": [{"b": r["b"], "c": r["c"]} for r in sorted(tot, key=lambda r: r["b"])],
            "min": min((r["mn"] for r in tot), default=0),
            "max": max((r["mx"] for r in tot), default=0),
        },
        "start_first": min(firsts) if firsts else None,
        "start_last": max(lasts) if lasts else None,
        "accounting": {c: sum(r[c] or 0 for r in tot) for c in ACCOUNTING},
        "stack_histograms": not a.no_histograms,
        "source": {"inputs": a.inputs, "spark": spark.version},
    }
    lines = spark.createDataFrame([(json.dumps(header),)], "value string")
    if agg is not None:
        agg, keys = agg
        stacks = (
            agg.where(F.col("tag") == 1)
            .groupBy("h")
            .agg(
                F.sum("s").alias("sum_ns"), F.sum("c").alias("requests"), F.sum("sq").alias("sq"),
                F.min("mn").alias("mn"), F.max("mx").alias("mx"),
                F.collect_list(F.struct(F.col("b").alias("b"), F.col("c").alias("c"))).alias("buckets"),
            )
            .join(F.broadcast(keys), "h")
        )
        fields = [
            F.lit("stack").alias("kind"), "frames", "sum_ns", "requests",
            F.col("sq").cast("string").alias("sum_sq"),
        ]
        if not a.no_histograms:
            fields.append(F.struct("buckets", F.col("mn").alias("min"), F.col("mx").alias("max")).alias("hist"))
        lines = lines.unionByName(stacks.select(F.to_json(F.struct(*fields)).alias("value")))
    lines.coalesce(1).write.mode("overwrite").text(a.output)
    if agg is not None:
        agg.unpersist()
    return requests


def run(spark, a):
    import time

    from py4j.protocol import Py4JJavaError
    from pyspark.sql.utils import AnalysisException

    timings = {}
    t0 = time.monotonic()
    files = list_files(spark, a.inputs)
    # Partition pruning: a file in a date=/hour= partition outside --since/--until is
    # not opened (its records started in that hour); the rest get the exact row filter.
    kept = [f for f in files if in_range(f, a.since_ns, a.until_ns)]
    print(
        f"cpt_aggregate.py: reading {len(kept)} of {len(files)} Parquet files"
        + (f" ({len(files) - len(kept)} in date=/hour= partitions outside --since/--until)"
           if len(kept) < len(files) else ""),
        file=sys.stderr,
    )
    try:
        tot, agg, matched = fold_all(spark, a, kept, timings, t0) if kept else ([], None, 0)
        requests = write(spark, a, tot, agg, matched)
    except Py4JJavaError as e:
        fail(f"{', '.join(a.inputs)}: {java_error(e)}")
    except AnalysisException as e:
        fail(f"{', '.join(a.inputs)}: {str(e).strip().splitlines()[0]}")
    timings["total_s"] = time.monotonic() - t0
    print(
        f"cpt_aggregate.py: {requests} requests aggregated ({matched} matched the selection"
        + (f" before the band {a.percentile}" if a.band else "")
        + f"); wrote {a.output}",
        file=sys.stderr,
    )
    if a.timings:
        with open(a.timings, "w") as f:
            json.dump(timings, f)


if __name__ == "__main__":
    main(sys.argv[1:])
