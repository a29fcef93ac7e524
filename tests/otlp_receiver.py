"""Real OTLP receivers for tests, on loopback: a gRPC server built from the official
`opentelemetry-proto` service definitions (MetricsService, LogsService), and a tiny
HTTP server taking the same protobuf bodies at /v1/metrics and /v1/logs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from meridian.export.prometheus import QuietHandler


class Received:
    """Every request a receiver got, in order (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.logs: list[logs_service_pb2.ExportLogsServiceRequest] = []
        self.headers: list[dict[str, str]] = []

    def add(self, req: Any, headers: dict[str, str]) -> None:
        with self.lock:
            if isinstance(req, metrics_service_pb2.ExportMetricsServiceRequest):
                self.metrics.append(req)
            else:
                self.logs.append(req)
            self.headers.append(headers)

    def latest_points(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        """(attributes, data point) of metric `name` in the last request that has it."""
        with self.lock:
            reqs = list(self.metrics)
        for req in reversed(reqs):
            out = []
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.name != name:
                            continue
                        kind = m.WhichOneof("data")
                        for dp in getattr(m, kind).data_points:
                            out.append((attrs(dp.attributes), dp))
            if out:
                return out
        return []

    def log_records(self) -> list[Any]:
        with self.lock:
            reqs = list(self.logs)
        return [
            lr
            for req in reqs
            for rl in req.resource_logs
            for sl in rl.scope_logs
            for lr in sl.log_records
        ]


def value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    return getattr(v, which) if which else None


def attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in kvs if isinstance(kv, KeyValue)}


class _Export:
    """A gRPC service's Export: the request into `got`, then an empty `RESPONSE`."""

    RESPONSE: Any

    def __init__(self, got: Received) -> None:
        self.got = got

    def Export(self, request: Any, context: Any) -> Any:
        self.got.add(request, dict(context.invocation_metadata()))
        return self.RESPONSE()


class _Metrics(_Export, metrics_service_pb2_grpc.MetricsServiceServicer):
    RESPONSE = metrics_service_pb2.ExportMetricsServiceResponse


class _Logs(_Export, logs_service_pb2_grpc.LogsServiceServicer):
    RESPONSE = logs_service_pb2.ExportLogsServiceResponse


@contextmanager
def grpc_receiver(port: int = 0) -> Iterator[tuple[int, Received]]:
    """A gRPC OTLP receiver on 127.0.0.1 (`port` 0: any free one)."""
    got = Received()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    add_metrics: Any = metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server
    add_logs: Any = logs_service_pb2_grpc.add_LogsServiceServicer_to_server
    add_metrics(_Metrics(got), server)
    add_logs(_Logs(got), server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        yield bound, got
    finally:
        server.stop(0).wait(5)


@contextmanager
def http_receiver() -> Iterator[tuple[int, Received]]:
    """An OTLP/HTTP protobuf receiver on 127.0.0.1."""
    got = Received()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            req: Any
            resp: Any
            if self.path == "/v1/metrics":
                req = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
                resp = metrics_service_pb2.ExportMetricsServiceResponse()
            elif self.path == "/v1/logs":
                req = logs_service_pb2.ExportLogsServiceRequest.FromString(body)
                resp = logs_service_pb2.ExportLogsServiceResponse()
            else:
                self.send_error(404)
                return
            got.add(req, {k.lower(): v for k, v in self.headers.items()})
            self.reply(resp.SerializeToString(), "application/x-protobuf")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1]), got
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
