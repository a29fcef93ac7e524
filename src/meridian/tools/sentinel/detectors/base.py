"""The one interface every detector implements (docs/requirements/sentinel.md §6.3:
`Observe`, `Flush(now, callback)`), what its findings offer the exporters, and the
registry through which a new detector module is found without editing any other file.

A detector sees the same decoded sample batches as the aggregator (`observe`, on the
consumer thread) and reports per window (`flush`, on the flush thread); its findings
say which gauge they are and with which labels, so the metrics code exports any
detector's findings the same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

if TYPE_CHECKING:
    from ..model.dataobjects import DataObject
    from .window import Array

__all__ = [
    "REGISTRY",
    "DataObjectLookup",
    "Detector",
    "DetectorContext",
    "Emit",
    "Finding",
    "register",
]


class Finding(Protocol):
    """What a detector reports: one point of the gauge `metric`."""

    @property
    def metric(self) -> str: ...

    @property
    def value(self) -> float: ...

    def labels(self) -> dict[str, str]:
        """The point's labels (low cardinality: no lists)."""
        ...

    def as_dict(self) -> dict[str, Any]:
        """Every field, for JSON output and storage."""
        ...


Emit = Callable[[Finding], None]


class DataObjectLookup(Protocol):
    """The registered data objects (the Symbolizer's, locked there)."""

    def data_object_id(self, pid: int, addr: int) -> int:
        """0: no registered object of `pid` holds `addr`."""
        ...

    def data_object(self, object_id: int) -> DataObject | None: ...


@dataclass(frozen=True)
class DetectorContext:
    """What the runtime offers a detector when it creates it: the data objects, and
    the thresholds set for each detector (its config section, named as the detector:
    keyword arguments of its constructor; a detector without one keeps its defaults)."""

    objects: DataObjectLookup | None = None
    settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def settings_of(self, name: str) -> dict[str, Any]:
        """The thresholds set for detector `name`, as keyword arguments."""
        return dict(self.settings.get(name, {}))


class Detector(ABC):
    """A detector: `observe` batches of samples, `flush` findings per window."""

    name: ClassVar[str]  # the registry key
    metric: ClassVar[str]  # the gauge its findings are points of
    doc: ClassVar[str]  # that gauge's help text

    @classmethod
    def create(cls, ctx: DetectorContext) -> Detector:
        """One with the thresholds set for it (`ctx.settings_of(name)`), from what the
        runtime offers (a detector that needs more of it overrides this)."""
        return cls(**ctx.settings_of(cls.name))

    @abstractmethod
    def observe(self, samples: Array) -> None:
        """A batch of decoded samples (records.sample_dtype), shared with the
        aggregator: read it, keep copies of what is needed."""

    def dropped(self) -> int:
        """Samples observed but not counted (a bounded table was full), cumulative."""
        return 0

    @abstractmethod
    def flush(self, now_ns: int, emit: Emit) -> None:
        """Close the window if it is due at `now_ns` (the samples' clock) and pass
        each finding of it to `emit`."""


REGISTRY: dict[str, type[Detector]] = {}
D = TypeVar("D", bound=type[Detector])


def register(cls: D) -> D:
    """Class decorator: the detector is created by `detectors.create_all`."""
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise ValueError(f"two detectors named {cls.name}")
    REGISTRY[cls.name] = cls
    return cls
