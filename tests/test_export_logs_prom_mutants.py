"""Exact checks of the exporters found missing by mutation testing (issue 36, docs/
testing.md): logs.py and prometheus.py: the OTLP log queue and its accounting, and the
/metrics servers.

Everything runs in this process without a kernel and without gRPC (a fake where its
calls are checked; mutmut forks a process per mutant, which gRPC does not survive)."""

from __future__ import annotations

import gzip
import io
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from export_fakes import FakeSend, free_port, wait_for
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from otlp_receiver import attrs as kv_attrs

import meridian.export.prometheus as prometheus_mod
from meridian import __version__
from meridian.errors import UsageError
from meridian.export.exposition import render
from meridian.export.logs import OtlpLogs, _rejected
from meridian.export.otlp import resource_attrs
from meridian.export.prometheus import (
    PrometheusServer,
    _family,
    check_listen,
    parse_listen,
)
from meridian.export.series import Family, Point
from meridian.export.transport import Sent

# ---- logs.py ------------------------------------------------------------------------


def test_rejected_reads_partial_success_and_ignores_anything_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The count a collector refused, from its response; 0 for no body, a body that is
    not a response, or without the protobuf messages installed."""
    resp = ExportLogsServiceResponse()
    resp.partial_success.rejected_log_records = 5
    assert _rejected(resp.SerializeToString()) == 5
    assert _rejected(b"") == 0
    assert _rejected(b"\xff\xff\xff") == 0
    monkeypatch.setitem(sys.modules, "opentelemetry.proto.collector.logs.v1.logs_service_pb2", None)
    assert _rejected(resp.SerializeToString()) == 0


@pytest.fixture
def otlp_logs() -> Iterator[Callable[..., tuple[OtlpLogs, FakeSend]]]:
    """OtlpLogs whose transport is a FakeSend; closed at the end."""
    made: list[OtlpLogs] = []

    def make(*answers: Sent, gate: threading.Event | None = None, **kw: Any) -> Any:
        kw.setdefault("err", io.StringIO())
        lg = OtlpLogs("tt", "http://127.0.0.1:9", **kw)
        send = FakeSend(*answers, gate=gate)
        lg.transport.send = send  # type: ignore[method-assign]
        made.append(lg)
        return lg, send

    yield make
    for lg in made:
        if lg._thread.is_alive():
            lg.close(time.monotonic() + 1.0)


def _emit(lg: OtlpLogs, n: int, start: int = 0) -> None:
    bodies = [f"r{i}".encode() for i in range(start, start + n)]
    lg.emit(bodies, np.arange(start, start + n, dtype=np.uint64), [("i", np.arange(n) + start)])


def test_logs_are_sent_with_the_tools_resource_and_counted(
    otlp_logs: Callable[..., tuple[OtlpLogs, FakeSend]],
) -> None:
    """Records reach the transport in one request (10 s per attempt), under the tool's
    resource and scope; `sent` counts them, nothing is lost, nothing is said."""
    lg, send = otlp_logs()
    lg.emit([], np.zeros(0, np.uint64), [])
    assert lg.emitted == 0
    _emit(lg, 3)
    assert wait_for(lambda: lg.sent == 3)
    lg.close()
    [(body, timeout)] = send.calls
    assert timeout == 10.0
    [rl] = ExportLogsServiceRequest.FromString(body).resource_logs
    assert kv_attrs(rl.resource.attributes) == resource_attrs("tt")
    [sl] = rl.scope_logs
    assert (sl.scope.name, sl.scope.version) == ("meridian.tt", __version__)
    assert [r.body.string_value for r in sl.log_records] == ["r0", "r1", "r2"]
    assert {r.event_name for r in sl.log_records} == {"meridian.tt"}
    assert (lg.emitted, lg.sent, lg.failures) == (3, 3, 0)
    assert lg.lost() == {"otlp_logs_dropped": 0, "otlp_logs_rejected": 0, "otlp_logs_unsent": 0}
    assert lg.summary() == ""
    custom, send2 = otlp_logs(resource={"r": 1})
    _emit(custom, 1)
    assert wait_for(lambda: custom.sent == 1)
    res = ExportLogsServiceRequest.FromString(send2.calls[0][0]).resource_logs[0].resource
    assert kv_attrs(res.attributes) == {"r": 1}


def test_records_refused_in_part_or_whole_are_counted_rejected(
    otlp_logs: Callable[..., tuple[OtlpLogs, FakeSend]],
) -> None:
    """partial_success counts as rejected (at most the request's records); a refusal
    for good (not retryable) rejects the request's records, is said once, and the
    next request is sent."""
    part = ExportLogsServiceResponse()
    part.partial_success.rejected_log_records = 2
    every = ExportLogsServiceResponse()
    every.partial_success.rejected_log_records = 50
    err = io.StringIO()
    lg, send = otlp_logs(
        Sent(True, response=part.SerializeToString()),
        Sent(True, response=every.SerializeToString()),
        Sent(False, False, "HTTP 400 Bad Request"),
        Sent(False, False, "HTTP 400 again"),
        Sent(True),
        err=err,
    )
    for k in range(5):
        _emit(lg, 5, 5 * k)
        assert wait_for(lambda k=k: len(send.calls) == k + 1)  # type: ignore[misc]
    assert wait_for(lambda: lg.sent == 8)
    assert (lg.sent, lg.rejected, lg.failures, lg.last_error) == (8, 17, 2, "HTTP 400 again")
    lg.close()
    assert lg.lost() == {"otlp_logs_dropped": 0, "otlp_logs_rejected": 17, "otlp_logs_unsent": 0}
    assert err.getvalue() == (
        "meridian: OTLP logs export to http://127.0.0.1:9 (grpc) failed (HTTP 400 Bad "
        "Request); retrying with backoff, records wait in a bounded queue\n"
    )
    assert lg.summary() == (
        "meridian: 17 of 25 OTLP log records were not delivered (0 dropped with the queue "
        "full, 17 rejected, 0 unsent at the end; last error: HTTP 400 again)"
    )


def test_a_retryable_failure_sends_the_same_request_again(
    otlp_logs: Callable[..., tuple[OtlpLogs, FakeSend]],
) -> None:
    """The request stays at the head of the queue and goes again after the backoff."""
    lg, send = otlp_logs(Sent(False, True, "HTTP 503 x"), Sent(True))
    _emit(lg, 4)
    assert wait_for(lambda: lg.sent == 4)
    assert len(send.calls) == 2 and send.calls[0][0] == send.calls[1][0]
    assert (lg.failures, lg.rejected, lg.last_error) == (1, 0, "HTTP 503 x")
    assert lg._backoff.failures == 0  # reset by the success


def test_a_full_queue_drops_new_records_and_counts_them(
    otlp_logs: Callable[..., tuple[OtlpLogs, FakeSend]],
) -> None:
    """Records that fit in the room left are queued (exactly filling it too); a batch
    that does not fit is dropped whole, not encoded."""
    gate = threading.Event()
    lg, _ = otlp_logs(gate=gate, max_queue=5)
    _emit(lg, 3)
    assert wait_for(lambda: lg._queued == 3)
    _emit(lg, 2, 3)
    assert lg._queued == 5
    _emit(lg, 1, 5)
    assert (lg.emitted, lg.dropped, lg._queued) == (6, 1, 5)
    gate.set()
    assert wait_for(lambda: lg.sent == 5)
    lg.close()
    assert lg.lost() == {"otlp_logs_dropped": 1, "otlp_logs_rejected": 0, "otlp_logs_unsent": 0}
    assert lg.summary() == (
        "meridian: 1 of 6 OTLP log records were not delivered (1 dropped with the queue "
        "full, 0 rejected, 0 unsent at the end)"
    )


def test_close_retries_until_the_deadline_then_counts_the_rest_unsent(
    otlp_logs: Callable[..., tuple[OtlpLogs, FakeSend]],
) -> None:
    """While closing, a retryable failure is tried again every 0.2 s or so (not after
    the backoff) within the time left; what is still queued at the deadline is
    unsent, and the queue is emptied."""
    lg, send = otlp_logs(Sent(False, True, "gRPC UNAVAILABLE: down"))
    _emit(lg, 3)
    assert wait_for(lambda: len(send.calls) == 1)
    t0 = time.monotonic()
    lg.close(t0 + 0.7)
    took = time.monotonic() - t0
    assert 0.6 < took < 1.3, took
    later = [t for _, t in send.calls[1:]]
    assert len(later) >= 3 and all(0 < t <= 0.7 for t in later)
    assert (lg.unsent, lg._queued, len(lg._queue), lg.sent) == (3, 0, 0, 0)
    assert lg.summary() == (
        "meridian: 3 of 3 OTLP log records were not delivered (0 dropped with the queue "
        "full, 0 rejected, 3 unsent at the end; last error: gRPC UNAVAILABLE: down)"
    )


def test_close_by_default_gives_the_queue_two_seconds(
    otlp_logs: Callable[..., tuple[OtlpLogs, FakeSend]],
) -> None:
    """Without a deadline, close() keeps trying for 2 s (and the join for 0.5 s
    more at most), then counts the records unsent."""
    lg, send = otlp_logs(Sent(False, True, "down"))
    _emit(lg, 2)
    assert wait_for(lambda: len(send.calls) == 1)
    t0 = time.monotonic()
    lg.close()
    took = time.monotonic() - t0
    assert 1.9 < took < 2.9, took
    assert lg.unsent == 2


def test_close_waits_for_a_stuck_send_only_half_a_second_past_the_deadline(
    otlp_logs: Callable[..., tuple[OtlpLogs, FakeSend]],
) -> None:
    """A send that does not return: close() gives up 0.5 s after the deadline and
    counts the records unsent; the attempt ending later sends nothing more."""
    gate = threading.Event()
    lg, send = otlp_logs(Sent(False, True, "down"), gate=gate)
    _emit(lg, 2)
    assert wait_for(lambda: lg._queued == 2)
    t0 = time.monotonic()
    lg.close(t0 + 0.3)
    took = time.monotonic() - t0
    gate.set()  # the one attempt under way ends after the deadline
    lg._thread.join(5)
    assert 0.7 < took < 1.25, took
    assert len(send.calls) == 1 and not lg._thread.is_alive()
    assert lg.unsent == 2


def test_close_with_nothing_queued_returns_at_once(
    otlp_logs: Callable[..., tuple[OtlpLogs, FakeSend]],
) -> None:
    """An idle sender is woken and ends: close() does not wait for the deadline."""
    lg, send = otlp_logs()
    assert (lg._thread.name, lg._thread.daemon) == ("otlp-logs", True)
    t0 = time.monotonic()
    lg.close(t0 + 5.0)
    assert time.monotonic() - t0 < 1.0 and not lg._thread.is_alive()
    assert send.calls == [] and lg.lost() == {
        "otlp_logs_dropped": 0,
        "otlp_logs_rejected": 0,
        "otlp_logs_unsent": 0,
    }


# ---- prometheus.py ------------------------------------------------------------------


def test_parse_listen_takes_host_and_port_or_a_bare_port() -> None:
    """No host means every address; IPv6 in brackets; the port from 1 (0 only where a
    free port is asked for) to 65535."""
    assert parse_listen(":9435") == ("0.0.0.0", 9435)
    assert parse_listen("9435") == ("0.0.0.0", 9435)
    assert parse_listen("[::1]:1") == ("::1", 1)
    assert parse_listen("h:65535") == ("h", 65535)
    assert parse_listen("h:0", any_port=True) == ("h", 0)
    assert parse_listen("Xeon:80") == ("Xeon", 80)  # only the brackets are stripped
    with pytest.raises(UsageError, match=r"port from 1 to 65535, got ':0'"):
        parse_listen(":0")
    for bad, low in ((":0", 1), (":65536", 1), ("h:", 1), ("h:x", 1), (":-1", 0)):
        with pytest.raises(UsageError) as e:
            parse_listen(bad, "--api", any_port=low == 0)
        assert str(e.value) == (
            f"--api takes [HOST]:PORT with a port from {low} to 65535, got {bad!r}"
        )
    with pytest.raises(UsageError, match=r"^--prometheus takes"):
        parse_listen("x")


def test_bind_error_without_an_errno_says_the_exception() -> None:
    """An OSError without strerror (raised by hand, not by the kernel) is still said."""
    err = prometheus_mod._bind_error("--x", ("h", 1), OSError("odd"), "; hint")
    assert str(err) == "--x cannot listen on h:1: odd; hint"


def test_family_is_ipv6_for_an_ipv6_host() -> None:
    """The server listens with the host's address family."""
    assert _family(("127.0.0.1", 0)) == socket.AF_INET
    assert _family(("::1", 0)) == socket.AF_INET6


def test_a_port_in_use_is_said_with_what_to_do() -> None:
    """check_listen binds once and lets go (a free port passes and stays free); a
    port in use is one line naming the option, the address and the fix."""
    port = free_port()
    check_listen(("127.0.0.1", port))
    check_listen(("127.0.0.1", port))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        with pytest.raises(UsageError) as e:
            check_listen(("127.0.0.1", busy), "--api")
        assert str(e.value) == (
            f"--api cannot listen on 127.0.0.1:{busy}: Address already in use; "
            "choose another [HOST]:PORT (e.g. :9436)"
        )
        with pytest.raises(UsageError) as e:
            PrometheusServer(lambda: [], ("127.0.0.1", busy), fast=True)
        assert str(e.value) == (
            f"--prometheus cannot listen on 127.0.0.1:{busy}: Address already in use"
        )


def test_fast_server_answers_metrics_and_root_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """/metrics and / (with a query or not) serve the text with its type and length;
    gzip when asked; other paths 404; a source that fails is a 500 for that scrape."""
    fams = [Family("g", "gauge", "1", "d", [Point({"a": 1}, 2)])]
    state = {"fail": False}

    def source() -> list[Family]:
        if state["fail"]:
            raise ValueError("boom")
        return fams

    server = PrometheusServer(source, ("127.0.0.1", 0), fast=True)
    try:
        base = f"http://127.0.0.1:{server.port}"
        for path in ("/metrics", "/", "/metrics?x=1", "/?a=1?b"):
            with urllib.request.urlopen(base + path, timeout=10) as r:
                body = r.read()
                assert r.status == 200 and body.decode() == render(fams)
                assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
                assert r.headers["Content-Length"] == str(len(body))
                assert r.headers["Content-Encoding"] is None
        req = urllib.request.Request(base, headers={"Accept-Encoding": "br, gzip"})
        with urllib.request.urlopen(req, timeout=10) as r:
            zipped = r.read()
            assert r.headers["Content-Encoding"] == "gzip"
            assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            assert r.headers["Content-Length"] == str(len(zipped))
            assert gzip.decompress(zipped).decode() == render(fams)
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
            raw.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")  # no Accept-Encoding at all
            answer = b"".join(iter(lambda: raw.recv(65536), b""))
        assert answer.startswith(b"HTTP/1.0 200 OK\r\n")
        assert answer.endswith(b"\r\n\r\n" + render(fams).encode())
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(base + "/other", timeout=10)
        e.value.close()
        assert e.value.code == 404
        state["fail"] = True
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(base + "/metrics", timeout=10)
        e.value.close()
        assert (e.value.code, e.value.reason) == (500, "ValueError: boom")
    finally:
        server.close()
    assert not server.thread.is_alive()
    with socket.socket() as s:  # closed: nothing listens there any more
        assert s.connect_ex(("127.0.0.1", server.port)) != 0
