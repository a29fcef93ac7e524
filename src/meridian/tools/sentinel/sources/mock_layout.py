"""Where the mock source's code lives: two fake processes, each with the same few
functions in a fake JIT region (`MockSource.symbols()` registers them, so samples
symbolize), and who calls whom. Shared by its samples, stacks and branch stacks."""

from __future__ import annotations

__all__ = ["FUNCTIONS", "FUNC_SIZE", "JIT_BASE", "PIDS", "func_start"]

PIDS = (4201, 4202)  # fake processes (nothing is looked up in /proc for them)
JIT_BASE = 0x7F00_0000_0000
FUNC_SIZE = 0x400
# name, caller (index into FUNCTIONS, -1: none), weight of samples landing in it
FUNCTIONS = (
    ("mock_main", -1, 0.02),
    ("mock_rx_poll", 0, 0.12),
    ("mock_tcp_recv", 1, 0.20),
    ("mock_parse_request", 2, 0.22),
    ("mock_hash_lookup", 3, 0.16),
    ("mock_memcpy", 2, 0.18),
    ("mock_tx_send", 0, 0.10),
)


def func_start(pid_index: int, func: int) -> int:
    """The address of function `func` in process PIDS[pid_index]."""
    return JIT_BASE + (pid_index << 24) + func * FUNC_SIZE
