from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from meridian.proc import (
    ProcStat,
    dev_major,
    dev_minor,
    device_name,
    kernel_data_addresses,
    kernel_dev,
    parse_device,
    parse_stat,
    proc_start,
    proc_stat,
    thread_slots,
)


@pytest.fixture
def sys_root(tmp_path: Path) -> Path:
    """A /sys with two disks: vda (253:0) and loop0 (7:0, no uevent name)."""
    for name, mm in (("vda", "253:0"), ("loop0", "7:0")):
        d = tmp_path / "devices" / "virtual" / "block" / name
        d.mkdir(parents=True)
        (d / "dev").write_text(mm + "\n")
        if name == "vda":
            (d / "uevent").write_text(f"MAJOR=253\nMINOR=0\nDEVNAME={name}\nDEVTYPE=disk\n")
        (tmp_path / "class" / "block").mkdir(parents=True, exist_ok=True)
        (tmp_path / "class" / "block" / name).symlink_to(d)
        (tmp_path / "dev" / "block").mkdir(parents=True, exist_ok=True)
        (tmp_path / "dev" / "block" / mm).symlink_to(d)
    return tmp_path


def test_kernel_dev_round_trip() -> None:
    dev = kernel_dev(259, 3)
    assert dev == (259 << 20) | 3
    assert (dev_major(dev), dev_minor(dev)) == (259, 3)


def test_device_name_from_uevent_and_from_link(sys_root: Path) -> None:
    assert device_name(kernel_dev(253, 0), sys_root) == "vda"
    assert device_name(kernel_dev(7, 0), sys_root) == "loop0"


def test_device_name_without_sys_dev_block(sys_root: Path) -> None:
    """A pod's /sys: podman hides /sys/dev/block, /sys/class/block still names disks."""
    shutil.rmtree(sys_root / "dev")
    assert device_name(kernel_dev(253, 0), sys_root) == "vda"
    assert device_name(kernel_dev(7, 0), sys_root) == "loop0"


def test_unknown_device_name_is_major_minor(sys_root: Path) -> None:
    assert device_name(kernel_dev(8, 16), sys_root) == "8:16"


@pytest.mark.parametrize("spec", ["loop0", "/dev/loop0", "7:0"])
def test_parse_device(spec: str, sys_root: Path) -> None:
    assert parse_device(spec, sys_root) == kernel_dev(7, 0)


@pytest.mark.parametrize("spec", ["sdz", "7:x", "/dev/nope"])
def test_parse_device_errors_name_the_input(spec: str, sys_root: Path) -> None:
    with pytest.raises(ValueError, match="device"):
        parse_device(spec, sys_root)


@pytest.mark.parametrize(
    ("pid_max", "slots"),
    [("32768\n", 32768), ("32769", 65536), ("4194304", 1 << 18), ("", 1 << 18), (None, 1 << 18)],
)
def test_thread_slots_cover_pid_max(tmp_path: Path, pid_max: str | None, slots: int) -> None:
    if pid_max is not None:
        (tmp_path / "sys/kernel").mkdir(parents=True)
        (tmp_path / "sys/kernel/pid_max").write_text(pid_max)
    assert thread_slots(tmp_path) == slots


def stat_text(comm: str, start: int = 4242, code: int = 0x55AA0000, stack: int = 0x7FFD0000) -> str:
    """A /proc/PID/stat line as the kernel writes it: field N is fields[N - 1]."""
    fields = ["1234", f"({comm})", "S"] + ["0"] * 49
    fields[21], fields[25], fields[27] = str(start), str(code), str(stack)
    return " ".join(fields) + "\n"


@pytest.mark.parametrize("comm", ["bash", "tmux: server", "a) b (c", ")", "x) 1 2 3 4 5 6 7 (", ""])
def test_stat_comm_may_hold_spaces_and_parentheses(comm: str) -> None:
    assert parse_stat(stat_text(comm).encode()) == ProcStat(4242, 0x55AA0000, 0x7FFD0000)


def test_stat_without_code_and_stack_fields() -> None:
    """An old or truncated line: the start time is enough."""
    short = " ".join(stat_text("sh").split()[:22])
    assert parse_stat(short.encode()) == ProcStat(4242, 0, 0)


NOT_STAT = [
    b"",
    b"1234 (sh S 0 0",  # no end of the comm
    b"1234 (sh) S 0 0",  # too few fields
    b"1234 sh) S" + b" 0" * 30,  # no start of the comm
    stat_text("sh").replace("4242", "x").encode(),  # a start time that is no number
]


@pytest.mark.parametrize("raw", NOT_STAT)
def test_stat_that_is_not_one_is_none(raw: bytes) -> None:
    assert parse_stat(raw) is None


def test_proc_stat_reads_a_process_and_none_when_gone(tmp_path: Path) -> None:
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "stat").write_text(stat_text("my (odd) name", start=(1 << 32) + 5))
    assert proc_stat(77, tmp_path) == ProcStat((1 << 32) + 5, 0x55AA0000, 0x7FFD0000)
    assert proc_start(77, tmp_path) == 5  # the 32 bits io's kernel keys carry
    assert proc_stat(78, tmp_path) is None and proc_start(78, tmp_path) is None


def test_proc_stat_of_this_process() -> None:
    stat = proc_stat(os.getpid())
    assert stat is not None and stat.start > 0


def test_kernel_data_addresses_take_kernel_symbols_only(tmp_path: Path) -> None:
    """rename_lock of the kernel, not a module's symbol of that name; 0 for a symbol
    kallsyms does not list (no CONFIG_KALLSYMS_ALL), for hidden addresses and for a
    missing file."""
    kallsyms = tmp_path / "kallsyms"
    kallsyms.write_text(
        "ffffffff81000000 T _stext\n"
        "ffffffffc0001000 d rename_lock\t[some_module]\n"
        "ffffffff8b609600 D rename_lock\n"
    )
    got = kernel_data_addresses(("rename_lock", "mount_lock"), kallsyms)
    assert got == {"rename_lock": 0xFFFFFFFF8B609600, "mount_lock": 0}
    kallsyms.write_text("0000000000000000 D rename_lock\n")  # kptr_restrict
    assert kernel_data_addresses(("rename_lock",), kallsyms) == {"rename_lock": 0}
    assert kernel_data_addresses(("rename_lock",), tmp_path / "none") == {"rename_lock": 0}
