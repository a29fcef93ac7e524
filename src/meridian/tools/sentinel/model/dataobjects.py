"""Data objects registered through the API (heap arenas, mapped tables): what a
sample's data address points into, by id. Bounded, oldest registration dropped
first. Not locked: the Symbolizer calls it under its own lock."""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["DataObject", "DataObjects"]


@dataclass(frozen=True, slots=True)
class DataObject:
    """A registered data object (heap arena, mapped table): [address, address+size)."""

    object_id: int
    pid: int
    address: int
    name: str
    type: str | None = None
    size: int | None = None


@dataclass(eq=False)
class DataIndex:
    """One process's registered data objects, sorted by address (`starts` theirs), and
    the size of the longest (how far below an address `find` looks)."""

    starts: list[int] = field(default_factory=list)
    objects: list[DataObject] = field(default_factory=list)
    longest: int = 1

    def add(self, obj: DataObject) -> None:
        i = bisect_right(self.starts, obj.address)
        self.starts.insert(i, obj.address)
        self.objects.insert(i, obj)
        self.longest = max(self.longest, obj.size or 1)

    def remove(self, object_id: int) -> None:
        for i, obj in enumerate(self.objects):
            if obj.object_id == object_id:
                del self.starts[i], self.objects[i]
                return

    def find(self, addr: int) -> DataObject | None:
        """The innermost (latest starting) object holding addr."""
        i = bisect_right(self.starts, addr) - 1
        while i >= 0 and self.starts[i] + self.longest > addr:
            obj = self.objects[i]
            if addr < obj.address + (obj.size or 1):
                return obj
            i -= 1
        return None


class DataObjects:
    """The registrations of every process."""

    def __init__(self, max_objects: int, max_pending: int) -> None:
        self.max_data_objects = max(1, max_objects)
        self._objects: OrderedDict[int, DataObject] = OrderedDict()
        self._object_ids: dict[tuple[int, int, str, str | None, int | None], int] = {}
        self._data: dict[int, DataIndex] = {}
        self._new_objects: deque[DataObject] = deque(maxlen=max_pending)
        self._next_object = 1

    def __len__(self) -> int:
        return len(self._objects)

    def register(self, key: tuple[int, int, str, str | None, int | None]) -> int:
        """The id of the object `key` = (pid, address, name, type, size) names, the
        same id for the same registration."""
        known = self._object_ids.get(key)
        if known is not None:
            return known
        pid = key[0]
        obj = DataObject(self._next_object, *key)
        self._next_object += 1
        self._objects[obj.object_id] = obj
        self._object_ids[key] = obj.object_id
        self._data.setdefault(pid, DataIndex()).add(obj)
        self._new_objects.append(obj)
        while len(self._objects) > self.max_data_objects:
            _, old = self._objects.popitem(last=False)
            self._drop(old)
        return obj.object_id

    def _drop(self, obj: DataObject) -> None:
        key = (obj.pid, obj.address, obj.name, obj.type, obj.size)
        if self._object_ids.get(key) == obj.object_id:  # not a later registration's
            del self._object_ids[key]
        index = self._data.get(obj.pid)
        if index is not None:
            index.remove(obj.object_id)
            if not index.objects:
                del self._data[obj.pid]

    def find(self, pid: int, addr: int) -> int:
        index = self._data.get(pid)
        obj = index.find(addr) if index is not None else None
        return obj.object_id if obj is not None else 0

    def get(self, object_id: int) -> DataObject | None:
        return self._objects.get(object_id)

    def objects(self, pid: int | None = None) -> Iterator[DataObject]:
        """The registrations (one process's, or all), oldest first."""
        return (o for o in self._objects.values() if pid is None or o.pid == pid)

    def consume(self) -> list[DataObject]:
        out = list(self._new_objects)
        self._new_objects.clear()
        return out

    def forget(self, pid: int) -> None:
        index = self._data.pop(pid, None)
        for obj in index.objects if index is not None else ():
            self._object_ids.pop((obj.pid, obj.address, obj.name, obj.type, obj.size), None)
