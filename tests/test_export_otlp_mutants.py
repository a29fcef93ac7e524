"""Exact checks of the exporters found missing by mutation testing (issue 36, docs/
testing.md): otlp.py: endpoints and headers, the OTLP metric requests, their batches,
and the accounting of failed exports.

Everything runs in this process without a kernel and without gRPC (a fake where its
calls are checked; mutmut forks a process per mutant, which gRPC does not survive)."""

from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from export_fakes import FakeSend
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from otlp_receiver import attrs as kv_attrs

import meridian.export.otlp as otlp_mod
from meridian import __version__
from meridian.errors import UsageError
from meridian.export.otlp import OtlpMetrics, check_endpoint, parse_header, resource_attrs
from meridian.export.series import Family, HistPoint, Point
from meridian.export.transport import Sent

# ---- otlp.py ------------------------------------------------------------------------


USERINFO = "user:password@ is not taken here (use --otlp-header authorization=...)"


def _bad(url: str, protocol: str, why: str) -> str:
    port = 4317 if protocol == "grpc" else 4318
    return f"--otlp-endpoint {url!r}: {why}; write a URL such as http://localhost:{port}"


@pytest.mark.parametrize(
    ("url", "protocol", "why"),
    [
        ("localhost:4317", "grpc", "no scheme (http:// or https://)"),
        ("localhost:4318", "http/protobuf", "no scheme (http:// or https://)"),
        ("http://127.0.0.1:4x", "grpc", "the port must be a number from 1 to 65535"),
        ("http://127.0.0.1:0", "grpc", "the port must be a number from 1 to 65535"),
        ("ftp://127.0.0.1", "grpc", "the scheme must be http or https, not 'ftp'"),
        ("http://:4317", "grpc", "no host"),
        ("http://u@127.0.0.1", "grpc", USERINFO),
        ("http://:p@127.0.0.1", "grpc", USERINFO),
        ("http://127.0.0.1:4317?", "grpc", "no ?query or #fragment"),
        ("http://127.0.0.1:4317/?", "grpc", "no ?query or #fragment"),
        ("http://127.0.0.1?a=b", "grpc", "no ?query or #fragment"),
        ("http://127.0.0.1#f", "http/protobuf", "no ?query or #fragment"),
        ("http://127.0.0.1:4317/v1", "grpc", "a gRPC endpoint has no path"),
    ],
)  # fmt: skip
def test_check_endpoint_says_what_is_wrong_in_one_line(url: str, protocol: str, why: str) -> None:
    """Each mistake named, with a URL to write instead (the protocol's port)."""
    with pytest.raises(UsageError) as e:
        check_endpoint(url, protocol)
    assert str(e.value) == _bad(url, protocol, why)


def test_check_endpoint_makes_the_port_explicit_without_resolving_addresses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An IP address is not looked up; the protocol's port is filled in; a trailing
    slash is dropped; an http/protobuf endpoint keeps its base path."""

    def no_lookup(*args: Any, **kw: Any) -> Any:
        raise AssertionError("looked up")

    monkeypatch.setattr(socket, "getaddrinfo", no_lookup)
    assert check_endpoint("http://127.0.0.1", "grpc") == "http://127.0.0.1:4317"
    assert check_endpoint("https://127.0.0.1/", "grpc") == "https://127.0.0.1:4317"
    assert check_endpoint("http://[::1]", "http/protobuf") == "http://[::1]:4318"
    assert check_endpoint("http://10.0.0.1:99/otlp/", "http/protobuf") == "http://10.0.0.1:99/otlp"
    assert check_endpoint("http://10.0.0.1:99/otlpX", "http/protobuf") == "http://10.0.0.1:99/otlpX"


def test_check_endpoint_resolves_host_names_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name is looked up once at start (stream sockets); one that does not resolve is
    a UsageError with the resolver's reason."""
    asked: list[tuple[Any, ...]] = []

    def lookup(host: str, port: Any, type: int = 0) -> list[Any]:
        asked.append((host, port, type))
        if host == "good.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", 0))]
        if host == "odd.example":
            raise OSError("strange")
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    assert check_endpoint("http://good.example:5", "grpc") == "http://good.example:5"
    assert asked == [("good.example", None, socket.SOCK_STREAM)]
    with pytest.raises(UsageError) as e:
        check_endpoint("http://bad.example", "grpc")
    assert str(e.value) == _bad(
        "http://bad.example",
        "grpc",
        "host 'bad.example' does not resolve (Name or service not known)",
    )
    with pytest.raises(UsageError) as e:
        check_endpoint("http://odd.example", "grpc")
    assert "host 'odd.example' does not resolve (strange)" in str(e.value)


def test_parse_header_lowercases_the_key_and_trims_both_sides() -> None:
    """gRPC metadata keys are lower case; values may contain '='."""
    assert parse_header(" X-Key = a=b ") == ("x-key", "a=b")
    assert parse_header("k=") == ("k", "")
    for bad in ("novalue", "=v", "  =v"):
        with pytest.raises(UsageError) as e:
            parse_header(bad)
        assert str(e.value) == f"--otlp-header takes KEY=VALUE, got {bad!r}"


def test_resource_attrs_name_the_service_host_and_tool() -> None:
    """The resource every request carries."""
    assert resource_attrs("io") == {
        "service.name": "meridian",
        "service.version": __version__,
        "host.name": socket.gethostname(),
        "meridian.tool": "io",
    }


def _metrics(
    source: Callable[[], list[Family]], interval: float = 3600.0, **kw: Any
) -> OtlpMetrics:
    """An exporter whose thread waits an hour; the test calls its methods."""
    return OtlpMetrics(source, "tt", "http://127.0.0.1:9", interval=interval, **kw)


@pytest.fixture
def exporters() -> Iterator[Callable[..., OtlpMetrics]]:
    made: list[OtlpMetrics] = []

    def make(*args: Any, **kw: Any) -> OtlpMetrics:
        made.append(_metrics(*args, **kw))
        return made[-1]

    yield make
    for exp in made:
        exp._stop.set()
        exp._thread.join(5)


def _decode(bodies: list[bytes]) -> list[Any]:
    return [ExportMetricsServiceRequest.FromString(b) for b in bodies]


def test_otlp_request_has_every_field_of_each_kind(
    exporters: Callable[..., OtlpMetrics],
) -> None:
    """Resource and scope; a counter (cumulative, monotonic, start time, int and
    double values); a gauge (no start time); histograms with the family's bounds,
    bucket counts, count, sum, and min/max only when the kernel keeps them."""
    slots = np.array([1, 0, 2, 3], np.uint64)
    fams = [
        Family(
            "c",
            "counter",
            "By",
            "cd",
            [Point({"b": True, "i": 3, "s": "x"}, 7), Point({"f": False}, 2.5)],
        ),
        Family("g", "gauge", "1", "gd", [Point({}, 4), Point({}, 0.25)]),
        Family(
            "h",
            "histogram",
            "{r}",
            "hd",
            [
                HistPoint({"k": "a"}, slots, 1.0, 9.5, max=20.0, min=0.0),
                HistPoint({"k": "b"}, slots, 1.0, 1.5),
            ],
        ),
    ]
    exp = exporters(lambda: fams)
    before = time.time_ns()
    [req] = _decode(exp.requests())
    after = time.time_ns()
    [rm] = req.resource_metrics
    assert kv_attrs(rm.resource.attributes) == resource_attrs("tt")
    [sm] = rm.scope_metrics
    assert (sm.scope.name, sm.scope.version) == ("meridian.tt", __version__)
    c, g, h = sm.metrics
    assert (c.name, c.description, c.unit) == ("c", "cd", "By")
    assert c.sum.aggregation_temporality == 2 and c.sum.is_monotonic
    c1, c2 = c.sum.data_points
    assert kv_attrs(c1.attributes) == {"b": True, "i": 3, "s": "x"}
    assert [a.value.WhichOneof("value") for a in c1.attributes] == [
        "bool_value",
        "int_value",
        "string_value",
    ]
    assert kv_attrs(c2.attributes) == {"f": False}
    assert (c1.WhichOneof("value"), c1.as_int) == ("as_int", 7)
    assert (c2.WhichOneof("value"), c2.as_double) == ("as_double", 2.5)
    assert c1.start_time_unix_nano == exp.start_ns and before <= c1.time_unix_nano <= after
    assert g.WhichOneof("data") == "gauge"
    g1, g2 = g.gauge.data_points
    assert (g1.as_int, g2.as_double, g1.start_time_unix_nano) == (4, 0.25, 0)
    assert g1.time_unix_nano == c1.time_unix_nano
    assert h.histogram.aggregation_temporality == 2
    h1, h2 = h.histogram.data_points
    assert kv_attrs(h1.attributes) == {"k": "a"}
    assert (h1.start_time_unix_nano, h1.time_unix_nano) == (exp.start_ns, c1.time_unix_nano)
    assert (h1.count, h1.sum, list(h1.bucket_counts)) == (6, 9.5, [1, 0, 2, 3])
    assert list(h1.explicit_bounds) == [2.0, 4.0, 8.0]
    assert (h1.HasField("min"), h1.min, h1.HasField("max"), h1.max) == (True, 0.0, True, 20.0)
    assert (h2.HasField("min"), h2.HasField("max")) == (False, False)


def test_otlp_requests_hold_at_most_batch_points_points(
    exporters: Callable[..., OtlpMetrics],
) -> None:
    """A family larger than BATCH_POINTS is split; a family that would overflow the
    request starts a new one; one that fills it exactly does not; a family with no
    points still sends its metric."""
    n = otlp_mod.BATCH_POINTS

    def fam(name: str, k: int) -> Family:
        return Family(name, "gauge", "1", "", [Point({"i": i}, i) for i in range(k)])

    def layout(fams: list[Family]) -> list[list[tuple[str, int]]]:
        exp = exporters(lambda: fams)
        return [
            [
                (m.name, len(m.gauge.data_points))
                for m in req.resource_metrics[0].scope_metrics[0].metrics
            ]
            for req in _decode(exp.requests())
        ]

    assert layout([fam("a", n + 500)]) == [[("a", n)], [("a", 500)]]
    assert layout([fam("a", n // 2), fam("b", n // 2)]) == [[("a", n // 2), ("b", n // 2)]]
    assert layout([fam("a", n // 2), fam("b", n // 2 + 1)]) == [
        [("a", n // 2)],
        [("b", n // 2 + 1)],
    ]
    assert layout([fam("e", 0), fam("a", 3)]) == [[("e", 0), ("a", 3)]]
    three = layout([fam("a", n // 2), fam("b", n // 4), fam("c", n // 4 + 1)])
    assert three == [[("a", n // 2), ("b", n // 4)], [("c", n // 4 + 1)]]
    assert layout([]) == [[]]
    split = layout([fam("a", 3), fam("b", 2 * n + 1)])
    assert split == [[("a", 3)], [("b", n)], [("b", n)], [("b", 1)]]


def test_export_once_sends_each_request_within_the_timeout(
    exporters: Callable[..., OtlpMetrics],
) -> None:
    """Without a deadline each request gets the exporter's timeout; with one, the time
    left; the timeout is the interval held between 2 and 10 seconds."""
    exp = exporters(lambda: [Family("g", "gauge", "1", "", [Point({}, 1)])])
    assert exp.timeout == 10.0
    send = FakeSend()
    exp.transport.send = send  # type: ignore[method-assign]
    assert exp.export_once() is True
    assert (exp.exports, exp.failures, exp.last_ok) == (1, 0, True)
    [(body, timeout)] = send.calls
    assert timeout == 10.0
    [req] = _decode([body])
    assert req.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].as_int == 1
    assert exp.export_once(time.monotonic() + 4.0) is True
    assert 3.0 < send.calls[1][1] <= 4.0
    assert exp.export_once(time.monotonic() + 60.0) is True
    assert send.calls[2][1] == 10.0
    exp.last_error = "HTTP 503 earlier"  # a second left is still worth a try
    assert exp.export_once(time.monotonic() + 0.8) is True
    assert len(send.calls) == 4 and 0.0 < send.calls[3][1] <= 0.8
    for interval, timeout in ((0.5, 2.0), (5.0, 5.0)):
        short = exporters(lambda: [], interval=interval)
        short._stop.set()
        assert short.timeout == timeout
    default = OtlpMetrics(lambda: [], "tt", "http://127.0.0.1:9")
    default._stop.set()
    default._thread.join(5)
    assert (default.interval, default.timeout) == (10.0, 10.0)
    # the loop's thread never keeps a tool alive, and says what it is
    assert (exp._thread.name, exp._thread.daemon) == ("otlp-metrics", True)


def test_failed_exports_are_counted_and_said_once(exporters: Callable[..., OtlpMetrics]) -> None:
    """A failed send stops that export (later requests wait for the next one), counts
    a failure, keeps the reason, and is said once; a later success sets last_ok."""
    big = Family("g", "gauge", "1", "", [Point({}, 1)] * (otlp_mod.BATCH_POINTS + 1))
    err = io.StringIO()
    exp = exporters(lambda: [big], err=err)
    send = FakeSend(Sent(False, True, "HTTP 503 x"), Sent(False, False, "gRPC Y: z"), Sent(True))
    exp.transport.send = send  # type: ignore[method-assign]
    assert exp.export_once() is False
    assert len(send.calls) == 1
    assert (exp.exports, exp.failures, exp.last_error, exp.last_ok) == (1, 1, "HTTP 503 x", False)
    assert exp.summary() == (
        "meridian: 1 of 1 OTLP metric exports to http://127.0.0.1:9 failed; "
        "the last totals did not arrive (HTTP 503 x)"
    )
    assert exp.export_once() is False
    assert (exp.failures, exp.last_error) == (2, "gRPC Y: z")
    assert exp.export_once() is True
    assert len(send.calls) == 4  # both requests of the third export
    assert (exp.exports, exp.failures, exp.last_error, exp.last_ok) == (3, 2, "gRPC Y: z", True)
    assert exp.summary() == (
        "meridian: 2 of 3 OTLP metric exports to http://127.0.0.1:9 failed; the last totals arrived"
    )
    assert err.getvalue() == (
        "meridian: OTLP metrics export to http://127.0.0.1:9 (grpc) failed (HTTP 503 x); "
        "retrying with backoff, totals are cumulative so nothing is lost\n"
    )


def test_summary_is_empty_without_failures(exporters: Callable[..., OtlpMetrics]) -> None:
    """Nothing is said at the end of a run whose exports all arrived."""
    exp = exporters(lambda: [])
    exp.transport.send = FakeSend()  # type: ignore[method-assign]
    exp.export_once()
    assert exp.summary() == ""


def test_a_source_that_raises_is_a_failed_export(exporters: Callable[..., OtlpMetrics]) -> None:
    """A bad read is counted with its type and message; it does not end the exports."""

    def source() -> list[Family]:
        raise ValueError("boom")

    exp = exporters(source, err=io.StringIO())
    assert exp.export_once() is False
    assert (exp.failures, exp.last_error) == (1, "ValueError: boom")


def test_out_of_time_keeps_the_last_reason_without_sending(
    exporters: Callable[..., OtlpMetrics],
) -> None:
    """With the deadline past: the first export still tries (the transport says "no
    time left"); once a reason is known, no request is made and that reason stands."""
    exp = exporters(lambda: [Family("g", "gauge", "1", "", [Point({}, 1)])], err=io.StringIO())
    real = exp.transport.send
    calls: list[float] = []

    def send(body: bytes, timeout: float) -> Sent:
        calls.append(timeout)
        return real(body, timeout)

    exp.transport.send = send  # type: ignore[method-assign]
    assert exp.export_once(time.monotonic() - 1.0) is False
    assert exp.last_error == "no time left" and len(calls) == 1 and calls[0] < 0
    exp.last_error = "HTTP 503 earlier"
    assert exp.export_once(time.monotonic() - 1.0) is False
    assert len(calls) == 1
    assert (exp.failures, exp.last_error) == (2, "HTTP 503 earlier")


def test_export_loop_backs_off_while_failing_and_resets_on_success(
    exporters: Callable[..., OtlpMetrics], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop waits one interval; after a failure, the backoff's delay (from two
    intervals up to MAX_BACKOFF_S); after a success, one interval again."""
    exp = exporters(lambda: [], interval=3.0)
    exp._stop.set()
    exp._thread.join(5)
    made: list[tuple[float, float]] = []
    events: list[str] = []

    class FakeBackoff:
        def __init__(self, base: float, cap: float) -> None:
            made.append((base, cap))
            self.n = 0

        def failed(self) -> float:
            self.n += 1
            events.append("failed")
            return 100.0 + self.n

        def reset(self) -> None:
            self.n = 0
            events.append("reset")

    waits: list[float] = []

    class Stop:
        def wait(self, delay: float) -> bool:
            waits.append(delay)
            return len(waits) > 5

    results = iter([False, False, True, False, True])
    monkeypatch.setattr(otlp_mod, "Backoff", FakeBackoff)
    exp._stop = Stop()  # type: ignore[assignment]
    exp.export_once = lambda deadline=None: next(results)  # type: ignore[method-assign]
    exp._loop()
    exp._stop = threading.Event()
    assert made == [(6.0, 60.0)]
    assert waits == [3.0, 101.0, 102.0, 3.0, 101.0, 3.0]
    assert events == ["failed", "failed", "reset", "failed", "reset"]


def test_close_exports_once_more_by_the_deadline(exporters: Callable[..., OtlpMetrics]) -> None:
    """close() stops the loop, sends the last totals within the deadline (FINAL_FLUSH_S
    from now by default) and closes the transport."""
    state = {"v": 1}
    exp = exporters(lambda: [Family("g", "gauge", "1", "", [Point({}, state["v"])])])
    send = FakeSend()
    exp.transport.send = send  # type: ignore[method-assign]
    closed: list[bool] = []
    exp.transport.close = lambda: closed.append(True)  # type: ignore[method-assign]
    state["v"] = 42
    t0 = time.monotonic()
    exp.close()
    [(body, timeout)] = send.calls
    [req] = _decode([body])
    assert req.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].as_int == 42
    assert otlp_mod.FINAL_FLUSH_S - 1.0 < timeout <= otlp_mod.FINAL_FLUSH_S
    assert time.monotonic() - t0 < 1.5 and closed == [True] and not exp._thread.is_alive()
    later = exporters(lambda: [])
    got: list[float | None] = []

    def record(deadline: float | None = None) -> bool:
        got.append(deadline)
        return True

    later.export_once = record  # type: ignore[method-assign]
    end = time.monotonic() + 5.0
    later.close(end)
    assert got == [end]


def test_close_while_an_export_runs_waits_for_it_instead(
    exporters: Callable[..., OtlpMetrics],
) -> None:
    """An export still under way at close() is the last one: none is started after
    it; its thread gets until the deadline and half a second more."""
    exp = exporters(lambda: [])
    exp._stop.set()
    exp._thread.join(5)
    joins: list[float] = []

    class Busy:
        def join(self, timeout: float) -> None:
            joins.append(timeout)

        def is_alive(self) -> bool:
            return True

    exp._thread = Busy()  # type: ignore[assignment]
    exp.export_once = lambda deadline=None: pytest.fail("exported")  # type: ignore[method-assign]
    exp.close(time.monotonic() + 3.0)
    assert len(joins) == 2
    assert 2.0 < joins[0] <= 3.0 and 2.5 < joins[1] <= 3.5 and joins[1] - joins[0] > 0.45
    exp.close(time.monotonic() - 10.0)
    assert joins[2:] == [0.0, 0.5]
