"""The Prometheus text exposition format (0.0.4), rendered straight from a `Source`'s
families into one string, and the Prometheus names of OpenTelemetry metrics.

Names follow OpenTelemetry's Prometheus compatibility rules: dots become underscores,
the unit becomes a suffix (`By` -> `_bytes`, `s` -> `_seconds`, `1` -> `_ratio` on
gauges; annotations such as `{operation}` add nothing), counters end in `_total`.
So `process.disk.io` in bytes is `process_disk_io_bytes_total`, and the attribute
`process.pid` is the label `process_pid`. Histograms are Prometheus histograms in
seconds whose `le` bounds are the kernel's log2 slot bounds.

Why not prometheus_client's objects: a scrape of `meridian io` with 1,000 processes
is ~64,000 samples, and building a metric family object per series and then
prometheus_client's `generate_latest` (which validates and escapes every label name
of every sample) took 0.9-2 s. Here each label set is escaped and sorted once and
shared by the families that carry it, and each line is one f-string; the text is the
same as prometheus_client's (sorted labels, values as its `floatToGoString`), which
the tests check byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .series import Attrs, Family, HistPoint, Point

__all__ = [
    "CONTENT_TYPE",
    "go_float",
    "label_value",
    "log2_le_buckets",
    "prom_label",
    "prom_name",
    "render",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
UNIT_SUFFIX = {"By": "bytes", "s": "seconds", "1": "ratio"}


def prom_name(name: str, unit: str, kind: str) -> str:
    """The Prometheus name of an OpenTelemetry metric, without a counter's `_total`."""
    base = re.sub(r"[^a-zA-Z0-9_:]", "_", name)
    suffix = UNIT_SUFFIX.get(unit)
    if suffix == "ratio" and kind != "gauge":
        suffix = None
    if suffix and not base.endswith("_" + suffix):
        base += "_" + suffix
    return base


def prom_label(key: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def label_value(v: str | int | bool) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def log2_le_buckets(p: HistPoint) -> list[tuple[str, int]]:
    """Cumulative `le` buckets in seconds for the kernel's log2 slots, sparse: the upper
    bound of each non-empty slot and of the slot below it, then +Inf (which also holds
    the last slot). The bounds left out sit between two equal cumulative counts, so
    `histogram_quantile` gives what it would with all of them; a series of 40 slots
    does not become 41 series per label set, and a bound once shown stays (counts only
    grow)."""
    counts = [int(n) for n in p.slots.tolist()]
    last = len(counts) - 1  # the overflow slot: only in +Inf
    keep = {j for i, n in enumerate(counts[:last]) if n for j in (i - 1, i) if j >= 0}
    if last >= 1 and counts[last]:
        keep.add(last - 1)
    out, cum = [], 0
    for i in range(last):
        cum += counts[i]
        if i in keep:
            out.append((repr(float(1 << (i + 1)) * p.scale), cum))
    out.append(("+Inf", p.count))
    return out


def go_float(d: float) -> str:
    """A value as Go (and prometheus_client) prints it: 100.0, 1.6e-05, 1.2345678e+07."""
    d = float(d)
    if d != d:
        return "NaN"
    if d in (float("inf"), float("-inf")):
        return "+Inf" if d > 0 else "-Inf"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def _num(v: float) -> str:
    """go_float, with the common case (a small whole number) without float formatting."""
    if type(v) is int and 0 <= v < 1_000_000:
        return f"{v}.0"
    return go_float(v)


def _escape(v: str) -> str:
    if "\\" in v or "\n" in v or '"' in v:
        v = v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return v


class _Labels:
    """Label text per attribute set, made once per set and scrape: the families of one
    series group share their attribute dict, so it is keyed by identity (the families
    keep the dicts alive while a scrape renders)."""

    def __init__(self) -> None:
        self._text: dict[int, tuple[str, str, str]] = {}

    def of(self, attrs: Attrs) -> tuple[str, str, str]:
        """'{a="1",b="2"}', and the two halves around where `le` sorts in."""
        key = id(attrs)
        got = self._text.get(key)
        if got is None:
            pairs = sorted((prom_label(k), _escape(label_value(v))) for k, v in attrs.items())
            before = ",".join(f'{k}="{v}"' for k, v in pairs if k < "le")
            after = ",".join(f'{k}="{v}"' for k, v in pairs if k >= "le")
            whole = ",".join(x for x in (before, after) if x)
            got = self._text[key] = (
                f"{{{whole}}}" if whole else "",
                f"{{{before}," if before else "{",
                f",{after}}}" if after else "}",
            )
        return got


def render(fams: Iterable[Family]) -> str:
    """The exposition text of these families (each family's points may carry
    different attribute keys: every sample shows its own)."""
    labels = _Labels()
    out: list[str] = []
    add = out.append
    for fam in fams:
        name = prom_name(fam.name, fam.unit, fam.kind)
        if fam.kind == "counter":
            name += "_total"
        help_ = fam.description.replace("\\", "\\\\").replace("\n", "\\n")
        add(f"# HELP {name} {help_}\n# TYPE {name} {fam.kind}\n")
        if fam.kind == "histogram":
            for p in fam.points:
                assert isinstance(p, HistPoint)
                whole, head, tail = labels.of(p.attrs)
                for le, cum in log2_le_buckets(p):
                    add(f'{name}_bucket{head}le="{le}"{tail} {_num(cum)}\n')
                add(f"{name}_count{whole} {_num(p.count)}\n")
                add(f"{name}_sum{whole} {go_float(p.sum)}\n")
            continue
        for p in fam.points:
            assert isinstance(p, Point)
            add(f"{name}{labels.of(p.attrs)[0]} {_num(p.value)}\n")
    return "".join(out)
