"""The BPF objects' stacks against the oldest verifier they must load on: 6.1 (Debian
12) adds the frames of a call chain, each rounded up to 32 bytes, against 512. io's
enter programs call send_name() (a global function) whose walk runs bpf_loop()
callbacks: three frames, at 512 exactly, so one more stack slot in such a program
refuses every io program there while this kernel (6.18) loads them. The kernel matrix
found that once, half an hour into its run; this finds it in a second. From the
disassembly: each function's deepest `r10 - N`, and the functions each program calls
(its call relocations)."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

OBJDIR = Path(__file__).resolve().parent.parent / "src" / "meridian" / "bpfobj"
OBJECTS = sorted(OBJDIR.glob("*.bpf.o"))
MAX_BPF_STACK = 512
FUNCTION = re.compile(r"^[0-9a-f]+ <([A-Za-z_][\w.]*)>:$")
SECTION = re.compile(r"^Disassembly of section (\S+):$")
SLOT = re.compile(r"\(r10 - (\d+)\)")
CALL = re.compile(r"R_BPF_64_32\s+(\w+)$")  # a call's relocation: a function or kfunc


@dataclass
class Function:
    section: str
    depth: int = 0  # the deepest stack offset it touches
    calls: set[str] = field(default_factory=set)


def frame(depth: int) -> int:
    """A frame as 6.1's check_max_stack_depth() counts it."""
    return (max(depth, 1) + 31) // 32 * 32


def functions(obj: Path) -> dict[str, Function]:
    objdump = shutil.which("llvm-objdump")
    if objdump is None:
        pytest.fail("llvm-objdump is missing: apt-get install llvm (make test does)")
    text = subprocess.run(
        [objdump, "-d", "-r", "--no-show-raw-insn", str(obj)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    out: dict[str, Function] = {}
    section, fn = "", None
    for line in text.splitlines():
        if m := SECTION.match(line):
            section = m[1]
        elif (m := FUNCTION.match(line)) and not m[1].startswith("LBB"):  # not a label
            fn = out[m[1]] = Function(section)
        elif fn is not None and (slots := SLOT.findall(line)):
            fn.depth = max(fn.depth, *map(int, slots))
        elif fn is not None and (m := CALL.search(line)):
            fn.calls.add(m[1])
    return out


def deepest_chain(fns: dict[str, Function]) -> tuple[int, str]:
    """The largest sum of frames: a program, a function of .text it calls (a global
    function), and the deepest function of .text that nothing calls (a bpf_loop()
    callback: its caller names it by address, not by a call)."""
    text = {n: f for n, f in fns.items() if f.section.startswith(".text")}
    called = set().union(*(f.calls for f in fns.values()))
    callback = max((f.depth for n, f in text.items() if n not in called), default=None)
    best = (0, "")
    for name, f in fns.items():
        if name in text:
            continue
        globals_called: list[str | None] = [c for c in f.calls if c in text]
        for g in globals_called or [None]:
            chain = frame(f.depth) + (frame(text[g].depth) if g else 0)
            chain += frame(callback) if callback is not None else 0
            best = max(best, (chain, f"{name} -> {g or '(no call)'} -> callback"))
    return best


@pytest.mark.parametrize("obj", OBJECTS, ids=lambda o: o.name)
def test_the_deepest_call_chain_fits_6_1s_stack(obj: Path) -> None:
    chain, path = deepest_chain(functions(obj))
    assert chain <= MAX_BPF_STACK, (obj.name, chain, path)


def test_the_rule_refuses_what_6_1_refused() -> None:
    """io's raw_enter at 144 bytes with send_name at 344 and a callback at 8: 6.1 said
    'combined stack size of 3 calls is 544. Too large'."""
    assert frame(144) + frame(344) + frame(8) == 544
    assert frame(128) + frame(344) + frame(8) == MAX_BPF_STACK
