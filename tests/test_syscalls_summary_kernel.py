"""`meridian syscalls -c` against strace -c -f on the same commands, `git status` in a
small real repository and a Python import: the calls and errors of every syscall
equal strace's, with every syscall traced (--all) and with the default file set; and
a fork and a handled signal, whose ends are not one call each."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from children import patience
from strategies import every, run_or_skip

from meridian.tools.syscalls import STRATEGIES
from meridian.tools.syscalls.numbers import FILE_SYSCALLS

pytestmark = pytest.mark.kernel

Counts = dict[str, tuple[int, int]]  # syscall: (calls, errors)

# The default set traces mmap only on files; strace counts the anonymous maps too.
NOT_IN_THE_DEFAULT_SET = {"mmap"}
COMMANDS = {
    "git status": ["git", "status"],
    "python import": ["python3", "-c", "import json"],
    # a forked child's return from clone is not a call; rt_sigreturn's end is never
    # seen (restoring the signal frame resets the syscall number)
    "a fork and a handled signal": [
        "python3", "-c", "import os, signal; pid = os.fork(); pid or os._exit(0); "
        "os.waitpid(pid, 0); signal.signal(10, print); os.kill(os.getpid(), 10)",
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A git repository with a commit, a changed file and an untracked one, and the
    environment the commands run in: no locale, no user or system git config."""
    if shutil.which("strace") is None or shutil.which("git") is None:
        pytest.skip("strace or git is not installed (make deps)")
    top = tmp_path_factory.mktemp("summary").resolve()
    work = top / "repo"
    work.mkdir()
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(top), "GIT_CONFIG_NOSYSTEM": "1"}
    for who in ("AUTHOR", "COMMITTER"):
        env |= {f"GIT_{who}_NAME": "m", f"GIT_{who}_EMAIL": "m@example.org"}

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=work, env=env, check=True)

    git("init", "-q", ".")
    for name in ("a.txt", "b.txt", "c.txt"):
        (work / name).write_text(name)
        os.utime(work / name, (1_600_000_000, 1_600_000_000))  # never racily clean
    git("add", ".")
    git("commit", "-q", "-m", "three files")
    (work / "a.txt").write_text("changed")
    os.utime(work / "a.txt", (1_600_000_100, 1_600_000_100))
    (work / "untracked.txt").write_text("new")
    return work, env


def strace_counts(command: list[str], cwd: Path, env: dict[str, str], out: Path) -> Counts:
    subprocess.run(
        ["strace", "-f", "-qq", "-c", "-o", str(out), *command],
        cwd=cwd, env=env, capture_output=True, check=True, timeout=patience(60),
    )  # fmt: skip
    counts: Counts = {}
    for line in out.read_text().splitlines():
        fields = line.split()
        if len(fields) in (5, 6) and fields[0][0].isdigit() and fields[-1] != "total":
            counts[fields[-1]] = (int(fields[3]), int(fields[4]) if len(fields) == 6 else 0)
    return counts


def meridian_counts(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[Counts, Any]:
    run = subprocess.run(
        [sys.executable, "-m", "meridian", "syscalls", "-c", "--json", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=patience(60),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    table = json.loads(run.stdout.splitlines()[-1])  # after the command's own output
    return {r["syscall"]: (r["calls"], r["errors"]) for r in table["syscalls"]}, table


@pytest.mark.parametrize("strategy", every(STRATEGIES))
@pytest.mark.parametrize("what", list(COMMANDS))
def test_counts_and_errors_equal_strace_c(
    repo: tuple[Path, dict[str, str]], tmp_path: Path, what: str, strategy: str
) -> None:
    run_or_skip(STRATEGIES, strategy)
    work, env = repo
    command = COMMANDS[what]
    # Once untraced first: git refreshes its index, Python writes its bytecode caches,
    # so each traced run finds the same state.
    subprocess.run(command, cwd=work, env=env, capture_output=True, check=True)
    want = strace_counts(command, work, env, tmp_path / "strace.txt")
    assert sum(calls for calls, _ in want.values()) > 100 and any(e for _, e in want.values())

    every_call, table = meridian_counts(
        ["--strategy", strategy, "--all", "--", *command], work, env
    )
    assert set(table["lost"].values()) == {0}, table["lost"]
    assert every_call == want

    files, table = meridian_counts(["--strategy", strategy, "--", *command], work, env)
    assert set(table["lost"].values()) == {0}, table["lost"]
    assert set(files) <= FILE_SYSCALLS
    in_set = FILE_SYSCALLS - NOT_IN_THE_DEFAULT_SET
    assert {n: c for n, c in files.items() if n in in_set} == {
        n: c for n, c in want.items() if n in in_set
    }
    assert table["total"]["calls"] == sum(calls for calls, _ in files.values())


STAT_ON_GO = """
import os, sys
print("ready", flush=True)
sys.stdin.readline()
for _ in range(50):
    os.path.exists("/nonexistent/meridian")
print("done", flush=True)
sys.stdin.readline()
"""


def test_ctrl_c_prints_the_table_and_detaches() -> None:
    """-c -p PID until Ctrl-C: the table of what the process did meanwhile (its 50
    failed stats, exactly), exit 0, and the process goes on untouched."""
    target = subprocess.Popen(
        [sys.executable, "-c", STAT_ON_GO], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert target.stdin is not None and target.stdout is not None
    assert target.stdout.readline() == "ready\n"
    tracer = subprocess.Popen(
        [sys.executable, "-m", "meridian", "syscalls", "-c", "-e", "newfstatat",
         "-p", str(target.pid)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert tracer.stderr is not None
        assert tracer.stderr.readline().startswith("Tracing")  # attached
        target.stdin.write("go\n")
        target.stdin.flush()
        assert target.stdout.readline() == "done\n"
        tracer.send_signal(signal.SIGINT)
        out, err = tracer.communicate(timeout=patience(30))
        assert tracer.returncode == 0, err
        assert target.poll() is None  # still running, not traced any more
        rows = [line.split() for line in out.splitlines()]
        assert ["50", "50", "newfstatat"] in [r[3:] for r in rows]
        assert rows[-1][3:] == ["50", "50", "total"]
        assert "0 lost (ring buffer full)" in err
    finally:
        for p in (tracer, target):
            p.kill()
            p.wait()
        for f in (target.stdin, target.stdout):
            f.close()
