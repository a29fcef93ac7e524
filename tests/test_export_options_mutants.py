"""Exact checks of the exporters found missing by mutation testing (issue 36, docs/
testing.md): options.py: the export options, their checks and messages, and starting and
finishing the exporters.

Everything runs in this process without a kernel and without gRPC (a fake where its
calls are checked; mutmut forks a process per mutant, which gRPC does not survive)."""

from __future__ import annotations

import argparse
import io
import socket
import sys
import time
import urllib.error
import urllib.request
from typing import Any, ClassVar

import pytest
from export_fakes import free_port

import meridian.export.logs as logs_mod
import meridian.export.otlp as otlp_mod
from meridian.errors import ExtraMissing, UsageError
from meridian.export.exposition import render
from meridian.export.options import Exporters, ExportOptions, add_arguments, exporting, from_args
from meridian.export.prometheus import (
    PrometheusServer,
)
from meridian.export.series import Family, Point

# ---- options.py ---------------------------------------------------------------------


def _parser(logs: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_arguments(p, logs=logs)
    return p


def test_export_options_are_one_group_with_their_help() -> None:
    """The options' names, defaults, choices and help as a user sees them; the logs
    flag only for tools that emit events."""
    p = _parser()
    [group] = [g for g in p._action_groups if g.title == "export"]
    got = [
        (a.option_strings, a.metavar, a.default, a.choices, a.help) for a in group._group_actions
    ]
    assert got == [
        (["--prometheus"], "[HOST]:PORT", None, None, "serve /metrics here (e.g. :9435)"),
        (
            ["--otlp-endpoint"],
            "URL",
            None,
            None,
            "send OTLP metrics here: scheme, host, port (e.g. http://localhost:4317)",
        ),
        (
            ["--otlp-protocol"],
            None,
            "grpc",
            ["grpc", "http/protobuf"],
            "OTLP transport (default grpc)",
        ),
        (["--otlp-header"], "K=V", [], None, "OTLP request header (repeatable)"),
        (
            ["--otlp-interval"],
            "S",
            None,
            None,
            "seconds between OTLP metric exports (default 10)",
        ),
        (
            ["--otlp-logs"],
            None,
            False,
            None,
            "also send each event as an OTLP log record",
        ),
    ]
    a = p.parse_args(["--otlp-header", "a=1", "--otlp-header", "b=2", "--otlp-logs"])
    assert a.otlp_header == ["a=1", "b=2"] and a.otlp_logs is True
    assert not hasattr(_parser(logs=False).parse_args([]), "otlp_logs")
    plain = argparse.ArgumentParser()
    add_arguments(plain)  # by default a tool has no events to send
    assert not hasattr(plain.parse_args([]), "otlp_logs")
    assert ExportOptions() == ExportOptions(None, None, "grpc", {}, 10.0, False)


def test_any_is_true_with_either_exporter() -> None:
    """`any`: a Prometheus address or an OTLP endpoint."""
    assert not ExportOptions().any
    assert ExportOptions(prometheus=("h", 1)).any
    assert ExportOptions(otlp_endpoint="http://h:1").any


def test_from_args_checks_and_fills_every_option() -> None:
    """Every option to its field, the endpoint's port explicit, headers lower-cased,
    the interval a float, the logs flag."""
    port = free_port()
    o = from_args(
        _parser().parse_args(
            [
                *("--prometheus", f"127.0.0.1:{port}", "--otlp-endpoint", "http://127.0.0.1"),
                *("--otlp-protocol", "http/protobuf", "--otlp-header", "A=b"),
                *("--otlp-interval", "0.1", "--otlp-logs"),
            ]
        )
    )
    assert o == ExportOptions(
        ("127.0.0.1", port), "http://127.0.0.1:4318", "http/protobuf", {"a": "b"}, 0.1, True
    )
    o = from_args(_parser(logs=False).parse_args(["--otlp-endpoint", "http://127.0.0.1"]))
    assert o == ExportOptions(None, "http://127.0.0.1:4317", "grpc", {}, 10.0, False)
    o = from_args(
        _parser().parse_args(["--otlp-endpoint", "http://[::1]", "--otlp-interval", "86400"])
    )
    assert o.otlp_interval == 86400.0
    assert from_args(_parser().parse_args([])) == ExportOptions()


RANGE = "--otlp-interval must be from 0.1 to 86400 seconds"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--otlp-interval", "x"], "--otlp-interval must be a number of seconds, got 'x'"),
        (["--otlp-interval", "0.09"], f"{RANGE}, got '0.09'"),
        (["--otlp-interval", "86400.5"], f"{RANGE}, got '86400.5'"),
    ],
)  # fmt: skip
def test_bad_interval_is_one_line(argv: list[str], message: str) -> None:
    """The interval must be a number from 0.1 to 86400 seconds."""
    with pytest.raises(UsageError) as e:
        from_args(_parser().parse_args(["--otlp-endpoint", "http://127.0.0.1", *argv]))
    assert str(e.value) == message


@pytest.mark.parametrize(
    "argv", [["--otlp-logs"], ["--otlp-header", "a=b"], ["--otlp-interval", "5"]]
)
def test_otlp_options_without_an_endpoint_are_refused(argv: list[str]) -> None:
    """Each OTLP option alone says it needs the endpoint."""
    with pytest.raises(UsageError) as e:
        from_args(_parser().parse_args(argv))
    assert str(e.value) == (
        "--otlp-logs, --otlp-header and --otlp-interval need --otlp-endpoint URL"
    )


def test_http_protobuf_does_not_need_grpc(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the gRPC protocol requires the grpc package."""
    monkeypatch.setitem(sys.modules, "grpc", None)
    argv = ["--otlp-endpoint", "http://127.0.0.1", "--otlp-protocol", "http/protobuf"]
    assert from_args(_parser().parse_args(argv)).otlp_endpoint == "http://127.0.0.1:4318"
    with pytest.raises(ExtraMissing) as e:
        from_args(_parser().parse_args(argv[:2]))
    assert (
        str(e.value) == "--otlp-endpoint needs an optional part: pip install 'meridian-ebpf[otlp]'"
    )


def test_prometheus_option_checks_the_address_is_free() -> None:
    """A Prometheus port in use is refused when the options are read."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        with pytest.raises(UsageError) as e:
            from_args(_parser().parse_args(["--prometheus", f"127.0.0.1:{busy}"]))
        assert str(e.value).startswith(f"--prometheus cannot listen on 127.0.0.1:{busy}")


class _FakeExporter:
    """An OtlpMetrics or OtlpLogs that records its arguments and its close."""

    made: ClassVar[list[_FakeExporter]] = []

    def __init__(self, *args: Any, **kw: Any) -> None:
        self.args, self.kw = args, kw
        self.closed: list[float | None] = []
        self.line = ""
        _FakeExporter.made.append(self)

    def close(self, deadline: float | None = None) -> None:
        self.closed.append(deadline)

    def summary(self) -> str:
        return self.line

    def lost(self) -> dict[str, int]:
        return {"otlp_logs_unsent": 3}


def test_finish_closes_both_exporters_by_one_deadline_once() -> None:
    """Metrics first then logs, both by the same deadline FINAL_FLUSH_S from now; each
    non-empty summary one line on the error stream; the logs' losses returned, again
    (without closing again) on a second call."""
    ex = Exporters()
    assert (ex.prometheus, ex.otlp, ex.logs, ex.err) == (None, None, None, sys.stderr)
    assert ex.finish() == {}
    assert ex.finish() == {}
    ex = Exporters()
    metrics, logs = _FakeExporter(), _FakeExporter()
    metrics.line, logs.line = "m line", ""
    ex.otlp, ex.logs = metrics, logs  # type: ignore[assignment]
    ex.err = io.StringIO()
    t0 = time.monotonic()
    assert ex.finish() == {"otlp_logs_unsent": 3}
    [deadline] = metrics.closed
    assert logs.closed == [deadline]
    assert deadline is not None and 1.5 < deadline - t0 <= otlp_mod.FINAL_FLUSH_S + 0.1
    assert ex.err.getvalue() == "m line\n"
    logs.line = "l line"
    assert ex.finish() == {"otlp_logs_unsent": 3}
    assert len(metrics.closed) == 1 and ex.err.getvalue() == "m line\n"
    ex = Exporters()
    ex.logs, ex.err = logs, io.StringIO()  # type: ignore[assignment]
    assert ex.finish() == {"otlp_logs_unsent": 3}
    assert ex.err.getvalue() == "l line\n"


def test_exporting_without_options_starts_nothing() -> None:
    """No options: no exporter, and nothing to finish."""
    with exporting(None, lambda: [], "tt") as ex:
        assert (ex.prometheus, ex.otlp, ex.logs) == (None, None, None)


def test_exporting_starts_what_the_options_ask_and_finishes_on_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OTLP metrics with every option, logs only with --otlp-logs, the tool's error
    stream; the final flush runs even when the block raises."""
    monkeypatch.setattr(otlp_mod, "OtlpMetrics", _FakeExporter)
    monkeypatch.setattr(logs_mod, "OtlpLogs", _FakeExporter)
    _FakeExporter.made = []
    err = io.StringIO()

    def source() -> list[Family]:
        return []

    opts = ExportOptions(None, "http://h:1", "http/protobuf", {"a": "b"}, 2.5, True)
    with pytest.raises(RuntimeError), exporting(opts, source, "tt", err) as ex:
        assert ex.err is err and ex.prometheus is None
        raise RuntimeError("tool failed")
    metrics, logs = _FakeExporter.made
    started: tuple[object, object] = (ex.otlp, ex.logs)
    assert started == (metrics, logs)
    assert metrics.args == (source, "tt", "http://h:1", "http/protobuf", {"a": "b"}, 2.5, err)
    assert logs.args == ("tt", "http://h:1", "http/protobuf", {"a": "b"})
    assert logs.kw == {"err": err}
    assert len(metrics.closed) == 1 and len(logs.closed) == 1
    _FakeExporter.made = []
    with exporting(ExportOptions(otlp_endpoint="http://h:1"), source, "tt") as ex:
        assert ex.err is sys.stderr
    [metrics] = _FakeExporter.made
    assert ex.logs is None and metrics.closed and metrics.args[3:6] == ("grpc", {}, 10.0)


def test_exporting_serves_prometheus_during_the_block_only() -> None:
    """The fast server reads the source during the block and is closed after it."""
    fams = [Family("g", "gauge", "1", "", [Point({}, 3)])]
    opts = ExportOptions(prometheus=("127.0.0.1", free_port()))
    with exporting(opts, lambda: fams, "tt") as ex:
        assert ex.prometheus is not None and ex.otlp is None
        url = f"http://127.0.0.1:{ex.prometheus.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.read().decode() == render(fams)
    assert not ex.prometheus.thread.is_alive()


@pytest.mark.parametrize(
    ("module", "argv", "message"),
    [
        (
            "prometheus_client",
            ["--prometheus", ":0"],
            "--prometheus needs an optional part: pip install 'meridian-ebpf[prometheus]'",
        ),
        (
            "opentelemetry.proto",
            ["--otlp-endpoint", "http://127.0.0.1"],
            "--otlp-endpoint needs an optional part: pip install 'meridian-ebpf[otlp]'",
        ),
    ],
)
def test_a_missing_extra_names_the_option_that_needs_it(
    monkeypatch: pytest.MonkeyPatch, module: str, argv: list[str], message: str
) -> None:
    """The one-line error says which option wants the missing part."""
    monkeypatch.setitem(sys.modules, module, None)
    if module == "prometheus_client":
        argv = ["--prometheus", f"127.0.0.1:{free_port()}"]
    with pytest.raises(ExtraMissing) as e:
        from_args(_parser().parse_args(argv))
    assert str(e.value) == message


def test_client_server_negotiates_openmetrics_on_the_asked_address() -> None:
    """Without `fast`, prometheus_client serves (sentinel's OpenMetrics when the
    scraper asks for it), on the host given, from a daemon thread named prometheus."""
    fams = [Family("g", "gauge", "1", "", [Point({}, 3)])]
    server = PrometheusServer(lambda: fams, ("127.0.0.1", 0))
    try:
        assert server.server.server_address[0] == "127.0.0.1"
        url = f"http://127.0.0.1:{server.port}/metrics"
        accept = "application/openmetrics-text; version=1.0.0; charset=utf-8"
        req = urllib.request.Request(url, headers={"Accept": accept})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.headers["Content-Type"].startswith("application/openmetrics-text")
            assert (
                r.read().decode() == "# HELP g_ratio \n# TYPE g_ratio gauge\ng_ratio 3.0\n# EOF\n"
            )
    finally:
        server.close()
    fast = PrometheusServer(lambda: fams, ("127.0.0.1", 0), fast=True)
    try:
        assert (fast.thread.name, fast.thread.daemon) == ("prometheus", True)
    finally:
        fast.close()


def test_client_server_errors_name_the_option(monkeypatch: pytest.MonkeyPatch) -> None:
    """A port in use, or prometheus_client missing, is a one-line error."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        with pytest.raises(UsageError) as e:
            PrometheusServer(lambda: [], ("127.0.0.1", busy))
        assert str(e.value) == (
            f"--prometheus cannot listen on 127.0.0.1:{busy}: Address already in use"
        )
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ExtraMissing) as e2:
        PrometheusServer(lambda: [], ("127.0.0.1", 0))
    assert str(e2.value) == (
        "--prometheus needs an optional part: pip install 'meridian-ebpf[prometheus]'"
    )
