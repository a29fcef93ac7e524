"""Kernel tests that run once per strategy of a tool: every strategy is a parameter,
and one the running kernel refuses is skipped with the kernel's reason, "kernel refuses
FEATURE: ...". conftest lets that skip stand under MERIDIAN_REQUIRE_BPF=1 (this VM has
no kprobes and refuses fentry) unless MERIDIAN_REQUIRE_FEATURES names the feature, as
the kernel matrix's guests do (tests/kernel_matrix.py): there every strategy runs."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

from meridian.bpf import Strategy

REFUSED = re.compile(r"kernel refuses (\w+): ")


def every(strategies: Sequence[Strategy]) -> list[str]:
    """The names to parametrize a test with: all of the tool's strategies."""
    return [s.name for s in strategies]


def run_or_skip(strategies: Sequence[Strategy], name: str) -> None:
    """Skip, with the feature and the kernel's reason, where `name` cannot run here."""
    strategy = next(s for s in strategies if s.name == name)
    for p in strategy.missing():
        why = f" ({p.why})" if p.why else ""
        pytest.skip(f"kernel refuses {p.feature}: {p.detail}{why}")
