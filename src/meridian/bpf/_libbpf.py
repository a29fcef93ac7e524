"""The one binding to the system libbpf (>= 1.0) and to the two raw system calls it
does not wrap (perf_event_open, and the errno they leave). No other module uses ctypes.

Functions take and return plain Python values (ints, bytes, handles as ints), so the
rest of the package is independent of ctypes and tests can replace this seam.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import os
import platform
import struct
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..errors import LibbpfMissing

_c = ctypes
_p = _c.c_void_p
_i = _c.c_int
_u32 = _c.c_uint32
_s = _c.c_char_p
_sz = _c.c_size_t

# name: (restype, argtypes)
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "libbpf_get_error": (_c.c_long, [_p]),
    "libbpf_set_print": (_p, [_p]),
    "libbpf_num_possible_cpus": (_i, []),
    "libbpf_probe_bpf_map_type": (_i, [_i, _p]),
    "libbpf_probe_bpf_prog_type": (_i, [_i, _p]),
    "bpf_object__open_file": (_p, [_s, _p]),
    "bpf_object__load": (_i, [_p]),
    "bpf_object__close": (None, [_p]),
    "bpf_object__btf": (_p, [_p]),
    "bpf_object__next_program": (_p, [_p, _p]),
    "bpf_object__next_map": (_p, [_p, _p]),
    "btf__raw_data": (_p, [_p, _c.POINTER(_u32)]),
    "bpf_program__name": (_s, [_p]),
    "bpf_program__section_name": (_s, [_p]),
    "bpf_program__set_autoload": (_i, [_p, _c.c_bool]),
    "bpf_program__autoload": (_c.c_bool, [_p]),
    "bpf_program__fd": (_i, [_p]),
    "bpf_program__attach": (_p, [_p]),
    "bpf_program__attach_perf_event": (_p, [_p, _i]),
    "bpf_program__attach_perf_event_opts": (_p, [_p, _i, _p]),
    "bpf_program__attach_xdp": (_p, [_p, _i]),
    "bpf_prog_test_run_opts": (_i, [_i, _p]),
    "bpf_obj_get_info_by_fd": (_i, [_i, _p, _c.POINTER(_u32)]),
    "bpf_program__set_log_buf": (_i, [_p, _p, _sz]),
    "bpf_program__set_log_level": (_i, [_p, _u32]),
    "bpf_link__destroy": (_i, [_p]),
    "bpf_map__name": (_s, [_p]),
    "bpf_map__fd": (_i, [_p]),
    "bpf_map__type": (_i, [_p]),
    "bpf_map__key_size": (_u32, [_p]),
    "bpf_map__value_size": (_u32, [_p]),
    "bpf_map__max_entries": (_u32, [_p]),
    "bpf_map__set_max_entries": (_i, [_p, _u32]),
    "bpf_map__initial_value": (_p, [_p, _c.POINTER(_sz)]),
    "bpf_map__set_initial_value": (_i, [_p, _p, _sz]),
    "bpf_map__btf_key_type_id": (_u32, [_p]),
    "bpf_map__btf_value_type_id": (_u32, [_p]),
    "bpf_map_lookup_elem": (_i, [_i, _p, _p]),
    "bpf_map_update_elem": (_i, [_i, _p, _p, _c.c_uint64]),
    "bpf_map_delete_elem": (_i, [_i, _p]),
    "bpf_map_get_next_key": (_i, [_i, _p, _p]),
    "bpf_map_lookup_batch": (_i, [_i, _p, _p, _p, _p, _c.POINTER(_u32), _p]),
    "bpf_map_lookup_and_delete_batch": (_i, [_i, _p, _p, _p, _p, _c.POINTER(_u32), _p]),
}

_PRINT_FN = _c.CFUNCTYPE(_i, _i, _s, _p)
_SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241, "riscv64": 241, "ppc64le": 319}

_lib: Any = None
_libc: Any = None
_print_cb: Any = None
# libbpf's recent messages (the verifier log arrives here on a failed load).
log_lines: collections.deque[str] = collections.deque(maxlen=400)
_echo: Callable[[str], None] | None = None


def _load() -> Any:
    global _lib, _libc
    if _lib is not None:
        return _lib
    name = ctypes.util.find_library("bpf") or "libbpf.so.1"
    try:
        lib = _c.CDLL(name, use_errno=True)
    except OSError:
        try:
            lib = _c.CDLL("libbpf.so.1", use_errno=True)
        except OSError as exc:
            raise LibbpfMissing() from exc
    for fn, (res, args) in _SIGNATURES.items():
        f = getattr(lib, fn)
        f.restype = res
        f.argtypes = args
    _libc = _c.CDLL(None, use_errno=True)
    _libc.vsnprintf.argtypes = [_p, _sz, _s, _p]
    _libc.vsnprintf.restype = _c.c_int
    _libc.syscall.restype = _c.c_long
    _lib = lib
    _install_print()
    return lib


# libbpf prints a verifier log in one call: its reason for refusing a program is at
# the end. One buffer for every print, taken under a lock: a load prints ~11,000 debug
# lines, and a fresh megabyte for each was a tenth of io's load time here.
PRINT_BUFFER = 1 << 20
_print_buffer = _c.create_string_buffer(PRINT_BUFFER)
_print_lock = threading.Lock()


def _on_print(level: int, fmt: bytes, va: int) -> int:
    with _print_lock:
        buf = _print_buffer
        need = _libc.vsnprintf(buf, len(buf), fmt, va)
        text = buf.value.decode(errors="replace")
    if need >= len(buf):
        text += f"\n(libbpf message cut at {len(buf)} of {need} bytes)"
    for line in text.splitlines():
        log_lines.append(line)
        if _echo is not None:
            _echo(line)
    return 0


def _install_print() -> None:
    global _print_cb
    _print_cb = _PRINT_FN(_on_print)
    _lib.libbpf_set_print(_c.cast(_print_cb, _p))


def set_echo(echo: Callable[[str], None] | None) -> None:
    """Send every libbpf message (and verifier logs) to `echo` as well (-v)."""
    global _echo
    _echo = echo


def lib() -> Any:
    return _load()


def errno() -> int:
    return _c.get_errno()


def neg_errno(ret: int) -> int:
    """libbpf 1.x returns -errno; keep errno as a fallback for older conventions."""
    return -ret if ret < 0 else (_c.get_errno() or 1)


def cstr(ptr: bytes | None) -> str:
    return ptr.decode() if ptr else ""


def buffer(size: int) -> Any:
    return _c.create_string_buffer(size)


def address(buf: Any) -> int:
    return _c.addressof(buf)


def buffer_from(data: bytes) -> Any:
    return _c.create_string_buffer(data, len(data))


def u32_ref(value: int) -> Any:
    return _c.c_uint32(value)


def byref(obj: Any) -> Any:
    return _c.byref(obj)


def size_ref() -> Any:
    return _c.c_size_t(0)


def read_bytes(ptr: int, size: int) -> bytes:
    return _c.string_at(ptr, size)


def write_bytes(ptr: int, data: bytes) -> None:
    _c.memmove(ptr, data, len(data))


def perf_event_open(attr: bytes, pid: int, cpu: int, group_fd: int, flags: int) -> int:
    """perf_event_open(2); returns the fd or -errno."""
    _load()
    nr = _SYS_PERF_EVENT_OPEN.get(platform.machine())
    if nr is None:
        return -38  # ENOSYS
    buf = _c.create_string_buffer(attr, len(attr))
    fd = _libc.syscall(_c.c_long(nr), buf, _i(pid), _i(cpu), _i(group_fd), _c.c_ulong(flags))
    return int(fd) if fd >= 0 else -_c.get_errno()


def attach_perf_event_cookie(prog: int, perf_fd: int, cookie: int) -> int:
    """bpf_program__attach_perf_event_opts with a bpf_cookie; the link handle or 0.
    `struct bpf_perf_event_opts` as libbpf 1.0 has it: size_t sz, u64 bpf_cookie
    (later versions accept this smaller size)."""
    opts = _c.create_string_buffer(_perf_event_opts(cookie), 16)
    return int(lib().bpf_program__attach_perf_event_opts(prog, perf_fd, opts) or 0)


def _perf_event_opts(cookie: int) -> bytes:
    return (16).to_bytes(8, sys.byteorder) + (cookie & (2**64 - 1)).to_bytes(8, sys.byteorder)


class _TestRunOpts(_c.Structure):
    """struct bpf_test_run_opts (libbpf 1.0)."""

    _fields_ = (
        ("sz", _sz),
        ("data_in", _p),
        ("data_out", _p),
        ("data_size_in", _u32),
        ("data_size_out", _u32),
        ("ctx_in", _p),
        ("ctx_out", _p),
        ("ctx_size_in", _u32),
        ("ctx_size_out", _u32),
        ("retval", _u32),
        ("repeat", _i),
        ("duration", _u32),
        ("flags", _u32),
        ("cpu", _u32),
        ("batch_size", _u32),
    )


def prog_test_run(prog_fd: int, data: bytes, repeat: int = 1) -> tuple[int, int, int]:
    """BPF_PROG_TEST_RUN on `data` (XDP, tc, ...): (ret, program return value, average
    ns per run). `struct bpf_test_run_opts` (libbpf 1.0): sz, data_in, data_out,
    data_size_in, data_size_out, ctx_in, ctx_out, ctx_size_in, ctx_size_out, retval,
    repeat, duration, flags, cpu, batch_size: 80 bytes."""

    buf = _c.create_string_buffer(data, len(data))
    opts = _TestRunOpts(
        sz=_c.sizeof(_TestRunOpts), data_in=_c.addressof(buf), data_size_in=len(data)
    )
    opts.repeat = repeat
    ret = int(lib().bpf_prog_test_run_opts(prog_fd, _c.byref(opts)))
    return ret, int(opts.retval), int(opts.duration)


# struct bpf_prog_info is uapi and only ever grows: recursion_misses (Linux >= 5.12) is
# the u64 at byte 208. A larger buffer is fine as long as its tail is zero.
_PROG_INFO_SIZE = 256
_RECURSION_MISSES = 208


def prog_recursion_misses(prog_fd: int) -> int | None:
    """How often the kernel skipped the program because it would have run nested on a
    CPU (bpf_prog_info.recursion_misses); None where the kernel does not count it."""
    info = buffer(_PROG_INFO_SIZE)
    size = u32_ref(_PROG_INFO_SIZE)
    if lib().bpf_obj_get_info_by_fd(prog_fd, info, byref(size)):
        return None
    if size.value < _RECURSION_MISSES + 8:
        return None
    return int(struct.unpack_from("=Q", info.raw, _RECURSION_MISSES)[0])


def possible_cpus() -> int:
    n = int(lib().libbpf_num_possible_cpus())
    return n if n > 0 else (os.cpu_count() or 1)


def is_little_endian() -> bool:
    return sys.byteorder == "little"
