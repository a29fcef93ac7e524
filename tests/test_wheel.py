"""The wheel a host installs (`make wheel`, deploy/wheel.sh; README.md, "On a host
(systemd)"): it holds every BPF object, the script refuses one that lacks any, and
installed into a fresh venv with the README's extras it runs where only it is: no
clang, bpftool or kernel headers, no checkout to import from.

The wheel is build/dist's, built by the script when missing or older than the sources
or objects in it; the venv is made once a session."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from children import patience, reap, wait_attached

from meridian import __version__

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "deploy" / "wheel.sh"
DIST = ROOT / "build" / "dist"
SOURCES = sorted((ROOT / "bpf").glob("*.bpf.c"))
OBJDIR = ROOT / "src" / "meridian" / "bpfobj"
WHEEL = DIST / f"meridian_ebpf-{__version__}-py3-none-any.whl"
# What a host has without a build tool chain: the kernel's and C's headers and the
# checkout itself are empty directories for the installed meridian.
HIDDEN = [ROOT, Path("/usr/src"), Path("/usr/include"), Path("/lib/modules", os.uname().release)]


def objects(sources: list[Path]) -> list[str]:
    """bpf/NAME.bpf.c -> NAME.bpf.o"""
    return [s.name.removesuffix(".c") + ".o" for s in sources]


def build(python: str, dist: Path, script: Path = SCRIPT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([script, python, dist], capture_output=True, text=True)


@pytest.fixture(scope="session")
def wheel() -> Path:
    inputs = [ROOT / "pyproject.toml", *OBJDIR.glob("*.bpf.o")]
    inputs += [p for p in (ROOT / "src").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    newest = max(p.stat().st_mtime for p in inputs)
    if not WHEEL.exists() or WHEEL.stat().st_mtime < newest:
        got = build(sys.executable, DIST)
        assert got.returncode == 0, got.stderr
        assert got.stdout.strip() == str(WHEEL)
    return WHEEL


def test_the_wheel_holds_every_bpf_object_as_built(wheel: Path) -> None:
    assert SOURCES
    with zipfile.ZipFile(wheel) as z:
        held = {n.removeprefix("meridian/bpfobj/") for n in z.namelist() if "/bpfobj/" in n}
        assert held == set(objects(SOURCES))
        for name in held:
            assert z.read(f"meridian/bpfobj/{name}") == (OBJDIR / name).read_bytes(), name


def test_the_script_refuses_a_wheel_without_an_object(tmp_path: Path) -> None:
    """A checkout where `make bpf` left io.bpf.o out: one line, exit 2, no wheel."""
    copy = tmp_path / "checkout"
    (copy / "deploy").mkdir(parents=True)
    shutil.copy2(SCRIPT, copy / "deploy")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, copy)
    shutil.copytree(ROOT / "bpf", copy / "bpf")
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "io.bpf.o")
    shutil.copytree(ROOT / "src", copy / "src", ignore=skip)
    got = build(sys.executable, tmp_path / "dist", copy / "deploy" / "wheel.sh")
    assert got.returncode == 2, got.stderr
    refusal = "error: the wheel has no io.bpf.o: run `make bpf` first"
    assert got.stderr.splitlines() == [refusal], got.stderr
    assert got.stdout == "" and list((tmp_path / "dist").iterdir()) == []


def readme_install() -> tuple[str, str]:
    """The wheel (its path in the checkout) and the extras README.md's host install
    gives pip."""
    text = (ROOT / "README.md").read_text()
    host = text[text.index("### On a host (systemd)") :]
    m = re.search(r"pip install '(build/dist/[^'\[]+\.whl)\[([\w,]+)\]'", host)
    assert m, "no pip install of the wheel in README.md's host install"
    return m[1], m[2]


@pytest.fixture(scope="session")
def host_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """/opt/meridian as the README makes it, in a temporary directory: the system's
    python3 -m venv, pip install of the wheel with the README's extras."""
    path, extras = readme_install()
    assert ROOT / path == wheel
    venv = tmp_path_factory.mktemp("host") / "meridian"
    python3 = shutil.which("python3", path="/usr/bin:/bin")
    assert python3 is not None
    subprocess.run([python3, "-m", "venv", venv], check=True)
    # the venv's own pip (Debian 12's is 23.0): the one a host installs with
    pip = [str(venv / "bin" / "pip"), "install", "-q", f"{wheel}[{extras}]"]
    subprocess.run(pip, check=True, cwd=venv.parent)
    return venv


def on_host(venv: Path, argv: list[str], cwd: Path) -> subprocess.Popen[str]:
    """argv as a host without a tool chain runs it: in a mount namespace of its own
    where HIDDEN are empty, with PATH the venv's bin and `mount` (meridian mounts
    tracefs when it is missing) and nothing else of this environment."""
    tools = cwd / "usr-bin"
    tools.mkdir(exist_ok=True)
    mount = shutil.which("mount")
    assert mount is not None
    if not (tools / "mount").exists():
        (tools / "mount").symlink_to(mount)
    path = f"{venv / 'bin'}:{tools}"
    for missing in ("clang", "bpftool", "llvm-strip", "gcc"):
        assert shutil.which(missing, path=path) is None, missing
    hide = "".join(f"{mount} -t tmpfs none {d} && " for d in HIDDEN if d.is_dir())
    unshare = shutil.which("unshare")
    assert unshare is not None
    return subprocess.Popen(
        [unshare, "--mount", "--", "/bin/sh", "-c", f'{hide}exec "$@"', "sh", *argv],
        env={"PATH": path, "LANG": "C.UTF-8", "HOME": str(cwd)}, cwd=cwd, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def finished(proc: subprocess.Popen[str], seconds: float = 120) -> str:
    out, err = proc.communicate(timeout=patience(seconds))
    assert proc.returncode == 0, err
    return out


@pytest.mark.kernel
def test_the_installed_wheel_runs_doctor_and_io_without_a_tool_chain(
    host_venv: Path, tmp_path: Path
) -> None:
    assert not tmp_path.is_relative_to(ROOT)  # the working directory
    where = on_host(host_venv, ["python", "-c", "import meridian; print(meridian.__file__)"],
                    tmp_path)  # fmt: skip
    assert Path(finished(where).strip()).is_relative_to(host_venv)

    doctor = finished(on_host(host_venv, ["meridian", "doctor"], tmp_path))
    strategies = doctor[doctor.index("\nstrategies") :]
    assert re.search(r"^  io +\w", strategies, re.M), doctor
    assert "ready: the tools can run here" in doctor, doctor

    data, size = tmp_path / "data", 16 * 65536
    data.write_bytes(os.urandom(size))
    io = on_host(host_venv, ["meridian", "io", "-v", "--duration", "2", "--no-events"], tmp_path)
    try:
        wait_attached(io)
        reader = subprocess.Popen(["dd", f"if={data}", "of=/dev/null", "bs=64k", "status=none"])
        assert reader.wait() == 0
        out = finished(io, 30)
    finally:
        reap(io)
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    (dd,) = [r for r in rows if r["type"] == "summary" and r["pid"] == reader.pid]
    # the file, and what dd's loader reads to start (libc's headers)
    assert dd["comm"] == "dd" and size < dd["read"]["bytes"] < size + 65536, dd
