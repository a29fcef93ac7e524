"""`meridian syscalls` names every fd as /proc/PID/fd does, decodes output arrays and
structs, and shows anonymous mmap when asked. A C program (built here with gcc) makes
a pipe2, a socketpair, an eventfd, an epoll fd, a timerfd, a pidfd, a memfd and a file
it then unlinks, writes to the ones that take writes, fstats the memfd, maps anonymous
memory and the memfd, closes them all, and prints what the kernel told it (readlink of
/proc/self/fd/N, the fds pipe2 and socketpair returned, st_mode and st_size, the mapped
addresses): that is the ground truth the capture is compared with, exactly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from children import build_c

from meridian.tools.syscalls.decode import decode_args
from meridian.tools.syscalls.out_params import file_mode, output_text

PROG = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <unistd.h>

static void name(const char *what, int fd)
{
	char link[64], buf[512];
	ssize_t n;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, buf, sizeof(buf) - 1);
	if (n < 0)
		exit(10);
	buf[n] = 0;
	printf("fd %s %d %s\n", what, fd, buf);
}

int main(int argc, char **argv)
{
	int p[2], sv[2], efd, ep, tfd, pfd, mfd, del;
	unsigned long long one = 1;
	struct stat st;
	struct statx sx;
	void *anon, *map;

	if (!freopen(argv[1], "w", stdout))
		return 1;
	setvbuf(stdout, NULL, _IONBF, 0);
	if (pipe2(p, O_CLOEXEC) || socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		return 2;
	efd = eventfd(0, 0);
	ep = epoll_create1(0);
	tfd = timerfd_create(CLOCK_MONOTONIC, 0);
	pfd = syscall(SYS_pidfd_open, getpid(), 0);
	mfd = memfd_create("meridian-test", 0);
	del = open(argv[2], O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (efd < 0 || ep < 0 || tfd < 0 || pfd < 0 || mfd < 0 || del < 0 || unlink(argv[2]))
		return 3;
	printf("pipe2 %d %d\n", p[0], p[1]);
	printf("socketpair %d %d\n", sv[0], sv[1]);
	name("pipe_r", p[0]);
	name("pipe_w", p[1]);
	name("sock0", sv[0]);
	name("sock1", sv[1]);
	name("eventfd", efd);
	name("epoll", ep);
	name("timerfd", tfd);
	name("pidfd", pfd);
	name("memfd", mfd);
	name("deleted", del);
	if (write(p[1], "abc", 3) != 3 || write(sv[0], "abcd", 4) != 4)
		return 4;
	if (write(efd, &one, 8) != 8 || write(mfd, "hello", 5) != 5)
		return 4;
	if (write(del, "xy", 2) != 2)
		return 4;
	if (fstat(mfd, &st))
		return 5;
	printf("fstat %d %o %lld\n", mfd, st.st_mode, (long long)st.st_size);
	if (statx(mfd, "", AT_EMPTY_PATH, STATX_BASIC_STATS, &sx))
		return 5;
	printf("statx %d %o %lld\n", mfd, sx.stx_mode, (long long)sx.stx_size);
	anon = mmap(NULL, 12293, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	map = mmap(NULL, 5, PROT_READ, MAP_SHARED, mfd, 0);
	if (anon == MAP_FAILED || map == MAP_FAILED)
		return 6;
	printf("anon %p\n", anon);
	printf("map %p\n", map);
	close(p[0]); close(p[1]); close(sv[0]); close(sv[1]); close(efd); close(ep);
	close(tfd); close(pfd); close(mfd); close(del);
	return 0;
}
"""

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def prog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_c(tmp_path_factory.mktemp("fdnames").resolve(), "prog", PROG, "-O1")


class Truth:
    """What the program printed: fd names by role, pipe2/socketpair fds, fstat, maps."""

    def __init__(self, text: str) -> None:
        self.names: dict[str, tuple[int, str]] = {}
        self.words: dict[str, list[str]] = {}
        for line in text.splitlines():
            w = line.split(" ")
            if w[0] == "fd":
                self.names[w[1]] = (int(w[2]), " ".join(w[3:]))
            else:
                self.words[w[0]] = w[1:]


def run(prog: Path, tmp: Path, *args: str) -> tuple[list[dict[str, Any]], Truth]:
    out, victim = tmp / "out.txt", tmp / "victim.txt"
    res = subprocess.run(
        [sys.executable, "-m", "meridian", "syscalls", "--json", *args, "--",
         str(prog), str(out), str(victim)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "0 lost" in res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines() if line]
    mine = [r for r in rows if r["comm"] == prog.name]
    assert len({r["pid"] for r in mine}) == 1
    return mine, Truth(out.read_text())


def calls_on(rows: list[dict[str, Any]], name: str, fd: int) -> list[dict[str, Any]]:
    return [r for r in rows if r["syscall"] == name and r["args"][0].startswith(f"{fd}<")]


@pytest.mark.parametrize("strategy", ["tp_btf", "tracepoint"])
def test_fd_names_equal_proc_readlink(prog: Path, tmp_path: Path, strategy: str) -> None:
    rows, truth = run(prog, tmp_path, "--strategy", strategy, "-e",
                      "pipe2,socketpair,write,close,fstat,newfstatat,statx,mmap")  # fmt: skip
    assert set(truth.names) == {
        "pipe_r", "pipe_w", "sock0", "sock1", "eventfd", "epoll", "timerfd", "pidfd",
        "memfd", "deleted",
    }  # fmt: skip
    # The kernel's own names (the readlinks) are what /proc shows for these kinds.
    link = {k: v[1] for k, v in truth.names.items()}
    assert link["pipe_r"].startswith("pipe:[") and link["sock0"].startswith("socket:[")
    assert link["deleted"] == f"{tmp_path.resolve() / 'victim.txt'} (deleted)"
    for role, (fd, name) in truth.names.items():
        closes = calls_on(rows, "close", fd)
        assert closes, role
        assert closes[-1]["fd_path"] == name, role
        assert closes[-1]["args"] == [f"{fd}<{name}>"]
    for role in ("pipe_w", "sock0", "eventfd", "memfd", "deleted"):
        fd, name = truth.names[role]
        writes = calls_on(rows, "write", fd)
        assert len(writes) == 1 and writes[0]["fd_path"] == name, role

    # pipe2's and socketpair's arrays: the fds the program got.
    p0, p1 = truth.words["pipe2"]
    (pipe2,) = [r for r in rows if r["syscall"] == "pipe2"]
    assert pipe2["args"] == [f"[{p0}, {p1}]", "O_CLOEXEC"] and pipe2["result"] == 0
    s0, s1 = truth.words["socketpair"]
    (sp,) = [r for r in rows if r["syscall"] == "socketpair"]
    assert sp["args"] == ["AF_UNIX", "SOCK_STREAM", "0", f"[{s0}, {s1}]"]

    # fstat of the memfd: st_mode and st_size as the program's own fstat saw them.
    sfd, mode, size = truth.words["fstat"]
    assert int(mode, 8) & 0o170000 == 0o100000  # a regular file
    stat_text = f"{{st_mode=S_IFREG|0{int(mode, 8) & 0o777:03o}, st_size={size}, ...}}"
    (st,) = [
        r
        for r in rows
        if r["syscall"] in ("fstat", "newfstatat") and r["args"][0].startswith(f"{sfd}<")
    ]
    assert stat_text in st["args"] and size == "5"
    xfd, xmode, xsize = truth.words["statx"]
    statx_text = f"{{stx_mode=S_IFREG|0{int(xmode, 8) & 0o777:03o}, stx_size={xsize}, ...}}"
    (sx,) = [r for r in rows if r["syscall"] == "statx" and r["args"][0].startswith(f"{xfd}<")]
    assert statx_text in sx["args"] and xsize == "5"

    # mmap asked for by name: the anonymous map too, with fd -1 and its length.
    maps = {r["result_text"]: r["args"] for r in rows if r["syscall"] == "mmap"}
    anon = maps[truth.words["anon"][0]]
    assert anon == ["NULL", "12293", "PROT_READ|PROT_WRITE", "MAP_PRIVATE|MAP_ANONYMOUS", "-1", "0"]
    fmap = maps[truth.words["map"][0]]
    assert fmap[4] == f"{truth.names['memfd'][0]}<{link['memfd']}>"


def test_default_set_leaves_anonymous_mmap_out(prog: Path, tmp_path: Path) -> None:
    rows, truth = run(prog, tmp_path)
    maps = [r for r in rows if r["syscall"] == "mmap"]
    results = {r["result_text"] for r in maps}
    assert truth.words["map"][0] in results  # a file mapping is shown
    assert truth.words["anon"][0] not in results
    assert all(r["args"][4] != "-1" for r in maps)
    assert not [r for r in rows if r["syscall"] in ("pipe2", "socketpair")]  # not file calls
    fd, name = truth.names["pipe_w"]
    assert calls_on(rows, "write", fd)[0]["args"][0] == f"{fd}<{name}>"


def test_output_texts() -> None:
    assert output_text("fds", (3).to_bytes(4, "little") + (4).to_bytes(4, "little")) == "[3, 4]"
    stat = (0o100644).to_bytes(4, "little") + (123).to_bytes(8, "little")
    assert output_text("statbuf", stat) == "{st_mode=S_IFREG|0644, st_size=123, ...}"
    statx = (0o41777).to_bytes(2, "little") + (4096).to_bytes(8, "little")
    assert output_text("statxbuf", statx) == "{stx_mode=S_IFDIR|S_ISVTX|0777, stx_size=4096, ...}"
    assert output_text("fds", b"\0" * 3) is None  # not what the kind sends
    assert file_mode(0o20620) == "S_IFCHR|0620"
    raw = (0x7FFD0000, 0o2000000)
    assert decode_args("pipe2", raw, {}) == ("0x7ffd0000", "O_CLOEXEC")
    out = (5).to_bytes(4, "little", signed=True) + (6).to_bytes(4, "little", signed=True)
    assert decode_args("pipe2", raw, {}, output=out) == ("[5, 6]", "O_CLOEXEC")
