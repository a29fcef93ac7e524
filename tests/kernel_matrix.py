"""The kernel matrix: the kernel tests again on the kernels users run, each booted as a
guest (virtme-ng over this machine's root file system, so the same venv, BPF objects
and tests), and a table of what ran. `make test-kernels` runs it; so does `.ci/run`.

    python tests/kernel_matrix.py [--tests NODE ...] /boot/vmlinuz-6.1.0-... ...

In a guest every feature the strategies need must work (MERIDIAN_REQUIRE_FEATURES): a
strategy test that skips there fails, and a strategy of a tool that no test exercised
fails the run. Exit status: 0 when every kernel passed, 1 otherwise, 2 on bad input.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from meridian.tools import biolat, io, memlat, runqlat, sentinel, syscalls

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = REPO / ".venv" / "bin"

# The guests' tests: each tool's exact counts against a known answer, once per strategy
# (tests/strategies.py), and each tool's strategy choice and doctor against the facts.
DEFAULT_TESTS = (
    "tests/test_io_kernel_strategy.py::test_dd_reads_of_one_file_under_every_strategy",
    "tests/test_io_kernel_strategy.py::test_every_read_and_write_syscall_under_every_strategy",
    "tests/test_io_kernel_strategy.py::test_sendfile_and_copy_file_range",
    "tests/test_io_kernel_stats_cache.py",
    # the disk signals read from the folio and the bio (tp_btf), against the tracepoints
    "tests/test_io_kernel_disk.py::test_cold_read_is_disk_warm_read_is_cached",
    # io_uring: io_uring_submit_sqe on 6.1, io_uring_submit_req since 6.4
    "tests/test_io_kernel_uring.py",
    "tests/test_syscalls_kernel.py::test_openat_calls_of_cat_equal_straces",
    "tests/test_syscalls_kernel.py::test_a_pid_added_while_tracing_is_traced_from_its_next_call",
    "tests/test_syscalls_kernel.py::test_prog_calls_paired_with_paths",
    "tests/test_syscalls_kernel.py::test_fd_path_crosses_mounts",
    "tests/test_syscalls_kernel.py::test_fd_paths_are_cached_until_a_rename_or_mount",
    # the cgroup filter keeps the cgroups below the one named (the ancestor helper)
    "tests/test_syscalls_kernel_filters.py::test_cgroup_filter",
    # per process (-P: the hists map too) under each strategy that starts at the exception;
    # the handle_mm_fault ones run the get_user_pages test below, also exact
    *(
        f"tests/test_memlat_kernel.py::test_minor_faults_equal_the_childs_getrusage[True-{s.name}]"
        for s in memlat.FROM_EXCEPTION
    ),
    "tests/test_memlat_kernel.py::test_failed_faults_are_counted_exactly",
    # --from handle_mm_fault: fentry and kprobes only, which this VM refuses
    "tests/test_memlat_kernel_pids.py::test_from_handle_mm_fault_counts_every_call_get_user_pages_too",
    "tests/test_biolat_kernel.py::test_exact_counts_sizes_slow_events_and_depth",
    "tests/test_runqlat_kernel.py::test_each_process_waits_what_its_schedstat_says",
    # the tracepoints' PID set follows threads by reading the task's thread list
    "tests/test_runqlat_kernel.py::test_a_pid_set_counts_what_schedstat_says_of_each_of_its_processes",
    "tests/test_sentinel_kernel_flows.py::test_flow_attribution_over_veth",
    "tests/test_sentinel_kernel_agent.py",
    "tests/test_sentinel_kernel_tunnels.py",
    "tests/test_sentinel_kernel_overlays.py",
    # what the verifier does for the programs that name files (6.7+ walks callbacks)
    "tests/test_bpf_verifier_cost.py",
    "tests/test_bpf_kernel.py::test_every_feature_probe_equals_the_independent_fact",
    "tests/test_bpf_kernel.py::test_every_tool_chooses_the_strategy_the_host_facts_predict",
    "tests/test_bpf_kernel.py::test_doctor_says_why_fentry_and_kprobes_are_refused",
)
# What both Debian kernels allow (doctor says so there); hw_perf needs a PMU.
GUEST_FEATURES = "tracepoint,tp_btf,fentry,kprobe,perf_event,ringbuf"
TOOL_STRATEGIES = {
    "biolat": biolat.STRATEGIES,
    "io": io.STRATEGIES,
    "memlat": memlat.STRATEGIES,
    "runqlat": runqlat.STRATEGIES,
    "sentinel": sentinel.STRATEGIES,
    "syscalls": syscalls.STRATEGIES,
}
TOOLS = {name: [s.name for s in strategies] for name, strategies in TOOL_STRATEGIES.items()}
# TCG against this host, for the tests' waits (tests/children.py patience()).
SLOWDOWN = 5
# One guest: the boot and Python's start-up alone take ~30 s under TCG; the whole of
# 6.12's run took 1176 s here (2026-11-27).
GUEST_TIMEOUT_S = 1800
# pytest has collected the tests by then (~60 s here), or the boot hung: booted again once,
# as is a guest that died during the tests (vng's status 255: the 6.12 guest did once,
# 6 minutes in, and passed every test on the next boot)
BOOT_TIMEOUT_S = 420
BOOT_TRIES = 2
# one test at most (the slowest takes ~50 s under TCG): a hang fails that test, with the
# threads' stacks, and the others run (pytest-timeout, the `kernels` extra)
TEST_TIMEOUT_S = 300
# the guest's last console lines, printed again with the table when it failed: a CI log
# is often read from its end
TAIL_LINES = 40


def numpy_dispatch() -> str:
    """numpy's run-time SIMD targets above its baseline (X86_V3 = AVX2 and up), all
    turned off in the guests: QEMU 7.2's TCG (Debian 12's) emulates AVX2 wrongly for
    numpy's sort kernels. There np.argsort of a random uint64 array was wrong in 283 of
    300 tries, and the sentinel agent died by SIGSEGV inside one (in the flush thread's
    grouping, faulthandler showed). The baseline kernels sort right there."""
    umath = importlib.import_module("numpy._core._multiarray_umath")  # no stubs
    return " ".join(umath.__cpu_dispatch__)


@dataclass
class Result:
    kernel: str
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""
    tail: list[str] = field(default_factory=list)  # the guest's last console lines

    def strategies(self) -> dict[str, set[str]]:
        """tool -> its strategies that a passed test ran: tests/test_<tool>_*.py, a
        strategy name among the test's parameters."""
        out: dict[str, set[str]] = {}
        for test_id in self.passed:
            m = re.search(r"test_(\w+?)_\w*::\w+\[(.+)\]$", test_id)
            if m and m.group(1) in TOOLS:
                ran = set(m.group(2).split("-")) & set(TOOLS[m.group(1)])
                out.setdefault(m.group(1), set()).update(ran)
        return out


def guest_script(tests: list[str], junit: Path) -> str:
    """What the guest runs as root. It goes in a file: vng passes --exec's text on the
    kernel command line, and one over its 2,048 bytes leaves the guest idle forever."""
    return (
        f"export MERIDIAN_REQUIRE_BPF=1 MERIDIAN_REQUIRE_FEATURES={GUEST_FEATURES}\n"
        f"export MERIDIAN_TEST_SLOWDOWN={SLOWDOWN}\n"
        f"export PYTHONUNBUFFERED=1 PATH={VENV_BIN}:/usr/sbin:/usr/bin:/sbin:/bin\n"
        f"export NPY_DISABLE_CPU_FEATURES='{numpy_dispatch()}'\n"
        f"export PYTHONPATH={REPO / 'src'}\n"  # this checkout's code, whatever the venv's
        # the repository is read-only there: no cache, no hypothesis database
        f"exec {VENV_BIN}/python -m pytest -p no:cacheprovider -p no:hypothesispytest "
        f"--timeout={TEST_TIMEOUT_S} -v -m kernel --durations=15 --junitxml={junit} "
        f"{' '.join(tests)}\n"
    )


def boot(image: Path, tests: list[str], scratch: Path) -> Result:
    """Boot `image`, run the tests in it, read back their JUnit report. A boot that
    never reaches pytest, or a guest that dies during the tests (a status that is not
    pytest's), is tried again (BOOT_TRIES)."""
    kernel = image.name.removeprefix("vmlinuz-")
    junit = scratch / f"{kernel}.xml"
    script = scratch / f"{kernel}.sh"
    script.write_text(guest_script(tests, junit))
    argv = [
        str(VENV_BIN / "vng"), "--disable-kvm", "--run", str(image), "--user", "root",
        "--cpus", "2", "--memory", "3G", f"--rwdir={scratch}", "--cwd", str(REPO),
        "--exec", f"sh {script}",
    ]  # fmt: skip
    start = time.monotonic()
    result = Result(kernel)
    for attempt in range(1, BOOT_TRIES + 1):
        print(f"== {kernel}: booting under TCG (5-10x slower than the host)", flush=True)
        guest = Guest(argv)
        status = guest.run()
        result.tail = list(guest.tail)
        if guest.hung == "boot" and attempt < BOOT_TRIES:
            print(f"== {kernel}: no test started in {BOOT_TIMEOUT_S} s: booting again", flush=True)
            continue
        if not guest.hung and status not in (0, 1) and attempt < BOOT_TRIES:
            print(f"== {kernel}: the guest ended with status {status}: booting again", flush=True)
            continue
        if guest.hung == "boot":
            result.error = f"no test started in {BOOT_TIMEOUT_S} s, {BOOT_TRIES} boots"
        elif guest.hung:
            result.error = f"the guest run took over {GUEST_TIMEOUT_S} s"
        elif status not in (0, 1):  # pytest: 1 = tests failed, read them below
            result.error = f"the guest run ended with status {status}"
        break
    result.seconds = time.monotonic() - start
    if junit.exists():
        read_junit(junit, result)
    elif not result.error:
        result.error = "the guest wrote no test report"
    return result


class Guest:
    """One vng run, its console relayed line by line, killed when it hangs: before
    pytest starts (`hung` "boot") or in all (`hung` "run")."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.hung = ""
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.started = threading.Event()  # pytest collected the tests

    def run(self) -> int:
        env = dict(os.environ, PATH=f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        # The guest's console is relayed through a pipe: QEMU opens a file it is given as
        # its output anew and truncates it, losing what came before.
        # A session of its own: vng, virtme-run and QEMU end together (timeout, Ctrl-C).
        proc = subprocess.Popen(
            self.argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True,
        )  # fmt: skip

        def end(why: str) -> None:
            if proc.poll() is None:
                self.hung = self.hung or why
                os.killpg(proc.pid, signal.SIGKILL)

        def watch() -> None:
            if not self.started.wait(BOOT_TIMEOUT_S):
                end("boot")

        timer = threading.Timer(GUEST_TIMEOUT_S, end, args=("run",))
        timer.start()
        threading.Thread(target=watch, daemon=True).start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip()
                self.tail.append(line)
                if re.search(r"collected \d+ item", line):
                    self.started.set()
                print(f"   {line}", flush=True)
        except BaseException:  # Ctrl-C: no QEMU left behind
            end("run")
            raise
        finally:
            timer.cancel()
            self.started.set()  # the watch ends
            proc.stdout.close()  # type: ignore[union-attr]
        return proc.wait()


def read_junit(path: Path, result: Result) -> None:
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            result.failed.append(test_id)
        elif case.find("skipped") is not None:
            result.skipped.append(test_id)
        else:
            result.passed.append(test_id)


def missing_strategies(result: Result) -> list[str]:
    """Each tool's strategies the kernel allows that no passed test exercised."""
    allowed = set(GUEST_FEATURES.split(","))
    seen = result.strategies()
    return [
        f"{tool} {s.name}"
        for tool, strategies in TOOL_STRATEGIES.items()
        for s in strategies
        if set(s.needs) <= allowed and s.name not in seen.get(tool, set())
    ]


def markdown(results: list[Result]) -> str:
    """The README's "Tested kernels" rows."""
    rows = [
        "| kernel | strategies exercised (exact counts) | tests passed |",
        "| --- | --- | --- |",
    ]
    for r in results:
        ran = sorted(r.strategies().items())
        strategies = "; ".join(f"{tool}: {', '.join(sorted(names))}" for tool, names in ran)
        total = len(r.passed) + len(r.failed) + len(r.skipped)
        rows.append(f"| {r.kernel} | {strategies} | {len(r.passed)} of {total} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("images", nargs="+", type=Path, help="kernel images (/boot/vmlinuz-...)")
    parser.add_argument("--tests", nargs="+", default=list(DEFAULT_TESTS), help="pytest node ids")
    args = parser.parse_args(argv)
    if shutil.which("vng", path=str(VENV_BIN)) is None:
        print("error: vng is missing: make test-kernels installs virtme-ng", file=sys.stderr)
        return 2
    for image in args.images:
        if not image.is_file():
            fix = "apt-get install linux-image-amd64 linux-image-6.12-amd64"
            print(f"error: no kernel image {image} ({fix})", file=sys.stderr)
            return 2
    results = []
    with tempfile.TemporaryDirectory(prefix="meridian-kernels-") as scratch:
        for image in args.images:
            results.append(boot(image, args.tests, Path(scratch)))
    ok = True
    for r in results:
        missing = missing_strategies(r) if not r.error else []
        print(
            f"== {r.kernel}: {len(r.passed)} passed, {len(r.failed)} failed, "
            f"{len(r.skipped)} skipped in {r.seconds:.0f} s"
        )
        for line in [*r.failed, r.error, *(f"not exercised: {m}" for m in missing)]:
            if line:
                print(f"   {line}")
        if r.failed or r.error:
            print(f"   the guest's last {len(r.tail)} console lines:")
            for line in r.tail:
                print(f"   | {line}")
        ok = ok and not (r.failed or r.error or missing or not r.passed)
    print(markdown(results))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
