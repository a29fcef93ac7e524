"""Build a BPF C file the way `make bpf` does, for tests and benchmarks that compile
their own small programs (build/vmlinux.h and bpf/ on the include path)."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCH = {"x86_64": "x86", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def compile_bpf(src: Path, out: Path) -> Path:
    """clang -target bpf with BTF (-g); raises CalledProcessError with clang's output."""
    subprocess.run(
        ["clang", "-g", "-O2", "-target", "bpf", "-mcpu=v3", f"-D__TARGET_ARCH_{ARCH}",
         f"-I{ROOT / 'build'}", f"-I{ROOT / 'bpf'}", "-c", str(src), "-o", str(out)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return out
