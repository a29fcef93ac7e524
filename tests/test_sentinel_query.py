"""`meridian sentinel query` and its flame graph: a store filled through the agent's own
writer (BatchingSink) with rollups whose answer is known (two agent runs, so ids
interned per run must be joined per run and merged by name), then the queries' exact
numbers and order, the command line's output and one-line errors, the same on
Debian's clickhouse-server, and the SVG's structure and rendering in Chromium."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import time
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from clickhouse_server import PASSWORD, ClickHouseServer, free_port, running_server
from conftest import pin_query_clock

from meridian.errors import UsageError
from meridian.tools.sentinel.model.flows import FlowKey
from meridian.tools.sentinel.model.rollup import ROLLUP_DTYPE, UNRESOLVED
from meridian.tools.sentinel.pipeline.resolver import UNRESOLVED_LABEL
from meridian.tools.sentinel.query.cli import add_query_parser, run_query
from meridian.tools.sentinel.query.flamegraph import CHAR_WIDTH, PAD, ROW, colour, render
from meridian.tools.sentinel.query.store import flow_detail, fmt_duration, parse_since, top_flows
from meridian.tools.sentinel.storage import Backend, BatchingSink, ChdbBackend, HttpBackend
from meridian.tools.sentinel.storage.chdb_backend import LOCK_NAME
from meridian.tools.sentinel.storage.lockfile import take
from meridian.tools.sentinel.symbols.symbolizer import Frame

A = FlowKey("10.0.0.1", "10.0.0.2", 5201, 43012, "tcp")
B = FlowKey("fd00::1", "fd00::2", 443, 50000, "udp")
C = 0x1234567890ABCDEF  # a flow the store never named
CPU, LLC = 6, 2  # events cpu-clock, llc-misses
T = int(time.time()) // 10 * 10  # bucket times, multiples of 10 s (the 10m timeline's step)


@pytest.fixture(autouse=True)
def now_is_t(monkeypatch: pytest.MonkeyPatch) -> None:
    pin_query_clock(monkeypatch, T + 5)


SRV, LIBC = "/usr/bin/srv", "/usr/lib/libc.so.6"
MEMCPY = Frame(LIBC, "memcpy", "", 0, 0x7F00, 0x10)
HANDLE = Frame(SRV, "handle", "srv.c", 42, 0x4020, 0x20)
MAIN = Frame(SRV, "main", "srv.c", 7, 0x4100, 0x8)


# what each agent run wrote: its id, names (function and stack ids are interned per run)
# and rollups (time s, flow, function, stack, event, samples, cost)
Stacks = list[tuple[int, tuple[Frame, ...]]]
Rollups = list[tuple[int, int, int, int, int, int, float]]
RUNS: list[tuple[int, list[FlowKey], list[tuple[int, str, str]], Stacks, Rollups]] = [
    (
        1,
        [A, B],
        [(1, SRV, "handle"), (2, LIBC, "memcpy")],
        [(1, (MEMCPY, HANDLE, MAIN)), (2, (HANDLE, MAIN))],
        [
            (T - 30, A.flow_id, 1, 2, CPU, 4, 8.0),
            (T - 30, A.flow_id, 2, 1, CPU, 2, 4.0),
            (T - 20, A.flow_id, 2, 1, LLC, 3, 6.0),
            (T - 20, B.flow_id, 1, 2, CPU, 5, 2.5),
            (T - 20, 0, 1, 2, CPU, 100, 100.0),  # on no flow: never listed
            (T - 7200, B.flow_id, 1, 2, CPU, 50, 1000.0),  # 2 h ago
        ],
    ),
    (
        2,  # other ids for the same memcpy, handle and stack
        [A],
        [(1, LIBC, "memcpy"), (5, SRV, "handle")],
        [(4, (MEMCPY, HANDLE, MAIN))],
        [
            (T - 10, A.flow_id, 1, 4, CPU, 1, 2.0),
            (T - 10, A.flow_id, UNRESOLVED, UNRESOLVED, CPU, 1, 0.5),
            (T - 10, C, 5, 4, CPU, 2, 3.0),
        ],
    ),
]


def fill(make_backend: Callable[[], Backend], spool: Path) -> None:
    """Every run's rows through a BatchingSink of its own, as the agent writes them."""
    for run_id, keys, functions, stacks, rollups in RUNS:
        sink = BatchingSink(make_backend(), spool_dir=str(spool / str(run_id)), run_id=run_id)
        try:
            named = [(k.flow_id, k.src, k.dst, k.sport, k.dport, str(k.proto)) for k in keys]
            sink.write_flows(named)
            sink.write_functions(functions)
            sink.write_stacks(stacks)
            rows = np.zeros(len(rollups), dtype=ROLLUP_DTYPE)
            names = ("time_bucket", "flow_id", "function_id", "callstack_id", "event")
            cols = zip(*rollups, strict=True)
            for name, col in zip((*names, "samples", "norm_cost"), cols, strict=True):
                rows[name] = col
            rows["time_bucket"] *= 10**9
            sink.write_rollups(rows)
            assert sink.flush(timeout=60), sink.stats()
            assert sink.stats().dropped_rows == 0
        finally:
            sink.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("chdb", reason="chDB is not installed (pip install chdb)")
    root = tmp_path_factory.mktemp("query")
    fill(lambda: ChdbBackend(root / "store"), root / "spool")
    return root / "store"


@pytest.fixture
def db(store: Path) -> Iterator[ChdbBackend]:
    backend = ChdbBackend(store)
    backend.open()
    yield backend
    backend.close()


def hexid(flow: FlowKey | int) -> str:
    return f"{flow if isinstance(flow, int) else flow.flow_id:016x}"


TOP_10M = [(hexid(A), 11, 20.5), (hexid(C), 2, 3.0), (hexid(B), 5, 2.5)]
TOP_3H = [(hexid(B), 55, 1002.5), *TOP_10M[:2]]
MEMCPY_STACK = ("memcpy+0x10 (libc.so.6)", "handle+0x20 (srv) srv.c:42", "main+0x8 (srv) srv.c:7")


def top(rows: list[Any]) -> list[tuple[str, int, float]]:
    return [(r.flow, r.samples, r.norm_cost) for r in rows]


def check_flow_a(backend: Backend) -> None:
    """Flow A's detail: memcpy and handle had other ids in run 2, still one row each."""
    d = flow_detail(backend, hexid(A), 600)
    assert (d.flow.label, d.flow.samples, d.flow.norm_cost, d.step_s) == (str(A), 11, 20.5, 10)
    assert [(f.function, f.binary, f.samples, f.norm_cost) for f in d.functions] == [
        ("memcpy", LIBC, 6, 12.0),
        ("handle", SRV, 4, 8.0),
        (UNRESOLVED_LABEL, "", 1, 0.5),
    ]
    assert [(s.frames, s.samples, s.norm_cost) for s in d.stacks] == [
        (MEMCPY_STACK, 6, 12.0),
        (MEMCPY_STACK[1:], 4, 8.0),
        ((UNRESOLVED_LABEL,), 1, 0.5),
    ]
    assert d.flame_stacks() == [
        (["main", "handle", "memcpy"], 12.0),
        (["main", "handle"], 8.0),
        ([UNRESOLVED_LABEL], 0.5),
    ]
    assert [(b.time_ns // 10**9, b.event, b.samples, b.norm_cost) for b in d.timeline] == [
        (T - 30, "cpu-clock", 6, 12.0),
        (T - 20, "llc-misses", 3, 6.0),
        (T - 10, "cpu-clock", 2, 2.5),
    ]


def test_top_flows_exact(db: ChdbBackend) -> None:
    assert top(top_flows(db, parse_since("10m"))) == TOP_10M
    assert top(top_flows(db, parse_since("3h"))) == TOP_3H
    assert top(top_flows(db, 600, event="llc-misses")) == [(hexid(A), 3, 6.0)]
    assert top(top_flows(db, 600, event="cache-misses", limit=1)) == [(hexid(A), 3, 6.0)]
    assert top(top_flows(db, 600, limit=1)) == TOP_10M[:1]
    assert top_flows(db, 600, event="hitm") == []
    a, c, b = top_flows(db, 600)
    assert a.as_json() == {
        **{"flow": hexid(A), "src": "10.0.0.1", "dst": "10.0.0.2", "sport": 5201, "dport": 43012},
        **{"proto": "tcp", "samples": 11, "norm_cost": 20.5},
    }
    assert (b.label, c.label, c.src, c.sport) == (
        "[fd00::1]:443 -> [fd00::2]:50000 udp", hexid(C), None, None
    )  # fmt: skip


def test_flow_detail_exact(db: ChdbBackend) -> None:
    check_flow_a(db)
    # a wider range, a coarser step: the three buckets of the last minute add up
    wide = flow_detail(db, A.flow_id, parse_since("1h"))
    assert wide.step_s == 60 and sum(b.samples for b in wide.timeline) == 11
    with pytest.raises(UsageError, match="flow 00000000deadbeef is not in the store"):
        flow_detail(db, "00000000deadbeef", 600)
    last = r"no samples in the last 5s; its last were (\d+[hms])+ ago \(try --since \d+[hm]"
    with pytest.raises(UsageError, match=last):
        flow_detail(db, B.flow_id, 5)
    for bad in ("12345", "zz00000000000000", "0000000000000000"):
        with pytest.raises(UsageError, match="FLOW"):
            flow_detail(db, bad, 600)


def test_durations_in_messages_drop_zero_parts() -> None:
    # the flow detail test's "its last were ... ago" hit a whole 6 minutes once in CI
    assert [fmt_duration(s) for s in (45, 1.5, 360, 361, 5400, 3600)] == [
        "45s", "1.5s", "6m", "6m1s", "1h30m", "1h"
    ]  # fmt: skip


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """run_query on a parser of our own (the sentinel command hooks it in the same way)."""
    p = argparse.ArgumentParser(prog="meridian sentinel")
    add_query_parser(p.add_subparsers(dest="command"))
    args = p.parse_args(["query", *argv])
    assert args.func is run_query
    code = run_query(args)
    return code, *capsys.readouterr()


def test_cli_top_flows_table_and_json(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "top-flows", "--data-dir", str(store))
    assert (code, err) == (0, "")
    head, columns, *rows = out.splitlines()
    assert head == "top flows by norm cost, last 10m, all events"
    assert columns.split() == ["FLOW", "ID", "FLOW", "SAMPLES", "NORM", "COST"]
    start = columns.index("FLOW", 4)  # the 5-tuples line up under their header
    assert [r[start:].split("  ")[0] for r in rows] == [str(A), "(5-tuple not stored)", str(B)]
    assert [(r.split()[0], int(r.split()[-2]), float(r.split()[-1])) for r in rows] == TOP_10M

    code, out, err = cli(capsys, "top-flows", "--data-dir", str(store), "--since", "3h", "--json")
    assert (code, err) == (0, "")
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(x["flow"], x["samples"], x["norm_cost"]) for x in lines] == TOP_3H
    assert (lines[0]["src"], lines[0]["sport"], lines[0]["proto"]) == ("fd00::1", 443, "udp")


def test_cli_flow_text_json_flamegraph(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(capsys, "flow", hexid(A), "--data-dir", str(store))
    assert (code, err) == (0, "")
    assert out.startswith(f"flow {hexid(A)} {A}: 11 samples, norm cost 20.5 in the last 10m\n")
    assert re.search(r"(?m)^58\.5%\s+6\s+12\.0\s+memcpy$", out)
    assert "  #1 58.5%, 6 samples, norm cost 12.0\n      memcpy+0x10 (libc.so.6)\n" in out
    assert "events over time (every 10s)" in out

    svg = tmp_path / "a.svg"
    code, out, err = cli(
        capsys, "flow", hexid(A), "--data-dir", str(store), "--json", "--flamegraph", str(svg)
    )
    assert code == 0 and err == f"flame graph of 3 stacks written to {svg}\n"
    lines = [json.loads(line) for line in out.splitlines()]
    kinds = [x["type"] for x in lines]
    assert kinds == ["flow", *["function"] * 3, *["stack"] * 3, *["bucket"] * 3]
    assert (lines[0]["flow"], lines[0]["norm_cost"], lines[4]["frames"]) == (
        hexid(A), 20.5, list(MEMCPY_STACK)
    )  # fmt: skip
    assert lines[1] == {**lines[1], "function": "memcpy", "binary": LIBC, "samples": 6}
    widths = {g.get("data-n"): float(frame_rect(g)["data-w"]) for g in frames(svg.read_text())}
    assert widths["main"] / widths["all"] == pytest.approx(20.0 / 20.5, abs=1e-3)


def one_line_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, out, err = cli(capsys, *argv)
    assert (code, out) == (2, ""), err
    assert err.count("\n") == 1 and err.startswith("meridian sentinel query: error: ")
    return err


def test_cli_bad_input_is_one_line(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = ["--data-dir", str(store)]
    assert "--since: expected" in one_line_error(capsys, "top-flows", *d, "--since", "10x")
    assert "above zero" in one_line_error(capsys, "top-flows", *d, "--since", "0")
    assert "--event: unknown event" in one_line_error(capsys, "top-flows", *d, "--event", "nope")
    assert "16 hex digits" in one_line_error(capsys, "flow", "abc", *d)
    assert "is not in the store" in one_line_error(capsys, "flow", "00000000deadbeef", *d)
    missing = tmp_path / "none"
    err = one_line_error(capsys, "top-flows", "--data-dir", str(missing))
    assert f"no sentinel store at {missing}" in err and not missing.exists()  # nothing made
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    err = one_line_error(capsys, "top-flows", "--clickhouse-url", url)
    assert f"ClickHouse at {url} is unreachable" in err
    svg = tmp_path / "no" / "dir" / "x.svg"
    err = one_line_error(capsys, "flow", hexid(A), *d, "--flamegraph", str(svg))
    assert "--flamegraph: cannot write" in err
    # the store held, as a running agent holds it: its pid, and what to do instead
    fd = take(store / LOCK_NAME)
    try:
        err = one_line_error(capsys, "top-flows", *d)
    finally:
        os.close(fd)
    assert f"held by a running agent (pid {os.getpid()})" in err
    assert "--api-port" in err and "--clickhouse-url" in err


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ClickHouseServer]:
    yield from running_server(tmp_path / "clickhouse")


def test_remote_server(
    server: ClickHouseServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same rows on Debian's clickhouse-server (18.16): the same answers."""
    pw = tmp_path / "pw"
    pw.write_text(PASSWORD + "\n")
    fill(lambda: HttpBackend(server.url, "writer", str(pw)), tmp_path / "spool")
    remote = ["--clickhouse-url", server.url, "--clickhouse-user", "writer"]
    code, out, err = cli(capsys, "top-flows", *remote, "--clickhouse-password-file", str(pw))
    assert (code, err) == (0, "")
    rows = [r.split() for r in out.splitlines()[2:]]
    assert [(r[0], int(r[-2]), float(r[-1])) for r in rows] == TOP_10M
    check_flow_a(HttpBackend(server.url, "writer", str(pw)))
    code, out, err = cli(capsys, "top-flows", "--clickhouse-url", server.url)
    assert code == 2 and "refused user 'default'" in err


# -- flame graph -------------------------------------------------------------------

SVG = "{http://www.w3.org/2000/svg}"


def frames(svg: str) -> list[ET.Element]:
    return [g for g in ET.fromstring(svg).iter(f"{SVG}g") if g.get("class") == "f"]


def frame_rect(g: ET.Element) -> dict[str, str]:
    rect = g.find(f"{SVG}rect")
    assert rect is not None
    return dict(rect.attrib)


def test_flamegraph_structure() -> None:
    d = "d_" + "with_a_long_name_" * 10
    stacks = [(["main", "a", "b"], 3.0), (["main", "a", "c"], 1.0), (["main", d], 4.0)]
    stacks += [(["main", "a", "b"], 0.0), (["x"], float("nan"))]  # nothing: left out
    svg = render(stacks, width=1200, title="t <&>")
    assert svg == render(list(reversed(stacks)), width=1200, title="t <&>")  # deterministic
    got, x0, w = {}, float(PAD), 1200.0 - 2 * PAD
    for g in frames(svg):
        r, text, title = frame_rect(g), g.find(f"{SVG}text"), g.find(f"{SVG}title")
        assert text is not None and title is not None
        got[g.get("data-n")] = [float(r[k]) for k in ("x", "y", "width")], r["fill"]
        name, shown = g.get("data-n") or "", text.text or ""
        assert (title.text or "").startswith(f"{name} (")
        assert len(shown) * CHAR_WIDTH <= float(r["width"])
        assert shown == name or (shown.endswith("..") and name.startswith(shown[:-2]))
    y0 = got["all"][0][1]
    # widths proportional to weights, children sorted by name from their parent's left
    expect = {"all": (x0, y0, w), "main": (x0, y0 - ROW, w), "a": (x0, y0 - 2 * ROW, w / 2)}
    expect[d] = (x0 + w / 2, y0 - 2 * ROW, w / 2)
    expect.update(b=(x0, y0 - 3 * ROW, w * 3 / 8), c=(x0 + w * 3 / 8, y0 - 3 * ROW, w / 8))
    assert set(got) == set(expect)
    for name, where in expect.items():
        assert got[name][0] == pytest.approx(where, abs=0.01) and got[name][1] == colour(name)
    assert f">{d}<" not in svg and f'data-n="{d}"' in svg  # its text cut, its name kept
    assert re.fullmatch(r"#[0-9a-f]{6}", colour("x")) and colour("x") != colour("y")
    assert "t &lt;&amp;&gt;" in svg and svg.count("http") == 1  # the xmlns: nothing fetched
    assert render([]).count("no samples") == 1


def read_png(data: bytes) -> np.ndarray[Any, Any]:
    """An 8-bit RGB or RGBA PNG, non-interlaced (what Chromium writes), as an array."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, head = 8, b"", b""
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        head = body if kind == b"IHDR" else head
        idat += body if kind == b"IDAT" else b""
        pos += 12 + n
    w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", head)
    assert depth == 8 and ctype in (2, 6) and interlace == 0, (depth, ctype, interlace)
    bpp = 3 if ctype == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(h, 1 + w * bpp)
    img = np.zeros((h + 1, w * bpp), dtype=np.int64)  # row -1: zeros
    for y in range(h):
        f, line, up = raw[y, 0], raw[y, 1:].astype(np.int64), img[y - 1]
        if f <= 2:  # None, Sub (a running sum per channel), Up
            img[y] = np.cumsum(line.reshape(w, bpp), axis=0).reshape(-1) if f == 1 else line
            img[y] = (img[y] + (up if f == 2 else 0)) % 256
            continue
        cur, lst, p = [0] * len(line), line.tolist(), up.tolist()  # Average, Paeth
        for i, v in enumerate(lst):
            a, b, c = (cur[i - bpp], p[i], p[i - bpp]) if i >= bpp else (0, p[i], 0)
            pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
            pred = (a + b) // 2 if f == 3 else a if pa <= pb and pa <= pc else b if pb <= pc else c
            cur[i] = (v + pred) % 256
        img[y] = cur
    return img[:h].reshape(h, w, bpp)[:, :, :3].astype(np.uint8)


def test_flamegraph_renders_in_chromium(tmp_path: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    stacks = [("main serve tcp_recvmsg copy_user_generic", 40.0), ("main flush tcp_send", 20.0)]
    stacks += [("main serve handle parse", 25.0), ("main serve handle memcpy", 15.0)]
    svg = tmp_path / "flame.svg"
    svg.write_text(render([(s.split(), w) for s, w in stacks], title=f"flow {A}"))
    png = tmp_path / "flame.png"
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    cmd += [f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}"]
    cmd += ["--window-size=1200,600", svg.as_uri()]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and png.exists(), p.stderr[-2000:]
    img = read_png(png.read_bytes())
    assert img.shape == (600, 1200, 3)
    seen = {tuple(int(v) for v in px) for px in img.reshape(-1, 3)}
    assert len(seen) > 20  # text, frames, background: not a blank page
    # each frame drawn where the SVG puts it, in its colour (its top row: no text there)
    for g in frames(svg.read_text()):
        r = frame_rect(g)
        px = img[int(float(r["y"])) + 1, int(float(r["x"]) + float(r["width"]) / 2)]
        assert "#{:02x}{:02x}{:02x}".format(*px) == r["fill"], g.get("data-n")
