"""BPF maps with typed keys and values: numpy dtypes from the object's BTF.

Whole-map reads use the kernel's batch lookup where it has it (one system call for
the map) and fall back to get_next_key iteration where it does not.
"""

from __future__ import annotations

import errno as _errno
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import BpfError, MapFull
from . import _libbpf as L
from .btf import Btf, BtfFormatError

__all__ = ["Map", "MapType"]


class MapType:
    HASH, ARRAY, PROG_ARRAY, PERF_EVENT_ARRAY, PERCPU_HASH, PERCPU_ARRAY = 1, 2, 3, 4, 5, 6
    LRU_HASH, LRU_PERCPU_HASH, RINGBUF, TASK_STORAGE = 9, 10, 27, 29
    PERCPU = frozenset({PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH})


_BATCH_UNSUPPORTED = {_errno.EINVAL, _errno.ENOTSUP, 524}  # 524: kernel ENOTSUPP


@dataclass(eq=False)
class Map:
    """One map of a loaded object (`handle` its libbpf map, 0 for none); per-CPU maps
    (`percpu`) hold a value per possible CPU (`ncpus`)."""

    name: str
    fd: int
    type: int
    key_dtype: np.dtype[Any]
    value_dtype: np.dtype[Any]
    max_entries: int
    handle: int = 0
    percpu: bool = field(init=False)
    ncpus: int = field(init=False)
    _slot_dtype: np.dtype[Any] = field(init=False, repr=False)
    _batch_ok: bool | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self.percpu = self.type in MapType.PERCPU
        self.ncpus = L.possible_cpus() if self.percpu else 1
        value = self.value_dtype
        stride = -(-value.itemsize // 8) * 8 if self.percpu else value.itemsize
        # The kernel pads each CPU's value to 8 bytes.
        self._slot_dtype = np.dtype(
            {"names": ["v"], "formats": [value], "offsets": [0], "itemsize": stride}
        )

    @classmethod
    def from_object(cls, handle: int, btf: Btf | None) -> Map:
        lib = L.lib()
        key_size = int(lib.bpf_map__key_size(handle))
        value_size = int(lib.bpf_map__value_size(handle))
        key_dt = _dtype_of(btf, int(lib.bpf_map__btf_key_type_id(handle)), key_size)
        value_dt = _dtype_of(btf, int(lib.bpf_map__btf_value_type_id(handle)), value_size)
        return cls(
            L.cstr(lib.bpf_map__name(handle)),
            int(lib.bpf_map__fd(handle)),
            int(lib.bpf_map__type(handle)),
            key_dt,
            value_dt,
            int(lib.bpf_map__max_entries(handle)),
            handle,
        )

    def refresh_fd(self) -> None:
        if self.handle:
            self.fd = int(L.lib().bpf_map__fd(self.handle))

    def invalidate(self) -> None:
        self.fd = -1

    # ---- single elements ------------------------------------------------------------

    def _key(self, key: Any) -> Any:
        return L.buffer_from(_pack(key, self.key_dtype))

    def _value_buffer(self) -> Any:
        return L.buffer(self._slot_dtype.itemsize * self.ncpus)

    def _decode_values(self, raw: bytes, count: int) -> np.ndarray[Any, Any]:
        arr = np.frombuffer(raw, dtype=self._slot_dtype, count=count * self.ncpus)["v"]
        return arr.reshape(count, self.ncpus) if self.percpu else arr

    def lookup(self, key: Any) -> Any:
        """The value (per-CPU maps: an array of one value per CPU), or None."""
        val = self._value_buffer()
        ret = L.lib().bpf_map_lookup_elem(self.fd, self._key(key), val)
        if ret:
            err = L.neg_errno(ret)
            if err == _errno.ENOENT:
                return None
            raise BpfError(f"lookup in map {self.name}", err)
        return self._decode_values(val.raw, 1)[0].copy()

    def summed(self, key: Any = 0) -> dict[str, int]:
        """A per-CPU struct of counters (the tools' `counters` map), each field summed
        over the CPUs."""
        per_cpu = self.lookup(key)
        return {n: int(per_cpu[n].sum()) for n in per_cpu.dtype.names}

    def update(self, key: Any, value: Any, flags: int = 0) -> None:
        raw = _pack(value, self.value_dtype)
        if self.percpu and len(raw) == self.value_dtype.itemsize:
            arr = np.zeros(self.ncpus, dtype=self._slot_dtype)
            arr["v"] = np.frombuffer(raw, dtype=self.value_dtype)[0]
            raw = arr.tobytes()
        ret = L.lib().bpf_map_update_elem(self.fd, self._key(key), L.buffer_from(raw), flags)
        if ret:
            err = L.neg_errno(ret)
            if err == _errno.E2BIG:
                raise MapFull(self.name)
            raise BpfError(f"update of map {self.name}", err)

    def delete(self, key: Any) -> bool:
        ret = L.lib().bpf_map_delete_elem(self.fd, self._key(key))
        if ret:
            err = L.neg_errno(ret)
            if err == _errno.ENOENT:
                return False
            raise BpfError(f"delete in map {self.name}", err)
        return True

    def delete_many(self, keys: np.ndarray[Any, Any]) -> int:
        """Delete each key (an array of the key's type); how many there were. One
        syscall each, from one packed buffer: for maps without batch deletes (stack
        traces), at a few microseconds a key rather than the tens of delete()."""
        packed = np.ascontiguousarray(keys, dtype=self.key_dtype)
        delete, fd, size = L.lib().bpf_map_delete_elem, self.fd, self.key_dtype.itemsize
        base = packed.ctypes.data
        deleted = 0
        for i in range(len(packed)):
            ret = delete(fd, base + i * size)
            if not ret:
                deleted += 1
            elif L.neg_errno(ret) != _errno.ENOENT:
                raise BpfError(f"delete in map {self.name}", L.neg_errno(ret))
        return deleted

    def keys(self) -> np.ndarray[Any, Any]:
        out: list[bytes] = []
        size = self.key_dtype.itemsize
        nxt = L.buffer(size)
        prev = None
        while L.lib().bpf_map_get_next_key(self.fd, prev, nxt) == 0:
            out.append(nxt.raw)
            prev = L.buffer_from(nxt.raw)
        keys: np.ndarray[Any, Any] = np.frombuffer(b"".join(out), dtype=self.key_dtype).copy()
        return keys

    # ---- whole map --------------------------------------------------------------------

    def items(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """All (keys, values) at once: batch lookup where the kernel has it."""
        if self._batch_ok is not False:
            try:
                result = self._batch(delete=False)
                self._batch_ok = True
                return result
            except _BatchUnsupported:
                self._batch_ok = False
        keys = self.keys()
        vals = [self.lookup(k.tobytes()) for k in keys]
        present = [i for i, v in enumerate(vals) if v is not None]
        shape = (0, self.ncpus) if self.percpu else (0,)
        values = (
            np.stack([vals[i] for i in present])
            if present
            else np.zeros(shape, dtype=self.value_dtype)
        )
        return keys[present], values

    def pop_all(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Read and delete every element (hash maps), in batches."""
        return self._batch(delete=True)

    def _batch(self, delete: bool) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        lib = L.lib()
        fn = lib.bpf_map_lookup_and_delete_batch if delete else lib.bpf_map_lookup_batch
        # BATCH_CHUNK elements a call, not the map's capacity: io's stats map, sized for
        # thousands of processes, made two 64 MB buffers at every read of a few entries.
        ksize, vsize = self.key_dtype.itemsize, self._slot_dtype.itemsize * self.ncpus
        chunk = min(max(self.max_entries, 1), BATCH_CHUNK)
        keys, vals = L.buffer(ksize * chunk), L.buffer(vsize * chunk)
        token_in, token_out = (
            L.buffer(max(self.key_dtype.itemsize, 8)),
            L.buffer(max(self.key_dtype.itemsize, 8)),
        )
        kparts: list[bytes] = []
        vparts: list[bytes] = []
        first = True
        while True:
            count = L.u32_ref(chunk)
            ret = fn(
                self.fd, None if first else token_in, token_out, keys, vals, L.byref(count), None
            )
            err = L.neg_errno(ret) if ret else 0
            n = count.value
            if err == _errno.ENOSPC and n == 0 and chunk < self.max_entries:
                # a hash bucket holds more elements than a chunk: a bigger one, again
                chunk = min(2 * chunk, self.max_entries)
                keys, vals = L.buffer(ksize * chunk), L.buffer(vsize * chunk)
                continue
            if err and err != _errno.ENOENT:
                if first and err in _BATCH_UNSUPPORTED:
                    raise _BatchUnsupported(err)
                raise BpfError(f"batch lookup in map {self.name}", err)
            kparts.append(L.read_bytes(L.address(keys), n * ksize))  # n elements, not all
            vparts.append(L.read_bytes(L.address(vals), n * vsize))
            if err == _errno.ENOENT or n == 0:
                break
            L.write_bytes(L.address(token_in), token_out.raw)
            first = False
        kraw, vraw = b"".join(kparts), b"".join(vparts)
        n_total = len(kraw) // self.key_dtype.itemsize
        keys_arr: np.ndarray[Any, Any] = np.frombuffer(kraw, dtype=self.key_dtype).copy()
        return keys_arr, self._decode_values(vraw, n_total).copy()


BATCH_CHUNK = 1024  # elements a batch call returns at most (Map._batch)


class _BatchUnsupported(Exception):
    pass


def _dtype_of(btf: Btf | None, tid: int, size: int) -> np.dtype[Any]:
    if btf is not None and tid:
        try:
            dt = btf.dtype(tid)
        except BtfFormatError:  # data sections and other types without a record layout
            dt = None
        if dt is not None and dt.itemsize == size:
            return dt
    if size in (1, 2, 4, 8):  # no type (array and data-section keys): a plain index
        return np.dtype(f"<u{size}")
    return np.dtype(f"V{size}") if size else np.dtype("V1")


def _pack(x: Any, dtype: np.dtype[Any]) -> bytes:
    """Key or value to bytes: bytes as they are, numpy records, dicts by field, numbers."""
    if isinstance(x, (bytes, bytearray)):
        raw = bytes(x)
    elif isinstance(x, (np.ndarray, np.void, np.generic)):
        raw = x.tobytes()
    elif isinstance(x, dict):
        rec = np.zeros((), dtype=dtype)
        for k, v in x.items():
            rec[k] = v
        raw = rec.tobytes()
    else:
        raw = np.array(x, dtype=dtype).tobytes()
    if len(raw) != dtype.itemsize and not (dtype.itemsize and len(raw) % dtype.itemsize == 0):
        raise ValueError(f"{len(raw)} bytes do not fit a {dtype.itemsize}-byte map slot")
    return raw
