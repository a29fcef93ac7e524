from __future__ import annotations

from pathlib import Path

import pytest

from meridian.proc import dev_major, dev_minor, device_name, kernel_dev, parse_device, thread_slots


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
