"""Exact checks of the exporters found missing by mutation testing (issue 36, docs/
testing.md): wire.py and transport.py: the hand-written protobuf of the log records, and
what one HTTP or gRPC attempt returns.

Everything runs in this process without a kernel and without gRPC (a fake where its
calls are checked; mutmut forks a process per mutant, which gRPC does not survive)."""

from __future__ import annotations

import http.client
import io
import ssl
import sys
import threading
import types
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest
from export_fakes import free_port
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
)
from opentelemetry.proto.logs.v1 import logs_pb2
from otlp_receiver import attrs as kv_attrs

from meridian.export import wire
from meridian.export.transport import Endpoint, FirstFailure, Sent, Transport
from meridian.export.wire import LogEncoder, _int_kvs, _kv_field, any_value, key_value, varint

# ---- wire.py ------------------------------------------------------------------------


def test_varint_is_protobufs_base_128_with_negatives_in_ten_bytes() -> None:
    """Little-endian groups of 7 bits, the high bit set on all but the last."""
    assert varint(0) == b"\x00"
    assert varint(127) == b"\x7f"
    assert varint(128) == b"\x80\x01"
    assert varint(300) == b"\xac\x02"
    assert varint(2**63) == b"\x80" * 9 + b"\x01"
    assert varint(-1) == b"\xff" * 9 + b"\x01"


def test_any_value_and_key_value_are_the_generated_messages_bytes() -> None:
    """Each AnyValue kind with its field number, and a KeyValue around it."""
    assert any_value(True) == b"\x10\x01"
    assert any_value(False) == b"\x10\x00"
    assert any_value(300) == b"\x18\xac\x02"
    assert any_value(0.5) == b"\x21" + b"\x00" * 6 + b"\xe0\x3f"
    assert any_value("é") == b"\x0a\x02\xc3\xa9"
    assert key_value("k", 1) == b"\x0a\x01k\x12\x02\x18\x01"
    assert _kv_field("k", "v") == b"\x32\x08\x0a\x01k\x12\x03\x0a\x01v"
    long = "x" * 200  # a length of two varint bytes
    assert wire._field(1, long.encode()) == b"\x0a\xc8\x01" + long.encode()


def test_int_columns_encode_as_one_attribute_field_each() -> None:
    """The numpy encoder of int columns writes, value by value, what `_kv_field`
    writes: every varint length from 1 to 10 bytes, zero and negatives."""
    values = [0, 1, -1, 2**63 - 1, -(2**63)]
    values += [v for i in range(1, 9) for v in ((1 << (7 * i)) - 1, 1 << (7 * i))]
    col = np.array(values, np.int64)
    assert _int_kvs("key.name", col) == [_kv_field("key.name", v) for v in values]
    assert _int_kvs("k" * 99, col[:2]) == [_kv_field("k" * 99, v) for v in values[:2]]
    with pytest.raises(AssertionError):
        _int_kvs("k" * 100, col[:1])  # a key whose KeyValue length takes two bytes


def test_columns_of_each_kind_encode_as_single_values_do() -> None:
    """Bools, ints (varied, constant, none), categorical and plain strings: each
    record's field as `_kv_field` writes it."""
    enc = LogEncoder({}, "s", "v", "e")
    kv = _kv_field
    assert enc._column("b", np.array([True, False, True]), 3) == [
        kv("b", True),
        kv("b", False),
        kv("b", True),
    ]
    assert enc._column("i", np.array([3, 300]), 2) == [kv("i", 3), kv("i", 300)]
    assert enc._column("i", np.array([7, 7, 7], np.uint32), 3) == [kv("i", 7)] * 3
    assert enc._column("i", np.array([], np.int64), 0) == []
    cat: tuple[list[str | int], np.ndarray[Any, Any]] = (["a", 7], np.array([1, 0, 1]))
    assert enc._column("c", cat, 3) == [kv("c", 7), kv("c", "a"), kv("c", 7)]
    assert enc._column("s", ["x", "y"], 2) == [kv("s", "x"), kv("s", "y")]
    assert enc._strings[("s", "y")] == kv("s", "y")


def test_encoder_caches_are_bounded() -> None:
    """The string and length caches are emptied when they reach 65,536 entries, so a
    long run of distinct paths cannot grow them without end."""
    enc = LogEncoder({}, "s", "v", "e")
    enc._strings = {("k", str(i)): b"" for i in range(wire._CACHE_MAX - 1)}
    enc._string("k", "last")
    assert len(enc._strings) == wire._CACHE_MAX
    assert enc._string("k", "new") == _kv_field("k", "new")
    assert enc._strings == {("k", "new"): _kv_field("k", "new")}
    enc._lengths[b"\x12"] = {i: b"" for i in range(wire._CACHE_MAX - 1)}
    assert enc._heads(b"\x12", [1_000_000]) == [b"\x12" + varint(1_000_000)]
    assert len(enc._lengths[b"\x12"]) == wire._CACHE_MAX
    assert enc._heads(b"\x12", [5, 300, 5]) == [b"\x12\x05", b"\x12\xac\x02", b"\x12\x05"]
    assert enc._lengths[b"\x12"] == {5: b"\x12\x05", 300: b"\x12\xac\x02"}


def test_records_decode_as_log_records_with_every_field() -> None:
    """Bodies of one- and two-byte lengths (127, 128, 200 bytes), times, observed time,
    severity, attributes in order and the event name."""
    enc = LogEncoder({"service.name": "m"}, "meridian.x", "9.9", "meridian.x")
    assert enc.records([], np.zeros(0, np.uint64), 1, []) == []
    bodies = [b"a" * 127, b"b" * 128, b"c" * 200, b""]
    ts = np.array([1, 2**32, 2**64 - 1, 0], np.uint64)
    recs = enc.records(bodies, ts, 5, [("n", np.array([1, 2, 3, 4])), ("p", ["w", "x", "y", "z"])])
    assert len(recs) == 4
    for i, rec in enumerate(recs):
        lr = logs_pb2.LogRecord.FromString(rec)
        assert lr.time_unix_nano == int(ts[i]) and lr.observed_time_unix_nano == 5
        assert (lr.severity_number, lr.severity_text) == (9, "INFO")
        assert lr.body.string_value == bodies[i].decode()
        assert kv_attrs(lr.attributes) == {"n": i + 1, "p": "wxyz"[i]}
        assert [a.key for a in lr.attributes] == ["n", "p"]
        assert lr.event_name == "meridian.x"


def test_requests_fill_each_up_to_the_byte_limit_exactly() -> None:
    """Records of 1,021 bytes take 1,024 with their field head: 1,024 of them are
    exactly MAX_REQUEST_BYTES and go in one request; a record larger than the limit
    goes alone. Bodies are the resource, the scope, then the records in order."""
    enc = LogEncoder({"a": 1}, "sc", "1", "e")
    recs = [bytes([i % 251]) * 1021 for i in range(2048)]
    got = list(enc.requests(recs))
    assert [n for _, n in got] == [1024, 1024]
    head = b"\x12\xfd\x07"
    for k, (body, _) in enumerate(got):
        chunk = recs[k * 1024 : (k + 1) * 1024]
        assert body == enc.request(b"".join(head + r for r in chunk))
    big = b"z" * (wire.MAX_REQUEST_BYTES + 10)
    assert [n for _, n in enc.requests([big, b"q", b"r"])] == [1, 2]
    assert list(enc.requests([])) == []
    req = ExportLogsServiceRequest.FromString(enc.request(b""))
    rl = req.resource_logs[0]
    assert kv_attrs(rl.resource.attributes) == {"a": 1}
    assert (rl.scope_logs[0].scope.name, rl.scope_logs[0].scope.version) == ("sc", "1")


# ---- transport.py -------------------------------------------------------------------


def test_endpoint_url_brackets_ipv6_and_parse_drops_the_trailing_slash() -> None:
    """The URL said in messages, and the base path requests go under."""
    assert Endpoint("http", "::1", 4318, "/otlp").url == "http://[::1]:4318/otlp"
    assert Endpoint("https", "h", 1).url == "https://h:1"
    assert Endpoint.parse("http://[::1]:9/a/b/") == Endpoint("http", "::1", 9, "/a/b")
    assert Sent(False) == Sent(False, False, "", b"")


def test_first_failure_is_said_once_in_one_line() -> None:
    """An exporter that keeps failing says so once, naming what failed and what
    becomes of the data meanwhile."""
    err = io.StringIO()
    f = FirstFailure("OTLP x export to U (grpc)", "nothing is lost", err)
    assert not f.said
    f.say("E1")
    f.say("E2")
    assert f.said
    assert err.getvalue() == (
        "meridian: OTLP x export to U (grpc) failed (E1); retrying with backoff, nothing is lost\n"
    )


def test_first_failure_writes_to_stderr_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    """Without a stream, the line goes to the tool's stderr."""
    FirstFailure("w", "m").say("e")
    assert capsys.readouterr().err == "meridian: w failed (e); retrying with backoff, m\n"


def test_no_time_left_is_a_retryable_failure_without_a_request() -> None:
    """A call with no time left (0 or less) sends nothing and says so."""
    t = Transport("logs", Endpoint("http", "127.0.0.1", 9), "http/protobuf", {})
    assert t.send(b"x", 0.0) == Sent(False, True, "no time left")
    assert t.send(b"x", -1.0) == Sent(False, True, "no time left")
    assert t._conn is None


class _Collector:
    """An HTTP server on loopback answering POSTs with `statuses` in turn."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses)
        self.got: list[tuple[str, dict[str, str], bytes, tuple[str, int]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.got.append((self.path, dict(self.headers), body, self.client_address))
                status = outer.statuses[min(len(outer.got), len(outer.statuses)) - 1]
                reply = b"resp:" + body
                self.send_response(status)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def collector() -> Iterator[Callable[..., _Collector]]:
    made: list[_Collector] = []

    def make(*statuses: int) -> _Collector:
        made.append(_Collector(*statuses))
        return made[-1]

    yield make
    for c in made:
        c.close()


def test_http_posts_under_the_base_path_and_keeps_the_connection(
    collector: Callable[..., _Collector],
) -> None:
    """POST {path}/v1/{signal} with the headers and the protobuf content type; a 2xx
    is ok with the response body; the connection (and its timeout) is kept."""
    c = collector(200, 201)
    t = Transport("metrics", Endpoint("http", "127.0.0.1", c.port, "/base"), "http", {"k": "v"})
    assert t.send(b"one", 3.0) == Sent(True, response=b"resp:one")
    assert t._conn is not None and t._conn.timeout == 3.0
    assert t.send(b"two", 4.5) == Sent(True, response=b"resp:two")
    assert t._conn is not None and t._conn.timeout == 4.5
    assert t._conn.sock is not None and t._conn.sock.gettimeout() == 4.5
    (p1, h1, b1, a1), (p2, _, b2, a2) = c.got
    assert (p1, p2, b1, b2) == ("/base/v1/metrics", "/base/v1/metrics", b"one", b"two")
    assert h1["k"] == "v" and h1["Content-Type"] == "application/x-protobuf"
    assert a1 == a2  # one connection
    t.close()
    assert t._conn is None


@pytest.mark.parametrize(
    ("status", "retry", "error"),
    [
        (429, True, "HTTP 429 Too Many Requests"),
        (502, True, "HTTP 502 Bad Gateway"),
        (503, True, "HTTP 503 Service Unavailable"),
        (504, True, "HTTP 504 Gateway Timeout"),
        (400, False, "HTTP 400 Bad Request"),
        (500, False, "HTTP 500 Internal Server Error"),
        (300, False, "HTTP 300 Multiple Choices"),
        (199, False, "HTTP 199 "),
    ],
)
def test_http_status_says_whether_to_try_again(
    collector: Callable[..., _Collector], status: int, retry: bool, error: str
) -> None:
    """The OTLP retryable codes (429, 502, 503, 504) are retried; others are not."""
    c = collector(status)
    t = Transport("logs", Endpoint("http", "127.0.0.1", c.port), "http/protobuf", {})
    try:
        assert t.send(b"x", 5.0) == Sent(False, retry, error)
    finally:
        t.close()
    assert c.got[0][0] == "/v1/logs"


def test_http_connection_error_is_retryable_and_drops_the_connection() -> None:
    """A refused connection: retry later, with a fresh connection."""
    port = free_port()
    t = Transport("logs", Endpoint("http", "127.0.0.1", port), "http/protobuf", {})
    r = t.send(b"x", 5.0)
    assert r == Sent(False, True, "ConnectionRefusedError: [Errno 111] Connection refused")
    assert t._conn is None


def test_https_uses_a_verifying_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """https endpoints get an HTTPS connection with the default (verifying) context."""
    made: list[tuple[str, int, float, Any]] = []

    class Conn:
        sock = None
        timeout = 0.0

        def __init__(self, host: str, port: int, timeout: float, context: Any) -> None:
            made.append((host, port, timeout, context))

        def request(self, *args: Any) -> None:
            raise OSError("no route")

        def close(self) -> None:
            pass

    monkeypatch.setattr(http.client, "HTTPSConnection", Conn)
    t = Transport("logs", Endpoint("https", "h.example", 443), "http/protobuf", {})
    assert t.send(b"x", 2.0) == Sent(False, True, "OSError: no route")
    [(host, port, timeout, ctx)] = made
    assert (host, port, timeout) == ("h.example", 443, 2.0)
    assert isinstance(ctx, ssl.SSLContext) and ctx.verify_mode == ssl.CERT_REQUIRED


class _FakeRpcError(Exception):
    def __init__(self, code: str | None, details: str) -> None:
        super().__init__(details)
        if code is not None:
            self.code = lambda: types.SimpleNamespace(name=code)
            self.details = lambda: details


@pytest.fixture
def fake_grpc(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """A stand-in for the gRPC library: channels record how they were made, calls
    answer from `log.answers` (an exception is raised)."""
    log = types.SimpleNamespace(channels=[], calls=[], answers=[b"ok"], closed=0)

    class Channel:
        def __init__(self, target: str, creds: Any) -> None:
            log.channels.append((target, creds))

        def unary_unary(self, method: str) -> Callable[..., Any]:
            def call(body: bytes, timeout: float, metadata: Any) -> Any:
                log.calls.append((method, body, timeout, metadata))
                answer = log.answers[min(len(log.calls), len(log.answers)) - 1]
                if isinstance(answer, Exception):
                    raise answer
                return answer

            return call

        def close(self) -> None:
            log.closed += 1

    mod = types.ModuleType("grpc")
    mod.RpcError = _FakeRpcError  # type: ignore[attr-defined]
    mod.insecure_channel = lambda target: Channel(target, None)  # type: ignore[attr-defined]
    mod.secure_channel = lambda target, creds: Channel(target, creds)  # type: ignore[attr-defined]
    mod.ssl_channel_credentials = lambda: "tls"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "grpc", mod)
    return log


def test_grpc_calls_the_signals_export_with_the_headers(fake_grpc: types.SimpleNamespace) -> None:
    """One channel per transport (insecure for http, TLS for https, IPv6 bracketed),
    the service's Export method, the timeout and the headers as metadata."""
    t = Transport("metrics", Endpoint("http", "::1", 4317), "grpc", {"a": "1", "b": "2"})
    assert t.send(b"req", 3.5) == Sent(True, response=b"ok")
    fake_grpc.answers = [None]
    assert t.send(b"req2", 1.0) == Sent(True, response=b"")
    assert fake_grpc.channels == [("[::1]:4317", None)]
    method = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
    assert fake_grpc.calls == [
        (method, b"req", 3.5, (("a", "1"), ("b", "2"))),
        (method, b"req2", 1.0, (("a", "1"), ("b", "2"))),
    ]
    t.close()
    assert fake_grpc.closed == 1 and t._channel is None and t._call is None
    s = Transport("logs", Endpoint("https", "h", 1), "grpc", {})
    s.send(b"x", 1.0)
    assert fake_grpc.channels[-1] == ("h:1", "tls")
    assert fake_grpc.calls[-1][0] == "/opentelemetry.proto.collector.logs.v1.LogsService/Export"


@pytest.mark.parametrize(
    ("code", "retry"),
    [
        ("CANCELLED", True),
        ("DEADLINE_EXCEEDED", True),
        ("RESOURCE_EXHAUSTED", True),
        ("ABORTED", True),
        ("OUT_OF_RANGE", True),
        ("UNAVAILABLE", True),
        ("DATA_LOSS", True),
        ("INVALID_ARGUMENT", False),
        ("UNAUTHENTICATED", False),
    ],
)
def test_grpc_status_says_whether_to_try_again(
    fake_grpc: types.SimpleNamespace, code: str, retry: bool
) -> None:
    """The OTLP retryable gRPC codes are retried; the error names code and details."""
    fake_grpc.answers = [_FakeRpcError(code, "why")]
    t = Transport("logs", Endpoint("http", "h", 1), "grpc", {})
    assert t.send(b"x", 1.0) == Sent(False, retry, f"gRPC {code}: why")


def test_grpc_error_without_a_status_is_unknown(fake_grpc: types.SimpleNamespace) -> None:
    """An RpcError that carries no code (not from a call) is not retried."""
    fake_grpc.answers = [_FakeRpcError(None, "odd")]
    t = Transport("logs", Endpoint("http", "h", 1), "grpc", {})
    assert t.send(b"x", 1.0) == Sent(False, False, "gRPC UNKNOWN: odd")
