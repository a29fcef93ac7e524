"""The kernel matrix's guest watch (tests/kernel_matrix.py), with a shell command in
place of vng: a boot that never reaches pytest and a run that hangs are both killed,
and the console's last lines are kept for the report. And the guest's environment:
numpy without its run-time SIMD targets."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import kernel_matrix
import pytest


def test_a_boot_that_never_reaches_pytest_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_matrix, "BOOT_TIMEOUT_S", 1.0)
    guest = kernel_matrix.Guest(["sh", "-c", "echo booting; exec sleep 60"])
    t0 = time.monotonic()
    guest.run()
    assert guest.hung == "boot" and time.monotonic() - t0 < 30
    assert list(guest.tail) == ["booting"]


def test_a_run_that_hangs_is_killed_and_its_tail_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_matrix, "BOOT_TIMEOUT_S", 1.0)
    monkeypatch.setattr(kernel_matrix, "GUEST_TIMEOUT_S", 3.0)
    monkeypatch.setattr(kernel_matrix, "TAIL_LINES", 3)
    script = "echo collected 2 items; for i in 1 2 3 4; do echo line $i; done; exec sleep 60"
    guest = kernel_matrix.Guest(["sh", "-c", script])
    guest.run()
    assert guest.hung == "run"  # pytest started: not a boot hang
    assert list(guest.tail) == ["line 2", "line 3", "line 4"]


def test_a_run_that_ends_is_not_hung(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_matrix, "BOOT_TIMEOUT_S", 5.0)
    guest = kernel_matrix.Guest(["sh", "-c", "echo collected 1 item; exit 1"])
    assert guest.run() == 1 and guest.hung == ""


def test_a_guest_that_dies_during_the_tests_is_booted_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    statuses = [255, 0]  # vng's status when the guest died; then a run that passed

    class FakeGuest:
        def __init__(self, argv: list[str]) -> None:
            self.hung, self.tail = "", ["collected 1 item"]

        def run(self) -> int:
            status = statuses.pop(0)
            if status == 0:  # the second boot writes its report
                (tmp_path / "9.9.xml").write_text(
                    '<testsuite><testcase classname="tests.test_x" name="test_y"/></testsuite>'
                )
            return status

    monkeypatch.setattr(kernel_matrix, "Guest", FakeGuest)
    result = kernel_matrix.boot(Path("/boot/vmlinuz-9.9"), ["tests/test_x.py"], tmp_path)
    assert statuses == [] and result.error == ""
    assert result.passed == ["tests.test_x::test_y"]


def test_the_guests_run_numpy_without_its_simd_targets() -> None:
    """What the guest script exports turns off every target numpy dispatches to at run
    time (QEMU 7.2's TCG sorts wrongly with AVX2: kernel_matrix.numpy_dispatch); numpy
    ignores a name it does not know, so a renamed target would go unnoticed but here."""
    script = kernel_matrix.guest_script(["t.py"], Path("/nonexistent/t.xml"))
    (line,) = [x for x in script.splitlines() if "NPY_DISABLE_CPU_FEATURES=" in x]
    value = line.split("=", 1)[1].strip("'")
    on = (
        "from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__ as f;"
        "print(sorted(t for t in __cpu_dispatch__ if f.get(t)))"
    )
    env = {**os.environ, "NPY_DISABLE_CPU_FEATURES": value}
    out = subprocess.run([sys.executable, "-c", on], env=env, capture_output=True, text=True)
    assert value and out.returncode == 0 and out.stdout.strip() == "[]", (value, out)
