"""The symbolizer's bounded caches: an LRU dict, and an interner that gives keys
small stable ids (function and stack ids). Apart from the symbolizer because they
know nothing of addresses: what they bound is memory, whatever runs for weeks."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["Interner", "Lru"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Lru(Generic[K, V]):
    """A dict that forgets its least recently used entry past `maxsize`."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = max(1, maxsize)
        self._d: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key: K) -> bool:
        return key in self._d

    def get(self, key: K) -> V | None:
        value = self._d.get(key)
        if value is not None:
            self._d.move_to_end(key)
        return value

    def peek(self, key: K) -> V | None:
        """get() without making it recent."""
        return self._d.get(key)

    def put(self, key: K, value: V) -> None:
        self._d[key] = value
        self._d.move_to_end(key)
        while len(self._d) > self.maxsize:
            self._d.popitem(last=False)

    def pop(self, key: K) -> V | None:
        return self._d.pop(key, None)

    def snapshot(self) -> list[K]:
        return list(self._d)

    def clear(self) -> None:
        self._d.clear()


class Interner(Generic[K]):
    """Keys to ids from 1, stable while the key is among the `maxsize` most recently
    used; an evicted key that comes back gets a new id (never a reused one)."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = max(1, maxsize)
        self._ids: OrderedDict[K, int] = OrderedDict()
        self._keys: dict[int, K] = {}
        self._next = 1
        self.evicted = 0  # keys forgotten so far

    def __len__(self) -> int:
        return len(self._ids)

    def intern(self, key: K) -> tuple[int, bool]:
        """(id, True when it is new)."""
        found = self._ids.get(key)
        if found is not None:
            self._ids.move_to_end(key)
            return found, False
        new = self._next
        self._next += 1
        self._ids[key] = new
        self._keys[new] = key
        while len(self._ids) > self.maxsize:
            _, old = self._ids.popitem(last=False)
            del self._keys[old]
            self.evicted += 1
        return new, True

    def key(self, ident: int) -> K | None:
        return self._keys.get(ident)
