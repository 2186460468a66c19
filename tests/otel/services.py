"""Three services instrumented with the OpenTelemetry Python SDK only, sending
their traces to `cpt serve` with the stock OTLP exporters.

`frontend` (OTLP/gRPC, gzip) handles `GET /checkout`: it calls `cart` and
then `payment` over a W3C `traceparent` header (propagated the SDK's way,
through a carrier dict), then renders. `cart` (OTLP/HTTP protobuf) and
`payment` (OTLP/HTTP protobuf, gzip) each do their work in known sleeps.
Every span is also written, in the OTLP JSON mapping (one export request a
line, hex ids), to --spans-file: the same spans `cpt traces convert --from
otlp` reads.

    python services.py --grpc HOST:PORT --http http://HOST:PORT --spans-file F --requests N
"""

import argparse
import base64
import json
import threading
import time

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpExporter,
)
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import SpanKind

# Known sleeps, in seconds.
CART = 0.030
PAYMENT_DB = 0.040
PAYMENT_OWN = 0.010
RENDER = 0.015

LOCK = threading.Lock()


class FileExporter(SpanExporter):
    """Writes each export as one OTLP JSON line (hex ids, as the collector's
    file exporter does)."""

    def __init__(self, path):
        self.path = path

    def export(self, spans):
        doc = MessageToDict(encode_spans(spans))
        for rs in doc.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                for s in ss.get("spans", []):
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if s.get(key):
                            s[key] = base64.b64decode(s[key]).hex()
        with LOCK, open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(doc) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


def provider(service, exporter, spans_file):
    p = TracerProvider(
        resource=Resource.create(
            {"service.name": service, "service.version": "2.1.0", "host.name": "otel-" + service}
        )
    )
    # The same batches to cpt serve and to the file.
    p.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
    p.add_span_processor(BatchSpanProcessor(FileExporter(spans_file), schedule_delay_millis=200))
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpc", required=True)
    ap.add_argument("--http", required=True)
    ap.add_argument("--spans-file", required=True)
    ap.add_argument("--requests", type=int, default=5)
    ap.add_argument("--token")
    a = ap.parse_args()
    headers = {"authorization": "Bearer " + a.token} if a.token else None
    front = provider(
        "frontend",
        GrpcExporter(endpoint=a.grpc, insecure=True, compression=__import__("grpc").Compression.Gzip, headers=headers),
        a.spans_file,
    )
    cart = provider(
        "cart",
        HttpExporter(endpoint=a.http + "/v1/traces", headers=headers),
        a.spans_file,
    )
    payment = provider(
        "payment",
        HttpExporter(endpoint=a.http + "/v1/traces", compression=HttpCompression.Gzip, headers=headers),
        a.spans_file,
    )
    ft = front.get_tracer("frontend")
    ct = cart.get_tracer("cart")
    pt = payment.get_tracer("payment")

    def call(tracer, name, work):
        """A client span in the caller, the server span in the callee."""
        with tracer.start_as_current_span("call " + name, kind=SpanKind.CLIENT):
            carrier = {}
            inject(carrier)
            work(extract(carrier))

    def cart_handler(ctx):
        with ct.start_as_current_span("GET /cart", context=ctx, kind=SpanKind.SERVER):
            time.sleep(CART)

    def payment_handler(ctx):
        with pt.start_as_current_span("POST /pay", context=ctx, kind=SpanKind.SERVER):
            with pt.start_as_current_span("SELECT account", kind=SpanKind.CLIENT):
                time.sleep(PAYMENT_DB)
            time.sleep(PAYMENT_OWN)

    for _ in range(a.requests):
        with ft.start_as_current_span("GET /checkout", kind=SpanKind.SERVER):
            call(ft, "cart", cart_handler)
            call(ft, "payment", payment_handler)
            with ft.start_as_current_span("render"):
                time.sleep(RENDER)
    for p in (cart, payment, front):
        p.shutdown()


if __name__ == "__main__":
    main()
