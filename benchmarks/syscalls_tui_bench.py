"""syscalls TUI responsiveness, headless with Textual's Pilot (no kernel needed): a feed
delivers synthetic file-system calls (openat with a path, read with an fd path, close;
start and end events) at a fixed rate while keys are pressed; each press is timed from
the key to the table's next repaint (the first render_line call after the key's
handling began). Also the cost of a full/compact toggle and of a filter over a large
log, the memory the app holds at its --max-rows cap, and the drops from memory.

Run from the repository:
  .venv/bin/python benchmarks/syscalls_tui_bench.py [events_per_s] [seconds] [max_rows]
"""

from __future__ import annotations

import asyncio
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from meridian.tools.syscalls.event import Syscall  # noqa: E402
from meridian.tools.syscalls.tui import SyscallsApp  # noqa: E402
from meridian.tools.syscalls.tui_table import CallTable  # noqa: E402

T0 = 1_700_000_000_000_000_000


def make_events(start: int, n: int) -> list[Syscall]:
    out = []
    for i in range(start, start + n):
        call, half = divmod(i, 2)
        kind = call % 3
        tid = 100 + call % 4
        ts = T0 + i * 50_000
        path = f"/var/lib/app/data/file{call % 1000}.db"
        name = ("openat", "read", "close")[kind]
        if half == 0:
            args: tuple[str, ...] = (
                ("AT_FDCWD", f'"{path}"', "O_RDONLY|O_CLOEXEC"),
                (f"3<{path}>", "0x7ffd0000", "4096"),
                (f"3<{path}>",),
            )[kind]
            paths = (path,) if kind == 0 else ()
            sc = Syscall(i, name, ts, "worker", 100, tid, args, is_start=True, paths=paths)
        else:
            res = -2 if kind == 0 and call % 50 == 0 else (3, 4096, 0)[kind]
            text = "-2 ENOENT" if res == -2 else str(res)
            sc = Syscall(
                i, name, ts, "worker", 100, tid, result=res, result_text=text,
                have_result=True, is_end=True,
            )  # fmt: skip
        out.append(sc)
    return out


class RateFeed:
    """`rate` events per second of wall time, delivered at each poll."""

    def __init__(self, rate: float, preload: int = 0) -> None:
        self.rate = rate
        self.sent = 0
        self._pending = make_events(0, preload)
        self.sent = preload
        self.t0 = time.monotonic()
        self.due = 0.0

    def poll(self) -> list[Syscall]:
        now = time.monotonic()
        n = int(self.rate * (now - self.t0) - self.due)
        self.due += n
        new = self._pending + make_events(self.sent, n)
        self._pending = []
        self.sent += n
        return new

    def counters(self) -> dict[str, int]:
        return {"lost": 0}


async def press_timed(pilot: Any, table: CallTable, key: str) -> float:
    """Seconds from the key press to the first repaint of the table after it."""
    painted: list[float] = []
    original = table.render_line

    def spy(y: int) -> Any:
        if not painted:
            painted.append(time.perf_counter())
        return original(y)

    t0 = time.perf_counter()
    table.render_line = spy  # type: ignore[method-assign]
    try:
        await pilot.press(key)
        for _ in range(2000):
            if painted:
                break
            await asyncio.sleep(0.001)
    finally:
        del table.render_line
    return (painted[0] if painted else time.perf_counter()) - t0


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def live(rate: float, seconds: float, max_rows: int) -> dict[str, Any]:
    feed = RateFeed(rate)
    app = SyscallsApp(feed, live=True, max_rows=max_rows, spill="rec.raw")
    times: list[float] = []
    async with app.run_test(size=(160, 40)) as pilot:
        table = app.query_one(CallTable)
        end = time.monotonic() + seconds
        keys = ["up", "up", "down", "pageup", "down", "c", "c", "e"]
        i = 0
        while time.monotonic() < end:
            await asyncio.sleep(0.2)
            times.append(await press_timed(pilot, table, keys[i % len(keys)]))
            i += 1
        events = app.events
        dropped = app.dropped
        rows = len(app.agg.log) - app.agg.log.first
    times.sort()
    return {
        "rate": events / seconds,
        "presses": len(times),
        "p50_ms": 1000 * statistics.median(times),
        "p95_ms": 1000 * times[int(0.95 * (len(times) - 1))],
        "max_ms": 1000 * times[-1],
        "dropped": dropped,
        "rows": rows,
        "rss_mb": rss_mb(),
    }


async def big_log(n: int) -> dict[str, float]:
    """Toggle and filter over a log of n events (no new events)."""
    feed = RateFeed(0, preload=n)
    app = SyscallsApp(feed, live=False)
    out: dict[str, float] = {}
    async with app.run_test(size=(160, 40)) as pilot:
        table = app.query_one(CallTable)
        await pilot.pause()
        out["toggle_s"] = await press_timed(pilot, table, "c")
        await pilot.press("slash")
        t0 = time.perf_counter()
        keys = []
        for k in "file7":  # the table does not change per key: time the key's handling
            t = time.perf_counter()
            await pilot.press(k)
            keys.append(time.perf_counter() - t)
        out["key_max_s"] = max(keys)
        while app._filter_timer is not None:  # a large log is filtered once typing pauses
            await asyncio.sleep(0.01)
        await pilot.pause()
        out["filter_5_keys_s"] = time.perf_counter() - t0
        out["rows_after_filter"] = len(app.view)
    return out


def main() -> int:
    rate = float(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 20
    max_rows = int(sys.argv[3]) if len(sys.argv) > 3 else 200_000
    r = asyncio.run(live(rate, seconds, max_rows))
    print(f"machine: {platform.node()} {platform.release()}; headless Pilot, 160x40")
    print(
        f"live at {r['rate']:,.0f} events/s for {seconds:.0f} s, --max-rows {max_rows:,}: "
        f"{r['presses']} key presses, key -> repaint p50 {r['p50_ms']:.1f} ms, "
        f"p95 {r['p95_ms']:.1f} ms, max {r['max_ms']:.1f} ms; {r['rows']:,} events in memory, "
        f"{r['dropped']:,} dropped from memory; peak RSS {r['rss_mb']:.0f} MB"
    )
    for n in (23_000, 200_000):
        b = asyncio.run(big_log(n))
        print(
            f"log of {n:,} events: toggle compact/full -> repaint {b['toggle_s'] * 1000:.0f} ms; "
            f"typing a 5-key filter: slowest key handled in {b['key_max_s'] * 1000:.0f} ms, "
            f"filtered table after {b['filter_5_keys_s']:.2f} s "
            f"({b['rows_after_filter']:,.0f} rows match)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
