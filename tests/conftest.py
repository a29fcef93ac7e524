"""Shared fixtures. Kernel tests carry the `kernel` marker: they are skipped (with the
reason) where BPF cannot run, unless MERIDIAN_REQUIRE_BPF=1, which makes them fail
instead, so CI really runs them."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from strategies import REFUSED
from symbolizer_fakes import Binary, Clock, FakeProc, build_binaries

from meridian.bpf import object_path
from meridian.proc import kernel_dev

REQUIRE_BPF = os.environ.get("MERIDIAN_REQUIRE_BPF") == "1"
# Features that must work here (the kernel matrix's guests): a strategy test skipped
# because the kernel refuses one of them fails, as any skip does (tests/strategies.py).
REQUIRE_FEATURES = set(filter(None, os.environ.get("MERIDIAN_REQUIRE_FEATURES", "").split(",")))

# Run from a script's background job (`make test &`), the suite would start with SIGINT
# ignored, and every meridian it starts would inherit that: the Ctrl-C tests would
# fail and a tool still attached would outlive them. Restored here for the children.
signal.signal(signal.SIGINT, signal.default_int_handler)


def bpf_unavailable() -> str | None:
    """Why kernel tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "not root"
    if not Path("/sys/kernel/btf/vmlinux").exists():
        return "kernel has no BTF"
    if not object_path("biolat").exists():
        return "BPF objects not built (make bpf)"
    return None


# Skips that are about the hardware, not about anything `make test` can install: the
# only ones MERIDIAN_REQUIRE_BPF=1 leaves as skips. Test node id -> why it may skip.
HARDWARE_SKIPS = {
    "tests/test_sentinel_kernel_sampling.py::test_hardware_events_fall_back_to_cpu_clock": (
        "the software fallback happens only where the PMU is missing (a VM without a "
        "virtual PMU); on bare metal the hardware path runs and its unit tests cover it"
    ),
    "tests/test_sentinel_lbr.py::test_refused_where_the_cpu_has_no_lbr": (
        "--lbr is refused only where the CPU records no branches (a VM without LBR "
        "passthrough); with an LBR it runs, and the probe's unit tests cover the refusal"
    ),
}


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """With MERIDIAN_REQUIRE_BPF=1 a skip (in the test, a fixture or a skipif) is a
    failure: what it waits for must be installed, not silently passed over. In a guest
    of kernel_matrix.py (MERIDIAN_TEST_SLOWDOWN set), a failure is printed when it
    happens: a guest stopped at its time limit never reaches pytest's summary."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    _skip_is_failure(item, report)
    if report.failed and os.environ.get("MERIDIAN_TEST_SLOWDOWN"):
        terminal = item.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            text = report.longreprtext[-8000:]
            terminal.write_line(f"\n{item.nodeid} failed ({report.when}):\n{text}")


def _skip_is_failure(item: pytest.Item, report: pytest.TestReport) -> None:
    if not (REQUIRE_BPF and report.skipped) or hasattr(report, "wasxfail"):
        return
    if item.nodeid.split("[")[0] in HARDWARE_SKIPS:
        return
    refused = REFUSED.match(_skip_reason(report).removeprefix("Skipped: "))
    if refused and refused.group(1) not in REQUIRE_FEATURES:
        return  # the kernel decides, as hardware does; the guests require them
    report.outcome = "failed"
    report.longrepr = (
        f"skipped ({_skip_reason(report)}) while MERIDIAN_REQUIRE_BPF=1: install what it "
        "needs (make test does), or list it in conftest.HARDWARE_SKIPS if the hardware decides"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """The same for a module skipped whole (module-level skip, importorskip)."""
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()  # type: ignore[attr-defined]
    if REQUIRE_BPF and report.skipped:
        report.outcome = "failed"
        report.longrepr = (
            f"{collector.nodeid} skipped whole ({_skip_reason(report)}) while "
            "MERIDIAN_REQUIRE_BPF=1: install what it needs (make test does)"
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("kernel") is None:
        return
    reason = bpf_unavailable()
    if reason is None:
        return
    if REQUIRE_BPF:
        pytest.fail(f"kernel test cannot run ({reason}) and MERIDIAN_REQUIRE_BPF=1")
    pytest.skip(f"kernel test: {reason}")


@dataclass
class LoopDevice:
    path: str  # /dev/loopN
    name: str  # loopN
    dev: int  # kernel dev_t
    backing: Path

    @contextlib.contextmanager
    def udev_held_off(self) -> Iterator[None]:
        """No udev probe reads the device meanwhile. udevd watches block devices and
        probes one (blkid: 48 reads in Debian's guests) each time a writer closes it,
        adding its requests to the workload's; it postpones the events of a device
        held with LOCK_EX (systemd's block device locking) until the lock goes. A probe
        under way holds LOCK_SH, so taking the lock waits for it: hold it before a tool
        attaches, or the tool streams the probe's reads (48 extra slow-I/O records
        failed CI's 6.1 guest that way)."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


@pytest.fixture
def promtool() -> str:
    """promtool's path (Debian's prometheus package); a skip without it."""
    if not Path(PROMTOOL).exists():
        pytest.skip("promtool is not installed (Debian's prometheus package; make installs it)")
    return PROMTOOL


@pytest.fixture
def loop_device(tmp_path: Path) -> Iterator[LoopDevice]:
    """A 64 MiB loop device on a file, detached even when the test fails."""
    if not Path("/dev/loop-control").exists():  # a fresh virtme-ng guest (kernel matrix)
        subprocess.run(["modprobe", "loop"], check=False)
    backing = tmp_path / "disk.img"
    with open(backing, "wb") as f:
        f.truncate(64 << 20)
    path = subprocess.run(
        ["losetup", "--find", "--show", str(backing)], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        name = os.path.basename(path)
        major, minor = Path(f"/sys/class/block/{name}/dev").read_text().strip().split(":")
        yield LoopDevice(path, name, kernel_dev(int(major), int(minor)), backing)
    finally:
        subprocess.run(["losetup", "-d", path], check=False)


@pytest.fixture
def ext4(loop_device: LoopDevice, tmp_path: Path) -> Iterator[Path]:
    """An ext4 file system on the loop device, mounted below tmp_path; unmounted even
    when the test fails (before the loop device is detached)."""
    subprocess.run(["mkfs.ext4", "-q", "-F", loop_device.path], check=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", loop_device.path, str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield int(s.getsockname()[1])


@pytest.fixture
def utc() -> Iterator[None]:
    """TZ=UTC for the test (times print as 22:13:20 for T0), restored after."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


# -- the sentinel symbolizer tests (symbolizer_fakes.py) -----------------------------


@pytest.fixture(scope="session")
def binaries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Binary]:
    """The test program built once as a PIE, a non-PIE and a shared library."""
    return build_binaries(tmp_path_factory.mktemp("elf"))


@pytest.fixture
def fake(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def pin_query_clock(monkeypatch: pytest.MonkeyPatch, now_s: float) -> None:
    """sentinel's queries take "now" from time.time(): pinned to `now_s`, rows a test
    stamped relative to it stay in "the last 10 minutes" however long the suite runs
    before the test (15 minutes aged them out)."""
    from meridian.tools.sentinel.query import store

    monkeypatch.setattr(store, "time", types.SimpleNamespace(time=lambda: now_s))


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test started, killed if the test left them running."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=10)
