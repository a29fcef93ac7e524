"""What the verifier does to load each program of the tools that resolve file paths in
the kernel (io's syscall programs, syscalls' sys_enter). Since 6.7 it checks a
bpf_loop() callback iteration after iteration until its state repeats; with the path
walk's state on the stack that never happened early, and each program cost 286,000
instructions processed: 0.4 s of load per program here, 8 s for io's tracepoint
strategy, minutes in the kernel matrix's guests (bpf/fdpath.bpf.h keeps the state in
a map value). The verifier's own statistics (log level 4), per program loaded here."""

from __future__ import annotations

import re

import pytest

from meridian.bpf import BpfObject, _libbpf, object_path

pytestmark = pytest.mark.kernel

# A program that names files processes ~4,000 instructions now; 25 times that is a
# regression to the walk checked iteration by iteration, not noise.
MAX_PROCESSED = 100_000
# The syscall programs, the ones that name files, of the strategies every kernel of the
# matrix and this VM load (tracepoints and tp_btf), by their prefix in each object.
PROGRAMS = {"io": ("tp_enter_", "tp_exit_", "raw_"), "syscalls": ("tp_sys_", "btf_sys_")}
STATS = re.compile(r"prog '(\w+)': -- BEGIN|^processed (\d+) insns")


def processed_per_program(tool: str) -> dict[str, int]:
    lines: list[str] = []
    with BpfObject(object_path(tool)) as obj:
        names = [n for n in obj.programs if n.startswith(PROGRAMS[tool])]
        obj.select(names)
        for name in names:
            obj.programs[name].set_verifier_log_level(4)  # BPF_LOG_STATS
        _libbpf.set_echo(lines.append)  # every line: the log keeps only the last 400
        try:
            obj.load()
        finally:
            _libbpf.set_echo(None)
        out: dict[str, int] = {}
        program = ""
        for line in lines:
            m = STATS.search(line.removeprefix("libbpf: "))
            if m and m.group(1):
                program = m.group(1)
            elif m and program:
                out[program] = int(m.group(2))
        assert set(out) == set(names), "the verifier's statistics of every program"
        return out


@pytest.mark.parametrize("tool", sorted(PROGRAMS))
def test_each_program_verifies_in_a_bounded_number_of_instructions(tool: str) -> None:
    processed = processed_per_program(tool)
    over = {name: n for name, n in processed.items() if n > MAX_PROCESSED}
    assert not over, f"programs the verifier took over {MAX_PROCESSED} instructions for"
