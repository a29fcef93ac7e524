"""OTLP request bodies (serialized protobuf) to a collector over gRPC or HTTP/protobuf,
one attempt per call, within a deadline the caller gives.

Why not the SDK's exporters: they retry inside one export for up to their fixed
timeout (10 s), which is what kept `meridian io --duration 2` alive for 9 s against
an unreachable collector. Here a call is one attempt; the exporters (otlp.py,
logs.py) own the retries, their backoff and the final bounded flush.
"""

from __future__ import annotations

import http.client
import ssl
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO
from urllib.parse import urlsplit

__all__ = ["Endpoint", "FirstFailure", "Sent", "Transport"]

SERVICE = {
    "logs": "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
    "metrics": "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
}
# Errors worth another try (OTLP specification, "Retryable response codes").
RETRY_HTTP = {429, 502, 503, 504}
RETRY_GRPC = {"CANCELLED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED",
              "OUT_OF_RANGE", "UNAVAILABLE", "DATA_LOSS"}  # fmt: skip


@dataclass(frozen=True)
class Endpoint:
    """A checked endpoint (options.check_endpoint): scheme, host, port, base path."""

    scheme: str
    host: str
    port: int
    path: str = ""

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}"

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        u = urlsplit(url)
        assert u.hostname and u.port
        return cls(u.scheme, u.hostname, u.port, u.path.rstrip("/"))


@dataclass
class Sent:
    """What one attempt did: `ok`, else whether to try again and why not."""

    ok: bool
    retry: bool = False
    error: str = ""
    response: bytes = b""


class FirstFailure:
    """An exporter's failures, said on `err` (stderr) the first time only: the exporter
    goes on trying, and its summary at the end counts them all."""

    def __init__(self, what: str, meanwhile: str, err: TextIO | None = None) -> None:
        """`what` failed: "OTLP logs export to URL (grpc)"; `meanwhile`: what becomes of
        the data while it retries."""
        self.what, self.meanwhile = what, meanwhile
        self.err = err or sys.stderr
        self.said = False

    def say(self, error: str) -> None:
        if self.said:
            return
        self.said = True
        print(
            f"meridian: {self.what} failed ({error}); retrying with backoff, {self.meanwhile}",
            file=self.err,
        )
        self.err.flush()


class Transport:
    """Sends one signal's requests; the connection (channel) is kept between calls."""

    def __init__(
        self, signal: str, endpoint: Endpoint, protocol: str, headers: Mapping[str, str]
    ) -> None:
        self.signal, self.endpoint, self.protocol = signal, endpoint, protocol
        self.headers = dict(headers)
        self._conn: http.client.HTTPConnection | None = None
        self._channel: Any = None
        self._call: Any = None

    def send(self, body: bytes, timeout: float) -> Sent:
        if timeout <= 0:
            return Sent(False, True, "no time left")
        if self.protocol == "grpc":
            return self._grpc(body, timeout)
        return self._http(body, timeout)

    def _grpc(self, body: bytes, timeout: float) -> Sent:
        import grpc

        if self._call is None:
            e = self.endpoint
            target = f"[{e.host}]:{e.port}" if ":" in e.host else f"{e.host}:{e.port}"
            if e.scheme == "https":
                self._channel = grpc.secure_channel(target, grpc.ssl_channel_credentials())
            else:
                self._channel = grpc.insecure_channel(target)
            self._call = self._channel.unary_unary(SERVICE[self.signal])
        try:
            resp = self._call(body, timeout=timeout, metadata=tuple(self.headers.items()))
        except grpc.RpcError as exc:
            code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
            details = exc.details() if hasattr(exc, "details") else str(exc)
            return Sent(False, code in RETRY_GRPC, f"gRPC {code}: {details}")
        return Sent(True, response=bytes(resp or b""))

    def _http(self, body: bytes, timeout: float) -> Sent:
        e = self.endpoint
        try:
            if self._conn is None:
                if e.scheme == "https":
                    ctx = ssl.create_default_context()
                    self._conn = http.client.HTTPSConnection(
                        e.host, e.port, timeout=timeout, context=ctx
                    )
                else:
                    self._conn = http.client.HTTPConnection(e.host, e.port, timeout=timeout)
            conn = self._conn
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            headers = {**self.headers, "Content-Type": "application/x-protobuf"}
            conn.request("POST", f"{e.path}/v1/{self.signal}", body, headers)
            r = conn.getresponse()
            data = r.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            return Sent(False, True, f"{type(exc).__name__}: {exc}")
        if 200 <= r.status < 300:
            return Sent(True, response=data)
        return Sent(False, r.status in RETRY_HTTP, f"HTTP {r.status} {r.reason}")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._channel is not None:
            self._channel.close()
            self._channel = self._call = None
