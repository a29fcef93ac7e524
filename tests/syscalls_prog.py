"""What the syscalls kernel tests share: a small C program with a known syscall
sequence (PROG: opens a file, reads it, fails to open a missing one, renames a file),
`meridian syscalls` run to its end, and readers of its output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from children import build_c, patience

PROG = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	char buf[64];
	int fd = open(argv[1], O_RDONLY);

	if (fd < 0 || read(fd, buf, sizeof(buf)) < 0 || close(fd))
		return 1;
	if (open(argv[2], O_RDONLY) >= 0)
		return 2;
	if (rename(argv[3], argv[4]))
		return 3;
	return 0;
}
"""
CONTENT = b"hello meridian\n"  # 15 bytes


def build_prog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PROG built once for a test module (its `prog` fixture)."""
    return build_c(tmp_path_factory.mktemp("prog").resolve(), "prog", PROG, "-O1")


def meridian(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "meridian", "syscalls", *args],
        capture_output=True,
        text=True,
        timeout=patience(60),
        env=env,
    )


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line]


def path_and_outcome(line: str) -> tuple[str, str]:
    """An openat line's path and its fd or errno name: strace writes flags and errors
    its own way (O_RDONLY|O_CLOEXEC, -1 ENOENT (No such file or directory))."""
    result = line.rsplit(" = ", 1)[1].split()
    return line.split(", ")[1], result[1] if result[0].startswith("-") else result[0]
