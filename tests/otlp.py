"""A real OTLP/HTTP traces endpoint for the tests: what the service's span exporter sends
is decoded as the OpenTelemetry collector would."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span


class Collector:
    """A real OTLP/HTTP traces endpoint: decodes each ExportTraceServiceRequest it gets."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        spans, lock = self.spans, threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                with lock:
                    spans.extend(s for r in request.resource_spans for ss in r.scope_spans
                                 for s in ss.spans)  # fmt: skip
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def named(self, prefix: str) -> list[Span]:
        return [s for s in list(self.spans) if s.name.startswith(prefix)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
