"""The Prometheus text exposition format (0.0.4), rendered straight from a `Source`'s
families into one string, and the Prometheus names of OpenTelemetry metrics.

Names follow OpenTelemetry's Prometheus compatibility rules: dots become underscores,
the unit becomes a suffix (`By` -> `_bytes`, `s` -> `_seconds`, `1` -> `_ratio` on
gauges; annotations such as `{operation}` add nothing), counters end in `_total`.
So `process.disk.io` in bytes is `process_disk_io_bytes_total`, and the attribute
`process.pid` is the label `process_pid`. Histograms are Prometheus histograms in
seconds whose `le` bounds are the kernel's log2 slot bounds in the family's range
(series.py, `BucketRange`): the same bounds for every series of a family, so that
`histogram_quantile(q, sum by (le) (...))` over several series is right.

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
from collections.abc import Iterable, Iterator
from functools import cache

import numpy as np

from .series import Attrs, BucketRange, Buckets, Family, HistPoint, Point

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


@cache  # attribute keys are few, and a scrape asks for each thousands of times
def prom_label(key: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def label_value(v: str | int | bool) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def log2_le_buckets(p: HistPoint, bounds: BucketRange) -> list[tuple[str, int]]:
    """Cumulative `le` buckets of one series of a family whose bounds are `bounds`:
    each bound of the range, then +Inf (the count). Every series of the family gets the
    same bounds, so `sum by (le)` over them is the histogram of their merged values."""
    b = bounds.of(len(p.slots), p.scale)
    return list(zip(_le_texts(b), b.cumulative(p.slots), strict=True))


def _le_texts(b: Buckets) -> tuple[str, ...]:
    return (*(repr(x) for x in b.bounds), "+Inf")


def _bucket_lines(name: str, les: tuple[str, ...], suffix: str) -> str:
    """A format string of one series' `_bucket` lines: {0} and {1} the label text
    before and after `le`, {2}... the cumulative counts (each followed by `suffix`)."""
    return "".join(
        f'{name}_bucket{{0}}le="{le}"{{1}} {{{k}}}{suffix}\n' for k, le in enumerate(les, start=2)
    )


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


def _histogram(name: str, fam: Family, labels: _Labels) -> Iterator[str]:
    """A histogram family's lines. Per kernel layout (slot count and scale: one per
    family in practice, whose series stay in order), the cumulative counts of every
    series come from one numpy pass and the bucket lines from one format string, so a
    series costs one `format` call."""
    by_layout: dict[tuple[int, float], list[HistPoint]] = {}
    for p in fam.points:
        assert isinstance(p, HistPoint)
        by_layout.setdefault((len(p.slots), p.scale), []).append(p)
    for layout, points in by_layout.items():
        b = fam.bounds.of(*layout)
        les = _le_texts(b)
        whole_counts, preformatted = _bucket_lines(name, les, ".0"), _bucket_lines(name, les, "")
        rows = b.cumulative_rows(np.stack([p.slots for p in points]))
        for p, cum in zip(points, rows, strict=True):
            whole, head, tail = labels.of(p.attrs)
            if cum[-1] < 1_000_000:  # each count as _num writes it: "12.0"
                yield whole_counts.format(head, tail, *cum)
            else:
                yield preformatted.format(head, tail, *map(_num, cum))
            yield f"{name}_count{whole} {_num(cum[-1])}\n"
            yield f"{name}_sum{whole} {go_float(p.sum)}\n"


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
            out.extend(_histogram(name, fam, labels))
            continue
        for p in fam.points:
            assert isinstance(p, Point)
            add(f"{name}{labels.of(p.attrs)[0]} {_num(p.value)}\n")
    return "".join(out)
