"""--cgroup's one resolver (meridian.cgroup), which io and syscalls share: a directory
under the cgroup2 mount or a /proc/PID/cgroup path; the id is the directory's inode
and the depth counts components below the root; bad input is one line that names the
mount."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from meridian.cgroup import Cgroup, resolve
from meridian.errors import UsageError


@pytest.fixture
def hierarchy(tmp_path: Path) -> tuple[Path, Path]:
    """A fake cgroup2 mount at cg2 (cg2/a/b, and cg2/plain without cgroup.procs) and
    the mountinfo that names it."""
    root = tmp_path / "cg2"
    leaf = root / "a" / "b"
    leaf.mkdir(parents=True)
    for d in (root, root / "a", leaf):
        (d / "cgroup.procs").write_text("")
    (root / "plain").mkdir()
    info = tmp_path / "mountinfo"
    info.write_text(
        "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
        f"41 31 0:38 / {root} rw,relatime - cgroup2 cgroup2 rw\n"
    )
    return root, info


def test_paths_resolve_to_the_directorys_inode_and_depth(hierarchy: tuple[Path, Path]) -> None:
    root, info = hierarchy
    leaf = root / "a" / "b"
    want = Cgroup(leaf.stat().st_ino, 2, str(leaf))
    assert resolve(str(leaf), str(info)) == want  # under the mount
    assert resolve("/a/b", str(info)) == want  # as /proc/PID/cgroup shows it
    assert resolve("a", str(info)) == Cgroup((root / "a").stat().st_ino, 1, str(root / "a"))
    assert resolve("/", str(info)) == Cgroup(root.stat().st_ino, 0, str(root))


def test_what_is_not_a_cgroup_is_one_line_naming_the_mount(
    hierarchy: tuple[Path, Path], tmp_path: Path
) -> None:
    root, info = hierarchy
    for bad in ("/nope", "/plain", str(tmp_path)):
        with pytest.raises(UsageError) as exc:
            resolve(bad, str(info))
        assert str(exc.value) == (
            f"--cgroup: {bad!r} is not a cgroup v2 directory (cgroup2 is mounted at {root})"
        )
    empty = tmp_path / "empty"
    empty.write_text("")
    with pytest.raises(UsageError) as exc:
        resolve("/a", str(empty))
    assert str(exc.value) == (
        "--cgroup needs cgroup v2, and no cgroup2 file system is mounted "
        "(mount -t cgroup2 none /sys/fs/cgroup)"
    )


@pytest.mark.parametrize("tool", ["io", "syscalls"])
def test_io_and_syscalls_resolve_cgroup_alike(tool: str) -> None:
    """Both tools take this host's root cgroup, and refuse a directory that is not one
    with the same line."""
    from meridian.cgroup import cgroup2_mounts
    from meridian.cli import build_parser

    if not cgroup2_mounts():
        pytest.skip("no cgroup2 mount on this host")
    parser = build_parser()
    module = __import__(f"meridian.tools.{tool}.cli", fromlist=["options_from_args"])
    args: argparse.Namespace = parser.parse_args([tool, "--cgroup", "/"])
    opts = module.options_from_args(args)
    root = resolve("/")
    assert opts.cgroup == (root.id, 0)
    bad = parser.parse_args([tool, "--cgroup", "/no/such/cgroup-here"])
    with pytest.raises(UsageError, match="'/no/such/cgroup-here' is not a cgroup v2 directory"):
        module.options_from_args(bad)
