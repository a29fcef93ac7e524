"""One module per tool: each wires its kernel programs to its views and sinks.

COMMANDS is each tool's module and its line in `meridian --help`, kept here, apart from
the tools, so that a command line imports only the tool it names (cli.py).
"""

COMMANDS: dict[str, tuple[str, str]] = {
    "biolat": (
        "meridian.tools.biolat",
        "block I/O latency histograms, sizes, queue depth, slow requests",
    ),
    "memlat": (
        "meridian.tools.memlat",
        "page-fault latency histograms, minor/major, per process; validate",
    ),
    "runqlat": ("meridian.tools.runqlat", "run-queue (scheduler) latency histograms; validate"),
    "syscalls": (
        "meridian.tools.syscalls",
        "file-system syscall viewer: paired start/end, compact and filtered logs",
    ),
    "io": ("meridian.tools.io", "per-process file I/O: latency, bytes, page cache hits (seed 000)"),
    "sentinel": (
        "meridian.tools.sentinel",
        "PMU samples attributed to network flows: which flows suffer cache misses, "
        "branch mispredictions, remote DRAM, false sharing, and where (seed 003)",
    ),
    "doctor": (
        "meridian.tools.doctor",
        "what this kernel allows and which strategy each tool uses",
    ),
}


def summary(name: str) -> str:
    """Tool `name`'s line in `meridian --help`."""
    return COMMANDS[name][1]
