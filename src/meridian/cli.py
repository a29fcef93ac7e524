"""`meridian`: one sub-command per tool."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from . import __version__
from .errors import MeridianError
from .tools import COMMANDS

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """Bad input is one line and exit code 2, never a usage dump or a traceback."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _named_tool(argv: Sequence[str]) -> str | None:
    """The tool a command line names: its first word that is not an option."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; of the tools, only the one `argv` names is imported and gets its
    options (all of them when `argv` is None); the others are a line in the list. Each
    tool's imports (numpy, sentinel's store client...) cost a start 0.35 s here for all
    seven, 30 s in the kernel matrix's guests."""
    parser = _Parser(
        prog="meridian",
        description="Linux kernel observability with eBPF.",
        epilog="run 'meridian doctor' to see what this kernel allows",
    )
    parser.add_argument("--version", action="version", version=f"meridian {__version__}")
    sub = parser.add_subparsers(dest="tool", metavar="TOOL", parser_class=_Parser)
    sub.required = True
    named = None if argv is None else _named_tool(argv)
    for name, (module, summary) in COMMANDS.items():
        if argv is None or name == named:
            tool = importlib.import_module(module)
            tool.add_parser(sub).set_defaults(func=tool.run)
        else:
            sub.add_parser(name, help=summary)
    return parser


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # same path as Ctrl-C: summary, then detach


def main(argv: list[str] | None = None) -> int:
    # A crash in native code (libbpf through ctypes) prints every thread's Python
    # stack to stderr: what a bug report needs (CI once saw a bare SIGSEGV at exit).
    # Not where stderr is no file (captured in tests, an embedding program).
    with contextlib.suppress(OSError, ValueError, AttributeError):
        faulthandler.enable()
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        if getattr(args, "verbose", False):
            from .bpf import _libbpf

            _libbpf.set_echo(lambda line: print(line, file=sys.stderr))
        return func(args)
    except MeridianError as exc:
        print(f"meridian {args.tool}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        sys.stderr.close()  # reader went away (| head): quietly
        return 0


if __name__ == "__main__":
    sys.exit(main())
