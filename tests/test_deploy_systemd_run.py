"""deploy/systemd, run: kernel tests run each unit's hardened process with a workload
and read its metrics, as reading the unit cannot tell whether its sandbox leaves the
tool what it needs. They start it through systemd where it is PID 1 (a transient copy
in /run/systemd/system), else through tests/unit_sandbox.py, which sets up the same
sandbox (capabilities, mounts, seccomp filters) and refuses a unit option it does not
emulate. Another checks that the sandbox is what the unit says (capabilities, read-only
paths, refused calls). test_deploy_systemd.py checks the unit files themselves.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pytest
import yaml
from children import build_c, patience, reap, wait_until
from clickhouse_server import PASSWORD, ClickHouseServer, free_port, running_server
from conftest import LoopDevice
from systemd_units import (
    BIOLAT,
    CAPS,
    DEPLOY,
    IO,
    ROOT,
    SENTINEL,
    UNITS,
    replace_flag,
    unit,
    with_exec_start,
)
from unit_sandbox import parse_unit, state_dirs

SANDBOX = Path(__file__).with_name("unit_sandbox.py")
CAP_BITS = {"dac_read_search": 2, "sys_ptrace": 19, "syslog": 34, "perfmon": 38, "bpf": 39,
            "checkpoint_restore": 40}  # fmt: skip
# sd_booted(): systemd is PID 1 here, so the kernel tests start the units through it.
SYSTEMD_RUNS = Path("/run/systemd/system").is_dir()
SERIAL = itertools.count()


class Service:
    """A unit's process with `argv` (meridian's arguments; or another `command`) in
    place of its ExecStart command: started by systemd where it is PID 1, else in
    unit_sandbox.py. Its state directories, if systemd or the sandbox made them, are
    removed at the end."""

    def __init__(self, name: str, argv: list[str], log: Path, command: list[str] | None = None):
        self.name, self.log = name, log
        self.text = (DEPLOY / f"{name}.service").read_text()
        self.unit = parse_unit(self.text)
        self.command = command or [sys.executable, "-m", "meridian", *argv]
        self.env = f"PYTHONPATH={ROOT / 'src'}"
        self.made = [p for d in state_dirs(self.unit) for p in [*d.parents, d] if not p.exists()]
        self.proc: subprocess.Popen[bytes] | None = None
        self.transient = f"meridian-test-{name}-{os.getpid()}-{next(SERIAL)}.service"

    def start(self) -> None:
        if SYSTEMD_RUNS:
            env_line = f"Environment={self.env}"
            path = Path("/run/systemd/system", self.transient)
            path.write_text(with_exec_start(self.text, self.command, env_line))
            subprocess.run(["systemctl", "daemon-reload"], check=True)
            subprocess.run(["systemctl", "start", self.transient], check=True)
            return
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin", "LANG": "C.UTF-8"}
        key, _, val = self.env.partition("=")
        env[key] = val
        if state_dirs(self.unit):
            env["STATE_DIRECTORY"] = ":".join(map(str, state_dirs(self.unit)))
        # StandardError= follows StandardOutput= unless given; journal: the log file
        out = self.unit.value("StandardOutput") or "journal"
        err = self.unit.value("StandardError") or "inherit"
        err = out if err == "inherit" else err
        assert {out, err} <= {"journal", "null"}
        with open(self.log, "wb") as log:
            where: dict[str, BinaryIO | int] = {"journal": log, "null": subprocess.DEVNULL}
            self.proc = subprocess.Popen(
                [sys.executable, str(SANDBOX), str(DEPLOY / f"{self.name}.service"), "--",
                 *self.command],
                stdin=subprocess.DEVNULL, stdout=where[out], stderr=where[err], env=env, cwd="/",
            )  # fmt: skip

    def running(self) -> bool:
        if SYSTEMD_RUNS:
            got = subprocess.run(["systemctl", "is-active", self.transient], capture_output=True)
            return got.returncode == 0
        return self.proc is not None and self.proc.poll() is None

    def journal(self) -> str:
        if SYSTEMD_RUNS:
            return subprocess.run(
                ["journalctl", "-o", "cat", "--no-pager", "-u", self.transient],
                capture_output=True, text=True,
            ).stdout  # fmt: skip
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM, as systemctl stop: the process must end with 0."""
        if SYSTEMD_RUNS:
            subprocess.run(["systemctl", "stop", self.transient], check=True)
            show = subprocess.run(
                ["systemctl", "show", self.transient, "-p", "Result", "-p", "NRestarts",
                 "-p", "ExecMainStatus"], capture_output=True, text=True, check=True,
            ).stdout.split()  # fmt: skip
            assert sorted(show) == ["ExecMainStatus=0", "NRestarts=0", "Result=success"], (
                show, self.journal()[-3000:]
            )  # fmt: skip
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(patience(60))
        assert code == 0, self.journal()[-3000:]

    def clean_up(self) -> None:
        if SYSTEMD_RUNS:
            subprocess.run(["systemctl", "stop", self.transient], check=False)
            subprocess.run(["systemctl", "reset-failed", self.transient], check=False)
            Path("/run/systemd/system", self.transient).unlink(missing_ok=True)
            subprocess.run(["systemctl", "daemon-reload"], check=False)
        elif self.proc is not None:
            reap(self.proc)
        for p in sorted(self.made, key=lambda p: len(p.parts), reverse=True):
            shutil.rmtree(p, ignore_errors=True)


@pytest.fixture
def run_dir() -> Iterator[Path]:
    """Files the service reads: under /run, as the unit's PrivateTmp= hides /tmp."""
    d = Path(tempfile.mkdtemp(prefix="meridian-test-", dir="/run"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """/metrics as {(series name, labels): value}; {} while it does not answer."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    return {
        (s.name, frozenset(s.labels.items())): float(s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def value(port: int, name: str, **labels: str) -> float | None:
    return scrape(port).get((name, frozenset(labels.items())))


def serving(svc: Service, port: int) -> None:
    def ready() -> bool:
        assert svc.running(), svc.journal()[-3000:]
        return bool(scrape(port))

    wait_until(ready, 90, f"{svc.name}'s /metrics", step=0.25)


@contextlib.contextmanager
def exporter(name: str, tmp_path: Path) -> Iterator[tuple[Service, int]]:
    """The unit `name`'s exporter, under its sandbox on a free port, serving /metrics;
    cleaned up (stopped, its sandbox undone) on every path."""
    port = free_port()
    argv = replace_flag(unit(name).exec_start()[1:], "--prometheus", f":{port}")
    svc = Service(name, argv, tmp_path / "journal")
    try:
        svc.start()
        serving(svc, port)
        yield svc, port
    finally:
        svc.clean_up()


@pytest.mark.kernel
def test_io_exporter_counts_a_writer_and_a_reader_exactly(tmp_path: Path) -> None:
    with exporter(IO, tmp_path) as (svc, port):
        data, size = tmp_path / "data", 64 * 65536
        dd = ["dd", "bs=64k", "status=none"]
        env = {"PATH": os.environ["PATH"], "LC_ALL": "C"}
        writer = subprocess.Popen([*dd, "if=/dev/zero", f"of={data}", "count=64", "conv=fsync"],
                                  env=env)  # fmt: skip
        assert writer.wait() == 0
        reader = subprocess.Popen([*dd, f"if={data}", "of=/dev/null"], env=env)
        assert reader.wait() == 0

        def counted(pid: int, direction: str) -> float | None:
            return value(port, "process_disk_io_bytes_total", disk_io_direction=direction,
                         meridian_io_writeback="false", process_executable_name="dd",
                         process_pid=str(pid))  # fmt: skip

        wait_until(lambda: counted(writer.pid, "write") == size, 20, "the writer's bytes", 0.25)
        # both read what dd reads to start (the loader reads libc's headers): the same
        started = counted(writer.pid, "read")
        assert started is not None and 0 < started < 65536
        wait_until(
            lambda: counted(reader.pid, "read") == size + started, 20, "the reader's bytes", 0.25
        )
        svc.stop()
        assert "error" not in svc.journal().lower()


@pytest.mark.kernel
def test_biolat_exporter_counts_direct_writes_to_a_disk_exactly(
    loop_device: LoopDevice, tmp_path: Path
) -> None:
    with exporter(BIOLAT, tmp_path) as (svc, port):
        with loop_device.udev_held_off():
            dd = ["dd", "if=/dev/zero", f"of={loop_device.path}", "bs=64k", "count=32"]
            subprocess.run([*dd, "oflag=direct", "status=none"], check=True)
        disk = {"system_device": loop_device.name, "disk_io_direction": "write"}
        wait_until(
            lambda: value(port, "system_disk_io_bytes_total", **disk) == 32 * 65536,
            20, "the writes' bytes", 0.25,
        )  # fmt: skip
        ops = value(port, "system_disk_operations_total", **disk)
        assert ops is not None and 1 <= ops <= 32
        assert value(port, "system_disk_operation_duration_seconds_count", **disk) == ops
        svc.stop()
        assert "error" not in svc.journal().lower()


# Two programs that sleep a second, then spin a tenth of a CPU each until killed,
# as nobody, from a directory only nobody may read, on a tmpfs mounted in their own
# mount namespace (as a container's files are): their frames are named only through
# /proc/PID/root (CAP_SYS_PTRACE) and past the directory's mode (CAP_DAC_READ_SEARCH).
# The second's file is deleted while it sleeps: its frames are named only through
# /proc/PID/map_files (CAP_CHECKPOINT_RESTORE).
SPINNER = r"""
#include <time.h>
__attribute__((noinline)) unsigned long SPIN(unsigned long n) {
    volatile unsigned long x = 0;
    for (unsigned long i = 0; i < n; i++) x += i * 2654435761u;
    return x;
}
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
int main(void) {
    struct timespec rest = {0, 18000000}, first = {1, 0};
    nanosleep(&first, NULL); /* not sampled yet when its file is deleted */
    for (;;) {
        double t = now() + 0.002;
        while (now() < t) SPIN(1000);
        nanosleep(&rest, NULL);
    }
}
"""
SPIN_SCRIPT = """
mount -t tmpfs -o mode=0755 meridian-test /mnt && mkdir -m 0700 /mnt/own
cp "$1" /mnt/own/ns-spinner && cp "$2" /mnt/own/gone-spinner && chown -R 65534:65534 /mnt/own
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all "$@"; }
as_nobody /mnt/own/ns-spinner & as_nobody /mnt/own/gone-spinner &
sleep 0.3 && rm /mnt/own/gone-spinner && wait
"""


@pytest.fixture
def clickhouse(tmp_path: Path) -> Iterator[ClickHouseServer]:
    yield from running_server(tmp_path / "clickhouse")


@pytest.mark.kernel
def test_sentinel_stores_named_frames_of_contained_and_deleted_programs(
    clickhouse: ClickHouseServer, run_dir: Path, tmp_path: Path
) -> None:
    from meridian.tools.sentinel.storage import HttpBackend

    ns_spin = build_c(tmp_path, "ns", SPINNER, "-O1", "-g", "-DSPIN=meridian_test_ns_spin")
    gone_spin = build_c(tmp_path, "gone", SPINNER, "-O1", "-g", "-DSPIN=meridian_test_gone_spin")
    password = run_dir / "clickhouse.password"
    password.write_text(PASSWORD + "\n")
    password.chmod(0o600)
    config = yaml.safe_load((DEPLOY / "sentinel.yaml").read_text())
    config["clickhouse"].update(url=clickhouse.url, user="writer", password_file=str(password))
    (run_dir / "sentinel.yaml").write_text(yaml.safe_dump(config))
    port = free_port()
    argv = replace_flag(unit(SENTINEL).exec_start()[1:], "--config", str(run_dir / "sentinel.yaml"))
    svc = Service(
        SENTINEL, replace_flag(argv, "--prometheus", f"127.0.0.1:{port}"), tmp_path / "journal"
    )
    store = HttpBackend(clickhouse.url, "writer", str(password), config["clickhouse"]["database"])
    spinners: subprocess.Popen[bytes] | None = None

    def named() -> set[tuple[str, str]]:
        try:
            rows = store.query("SELECT binary, function FROM ms_functions")
        except Exception:  # no table before the first flush
            return set()
        return {(str(r["binary"]), str(r["function"])) for r in rows}

    spins = {"meridian_test_ns_spin", "meridian_test_gone_spin"}
    try:
        svc.start()
        serving(svc, port)
        spinners = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", SPIN_SCRIPT, "sh",
             str(ns_spin), str(gone_spin)], start_new_session=True,
        )  # fmt: skip
        # the symbols of every binary sampled on the host are read in turn: a busy host
        # takes longer to reach the spinners'
        try:
            wait_until(lambda: spins <= {f for _, f in named()}, 90, "the spinners' names", 0.5)
        except AssertionError:
            raise AssertionError((sorted(named()), svc.journal()[-2000:])) from None
        assert (value(port, "ms_clickhouse_flush_errors_total") or 0) == 0
        svc.stop()
    finally:
        if spinners is not None:
            os.killpg(spinners.pid, signal.SIGKILL)
            reap(spinners)
        svc.clean_up()
    kernel = {f for b, f in named() if b == "[kernel]"}
    kallsyms = {line.split()[2] for line in Path("/proc/kallsyms").read_text().splitlines()}
    assert kernel & kallsyms, sorted(kernel)[:20]
    samples = store.query("SELECT sum(samples) AS n FROM ms_flow_rollup")
    assert int(samples[0]["n"]) > 0


# What a process sees of its sandbox, as JSON on stderr (the journal).
PROBE = r"""
import ctypes, errno, json, mmap, os, socket, stat, sys

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def call(rc):
    return "ok" if rc >= 0 else errno.errorcode[ctypes.get_errno()]


def attempt(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]


def write(path):
    def f():
        with open(path, "w") as out:
            out.write("x")
        os.unlink(path)
    return attempt(f)


# a file created with mode 0666 less the umask: its mode, and whether it may then be
# made set-uid, set-gid (its owner's right)
def new_file():
    path = "/tmp/made"
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o666))
    try:
        return [oct(stat.S_IMODE(os.stat(path).st_mode)),
                attempt(lambda: os.chmod(path, 0o4600)), attempt(lambda: os.chmod(path, 0o2600))]
    finally:
        os.unlink(path)


status = dict(line.split(":", 1) for line in open("/proc/self/status"))
page = libc.mmap(None, 4096, 3, 0x22, -1, 0)
got = {
    "CapEff": int(status["CapEff"], 16),
    "CapBnd": int(status["CapBnd"], 16),
    "NoNewPrivs": int(status["NoNewPrivs"]),
    "wx_mmap": attempt(lambda: mmap.mmap(-1, 4096, prot=7)),
    "mprotect_exec": call(libc.mprotect(page, 4096, 5)),
    "unshare_net": call(libc.unshare(0x40000000)),
    "personality": call(libc.personality(0x0400000)),
    "syslog": call(libc.klogctl(10, None, 0)),
    "sethostname": call(libc.sethostname(b"x", 1)),
    # SCHED_FIFO at priority 0: EINVAL from the kernel, EPERM from RestrictRealtime
    "realtime": call(libc.sched_setscheduler(0, 1, ctypes.byref(ctypes.c_int(0)))),
    # PTRACE_PEEKDATA of PID 0: ESRCH from the kernel, EPERM from SystemCallFilter
    "ptrace": call(libc.ptrace(2, 0, None, None)),
    "umask": status["Umask"].strip(),
    "new_file": new_file(),
    "kallsyms": attempt(lambda: open("/proc/kallsyms").read(1 << 16)),
    "kallsyms_addresses": any(
        int(line.split()[0], 16) for line in open("/proc/kallsyms").readlines()[:100]
    ) if os.access("/proc/kallsyms", os.R_OK) else False,
    "kmsg": [stat.S_IMODE(os.stat("/proc/kmsg").st_mode),
             os.stat("/proc/kmsg").st_dev == os.stat("/proc").st_dev],
    "block_devices": [n for n in os.listdir("/dev") if stat.S_ISBLK(os.lstat("/dev/" + n).st_mode)],
    "tmp": os.listdir("/tmp"),
}
for fam in ("AF_PACKET", "AF_NETLINK", "AF_INET6"):
    kind = socket.SOCK_DGRAM if fam != "AF_NETLINK" else socket.SOCK_RAW
    got[fam] = attempt(lambda: socket.socket(getattr(socket, fam), kind).close())
for path in ["/usr/probe", "/etc/probe", "/var/lib/probe", "/root/probe", "/tmp/probe",
             "/var/tmp/probe", *[d + "/probe" for d in sys.argv[1:]]]:
    got[path] = write(path)
# kernel settings: opened for writing, never written
for path in ["/proc/sys/kernel/hostname", "/sys/kernel/tracing/tracing_on"]:
    got[path] = attempt(lambda: os.close(os.open(path, os.O_WRONLY)))
print(json.dumps(got), file=sys.stderr)
"""


@pytest.mark.kernel
@pytest.mark.parametrize("name", UNITS)
def test_the_sandbox_is_what_the_unit_says(name: str, run_dir: Path, tmp_path: Path) -> None:
    u = unit(name)
    probe = run_dir / "probe.py"
    probe.write_text(PROBE)
    states = [str(d) for d in state_dirs(u)]
    svc = Service(name, [], tmp_path / "journal", [sys.executable, str(probe), *states])
    try:
        svc.start()
        wait_until(lambda: not svc.running(), 60, "the probe's end", 0.1)
        lines = [line for line in svc.journal().splitlines() if line.startswith("{")]
        assert lines, svc.journal()
        got: dict[str, Any] = json.loads(lines[-1])
    finally:
        svc.clean_up()
    mask = sum(1 << CAP_BITS[c] for c in CAPS[name])
    assert (got["CapEff"], got["CapBnd"], got["NoNewPrivs"]) == (mask, mask, 1)
    # MemoryDenyWriteExecute, RestrictNamespaces, LockPersonality, ProtectHostname
    assert got["wx_mmap"] == got["mprotect_exec"] == "EPERM"
    assert got["unshare_net"] == got["personality"] == got["sethostname"] == "EPERM"
    # SystemCallFilter (ptrace is outside @system-service), RestrictRealtime,
    # RestrictSUIDSGID, UMask
    assert got["ptrace"] == got["realtime"] == "EPERM"
    assert got["umask"] == "0077" and got["new_file"] == ["0o600", "EPERM", "EPERM"]
    # ProtectKernelLogs (io, biolat) or the sentinel's syslog filter and /proc/kmsg:
    # an empty mode-000 file in place of the kernel's log
    assert got["syslog"] == "EPERM" and got["kmsg"] == [0, False]
    families = u.words("RestrictAddressFamilies")
    assert got["AF_PACKET"] == "EAFNOSUPPORT" and got["AF_INET6"] == "ok"
    assert got["AF_NETLINK"] == ("ok" if "AF_NETLINK" in families else "EAFNOSUPPORT")
    # ProtectSystem=strict, ProtectHome=read-only, /proc/sys and /sys read-only,
    # PrivateTmp (empty, writable), PrivateDevices (no disks), StateDirectory
    for path in ("/usr", "/etc", "/var/lib", "/root"):
        assert got[f"{path}/probe"] == "EROFS", path
    assert got["/proc/sys/kernel/hostname"] == got["/sys/kernel/tracing/tracing_on"] == "EROFS"
    assert got["/tmp/probe"] == got["/var/tmp/probe"] == "ok" and got["tmp"] == []
    assert got["block_devices"] == []
    for d in states:
        assert got[f"{d}/probe"] == "ok"
    # /proc/kallsyms: hidden by ProtectKernelTunables (io, biolat); the sentinel's,
    # with CAP_SYSLOG, has the addresses
    if name == SENTINEL:
        assert got["kallsyms"] == "ok" and got["kallsyms_addresses"]
    else:
        assert got["kallsyms"] == "EACCES"
