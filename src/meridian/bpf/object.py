"""A BPF object through its whole life: open, set read-only globals, choose programs,
load, attach, use maps, detach. As a context manager nothing leaks on any path."""

from __future__ import annotations

import contextlib
import errno as _errno
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from ..errors import BpfError, ObjectMissing, PermissionProblem, VerifierError
from ..signals import signals_held
from ..system import kernel_btf_has
from . import _libbpf as L
from .btf import Btf
from .maps import Map

__all__ = ["BpfObject", "Link", "Program"]


class Link:
    """An attachment; destroying it detaches the program."""

    def __init__(self, handle: int, program: str) -> None:
        self._handle: int | None = handle
        self.program = program

    def destroy(self) -> None:
        if self._handle:
            L.lib().bpf_link__destroy(self._handle)
            self._handle = None


class Program:
    def __init__(self, obj: BpfObject, handle: int) -> None:
        self._obj = obj
        self._handle = handle
        self.name = L.cstr(L.lib().bpf_program__name(handle))
        self.section = L.cstr(L.lib().bpf_program__section_name(handle))

    @property
    def autoload(self) -> bool:
        return bool(L.lib().bpf_program__autoload(self._handle))

    @autoload.setter
    def autoload(self, on: bool) -> None:
        ret = L.lib().bpf_program__set_autoload(self._handle, on)
        if ret:
            raise BpfError(f"bpf_program__set_autoload({self.name})", L.neg_errno(ret))

    def set_verifier_log_level(self, level: int) -> None:
        """The verifier's log at load (1 its path, 2 every state, 4 its statistics),
        printed through libbpf's log (L.set_echo)."""
        ret = L.lib().bpf_program__set_log_level(self._handle, level)
        if ret:
            raise BpfError(f"bpf_program__set_log_level({self.name})", L.neg_errno(ret))

    @property
    def fd(self) -> int:
        return int(L.lib().bpf_program__fd(self._handle))

    def _attached(self, what: str, make: Callable[[], Any]) -> Link:
        """The link make() (a libbpf attach) returns, kept by the object, with Ctrl-C
        held (libbpf may print, a Python callback, while attaching) until it is kept: an
        interrupted attach leaves no link that closing the object would not destroy."""
        kept = None
        with signals_held():
            link = make()
            if link:
                kept = self._obj._keep(Link(link, self.name))
        if kept is None:
            raise BpfError(f"attaching {self.name} {what}", L.errno() or _errno.EINVAL)
        return kept

    def attach(self) -> Link:
        """Attach as the section name says (tp_btf/..., tracepoint/..., kprobe/...)."""
        return self._attached(
            f"({self.section})", lambda: L.lib().bpf_program__attach(self._handle)
        )

    def attach_perf_event(self, perf_fd: int, cookie: int | None = None) -> Link:
        """Attach to an open perf event; the link owns (and closes) the fd. A `cookie`
        is what the program reads with bpf_get_attach_cookie() (Linux >= 5.15)."""
        if cookie is None:
            return self._attached(
                "to a perf event",
                lambda: L.lib().bpf_program__attach_perf_event(self._handle, perf_fd),
            )
        return self._attached(
            "to a perf event", lambda: L.attach_perf_event_cookie(self._handle, perf_fd, cookie)
        )

    @property
    def recursion_misses(self) -> int:
        """Events the kernel did not give this program because it was already running
        on that CPU (for plain tracepoints and kprobes: any such program was); 0 when
        not loaded or not counted (Linux < 5.12)."""
        fd = self.fd
        return (L.prog_recursion_misses(fd) or 0) if fd >= 0 else 0

    def test_run(self, data: bytes, repeat: int = 1) -> tuple[int, int]:
        """Run a loaded program on `data` in the kernel (BPF_PROG_TEST_RUN: XDP, tc,
        socket filters): its return value and the average ns per run over `repeat`."""
        ret = L.prog_test_run(self.fd, data, repeat)
        if ret[0]:
            raise BpfError(f"test run of {self.name}", L.neg_errno(ret[0]))
        return ret[1], ret[2]

    def attach_xdp(self, ifindex: int) -> Link:
        """Attach an XDP program to an interface through a BPF link (Linux >= 5.9):
        destroying the link (or closing the object) detaches it."""
        return self._attached(
            f"(XDP) to ifindex {ifindex}",
            lambda: L.lib().bpf_program__attach_xdp(self._handle, ifindex),
        )


class BpfObject:
    """One compiled `*.bpf.o`, opened from `path`."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ObjectMissing(str(self.path))
        self._handle: int | None = None
        self._links: list[Link] = []
        self._loaded = False
        handle = None
        try:
            with signals_held():  # libbpf prints through a Python callback while opening
                handle = L.lib().bpf_object__open_file(str(self.path).encode(), None)
        except KeyboardInterrupt:  # held until libbpf returned: nothing may stay open
            if handle:
                L.lib().bpf_object__close(handle)
            raise
        if not handle:
            raise BpfError(f"opening {self.path}", L.errno() or _errno.EINVAL)
        self._handle = handle
        raw_btf = L.lib().bpf_object__btf(handle)
        size = L.u32_ref(0)
        data = L.lib().btf__raw_data(raw_btf, L.byref(size)) if raw_btf else None
        self.btf = Btf(L.read_bytes(data, size.value)) if data else None
        self.programs: dict[str, Program] = {}
        prog = L.lib().bpf_object__next_program(handle, None)
        while prog:
            p = Program(self, prog)
            self.programs[p.name] = p
            prog = L.lib().bpf_object__next_program(handle, prog)
        self.maps: dict[str, Map] = {}
        m = L.lib().bpf_object__next_map(handle, None)
        while m:
            mp = Map.from_object(m, self.btf)
            self.maps[mp.name] = mp
            m = L.lib().bpf_object__next_map(handle, m)

    # ---- before load --------------------------------------------------------------

    def set_rodata(self, values: Mapping[str, Any]) -> None:
        """Set `const volatile` globals (the tool's settings) before load."""
        if not values:
            return
        if self._loaded:
            raise RuntimeError("read-only globals are set before load")
        rodata = next((m for m in self.maps.values() if m.name.endswith(".rodata")), None)
        if rodata is None or self.btf is None:
            raise KeyError(f"{self.path.name} has no .rodata section")
        layout = self.btf.datasec(".rodata")
        size = L.size_ref()
        ptr = L.lib().bpf_map__initial_value(rodata.handle, L.byref(size))
        data = bytearray(L.read_bytes(ptr, size.value))
        for name, value in values.items():
            if name not in layout:
                raise KeyError(f"{self.path.name} has no global {name!r}")
            off, var_size, tid = layout[name]
            raw = np.array(value, dtype=self.btf.dtype(tid)).tobytes()
            data[off : off + var_size] = raw[:var_size]
        L.write_bytes(ptr, bytes(data))

    def select(self, programs: Iterable[str]) -> None:
        """Load only these programs (autoload), so one object serves several strategies."""
        wanted = set(programs)
        unknown = wanted - self.programs.keys()
        if unknown:
            raise KeyError(f"{self.path.name} has no program {sorted(unknown)}")
        for name, prog in self.programs.items():
            prog.autoload = name in wanted

    def resize(self, map_name: str, max_entries: int) -> None:
        ret = L.lib().bpf_map__set_max_entries(self.maps[map_name].handle, max_entries)
        if ret:
            raise BpfError(f"resizing map {map_name}", L.neg_errno(ret))
        self.maps[map_name].max_entries = max_entries

    def recursion_misses(self) -> int:
        """recursion_misses summed over the loaded programs: events lost before any
        program ran, which no counter of the programs' own can see."""
        return sum(p.recursion_misses for p in self.programs.values())

    def read_globals(self, section: str = ".bss") -> dict[str, Any]:
        """Current values of a loaded object's globals (counters kept in .bss/.data)."""
        m = next((m for m in self.maps.values() if m.name.endswith(section)), None)
        if m is None or self.btf is None:
            raise KeyError(f"{self.path.name} has no {section} section")
        raw = m.lookup(0)
        data = raw.tobytes() if raw is not None else b""
        out = {}
        for name, (off, size, tid) in self.btf.datasec(section).items():
            out[name] = np.frombuffer(data[off : off + size], dtype=self.btf.dtype(tid))[0]
        return out

    # ---- load, attach, close --------------------------------------------------------

    def kernel_facts(self) -> dict[str, bool]:
        """Each `have_<kfunc>` read-only global of the object (bpf/kread.bpf.h) and
        whether this kernel has that kfunc: set before load, so the verifier drops the
        branch this kernel cannot run and one object loads on every kernel."""
        if self.btf is None or not any(m.name.endswith(".rodata") for m in self.maps.values()):
            return {}
        names = self.btf.datasec(".rodata")
        return {n: kernel_btf_has(n.removeprefix("have_")) for n in names if n.startswith("have_")}

    def load(self) -> None:
        self.set_rodata(self.kernel_facts())
        L.log_lines.clear()
        with signals_held():  # libbpf prints through a Python callback while loading
            ret = L.lib().bpf_object__load(self._handle)
        if ret:
            err = L.neg_errno(ret)
            if err in (_errno.EPERM, _errno.EACCES) and not _has_bpf_privileges():
                raise PermissionProblem()
            failed = self._failed_program()
            if failed:
                raise VerifierError(failed, err, list(L.log_lines)[-40:])
            raise BpfError(f"loading {self.path.name}", err, _last_error_line())
        self._loaded = True
        for m in self.maps.values():
            m.refresh_fd()

    def _failed_program(self) -> str | None:
        """libbpf names the program whose load failed in its log; find it."""
        for line in reversed(L.log_lines):
            for name in self.programs:
                if f"prog '{name}'" in line and ("failed to load" in line or "-- BEGIN" in line):
                    return name
        return None

    def attach(self, programs: Iterable[str] | None = None) -> list[Link]:
        names = (
            [p for p in self.programs if self.programs[p].autoload]
            if programs is None
            else programs
        )
        return [self.programs[n].attach() for n in names]

    @property
    def links(self) -> list[Link]:
        """The attachments made so far (and not dropped)."""
        return list(self._links)

    def _keep(self, link: Link) -> Link:
        self._links.append(link)
        return link

    def drop(self, links: Iterable[Link]) -> None:
        """Detach these links now and forget them (a tool that re-attaches while
        running, such as a rotation of perf events, keeps no dead links)."""
        gone = {id(link) for link in links}
        for link in [lk for lk in self._links if id(lk) in gone]:
            link.destroy()
        self._links = [lk for lk in self._links if id(lk) not in gone]

    def detach(self) -> None:
        while self._links:
            self._links.pop().destroy()

    def close(self) -> None:
        self.detach()
        if self._handle:
            L.lib().bpf_object__close(self._handle)
            self._handle = None
            for m in self.maps.values():
                m.invalidate()

    def __enter__(self) -> BpfObject:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: nothing to do
            self.close()


def _last_error_line() -> str:
    for line in reversed(L.log_lines):
        if line.strip():
            return line.strip().removeprefix("libbpf: ")
    return ""


def _has_bpf_privileges() -> bool:
    from ..system import has_bpf_privileges

    return has_bpf_privileges()
