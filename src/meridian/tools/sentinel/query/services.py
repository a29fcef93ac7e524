"""`meridian sentinel query top-services`: the stored flows grouped by their listening
side (model/services.py), summed in the store: the rollups of the range, per flow and
direction, joined with the flows' 5-tuples (ms_flows), the service decided by SQL
and grouped there, so a range of a million short connections answers in a few rows.

The service rules are model/services.py's 2-4, on the 5-tuple alone (the store does
not know which sockets the agent's host listened on), with Linux's default ephemeral
range: the agent's live view can differ for a server its host listened on whose
port those rules would not pick (a server on an ephemeral port). Flows the store has
no 5-tuple for are summed into one row, `(5-tuple not stored)`.

The SQL runs on ClickHouse 18.16 (Debian's server) and chDB alike: an explicit `ALL
LEFT JOIN ... USING` (18.16 needs the strictness said) of two subqueries with aliases
(chDB needs them), the right one one row per flow_id (so ALL and ANY are the same),
and no alias that names a column it aggregates.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ....errors import UsageError
from ..model.services import EPHEMERAL, WELL_KNOWN, ServiceKey
from ..model.window import direction_name
from ..storage.backend import Backend
from .store import _where, parse_event_code

__all__ = ["SQL", "UNNAMED", "ServiceRow", "top_services"]

UNNAMED = "(5-tuple not stored)"

# 1 when the flow's source side listens: rules 2-4 of model/services.py
_AT_SRC = (
    "multiIf((sport < {wk}) != (dport < {wk}), sport < {wk}, "
    "(sport BETWEEN {lo} AND {hi}) != (dport BETWEEN {lo} AND {hi}), dport BETWEEN {lo} AND {hi}, "
    "sport != dport, sport < dport, src <= dst)"
).format(wk=WELL_KNOWN, lo=EPHEMERAL[0], hi=EPHEMERAL[1])

SQL = {
    "top_services": "SELECT service_addr, service_port, proto, direction, "
    "uniqExact(flow_id) AS flows, sum(n0) AS n, sum(c0) AS cost FROM ("
    "SELECT flow_id, direction, n0, c0, proto, named, "
    f"{_AT_SRC} AS at_src, "
    "if(named = 0, '', if(at_src, src, dst)) AS service_addr, "
    "if(named = 0, 0, if(at_src, sport, dport)) AS service_port FROM ("
    "SELECT flow_id, direction, sum(samples) AS n0, sum(norm_cost) AS c0 "
    "FROM ms_flow_rollup WHERE {where} AND flow_id != 0 GROUP BY flow_id, direction"
    ") AS r ALL LEFT JOIN ("
    "SELECT flow_id, any(src) AS src, any(dst) AS dst, any(sport) AS sport, "
    "any(dport) AS dport, any(proto) AS proto, toUInt8(1) AS named FROM ms_flows "
    "WHERE flow_id IN (SELECT flow_id FROM ms_flow_rollup WHERE {where}) GROUP BY flow_id"
    ") AS f USING flow_id) "
    "GROUP BY service_addr, service_port, proto, direction "
    "ORDER BY cost DESC, service_addr, service_port, proto, direction LIMIT {limit}",
}


@dataclass(frozen=True)
class ServiceRow:
    """One service and direction: its flows, samples and cost; `addr` None for the
    flows the store has no 5-tuple for."""

    addr: str | None
    port: int | None
    proto: str | None
    direction: str
    flows: int
    samples: int
    norm_cost: float

    @property
    def label(self) -> str:
        """`10.0.0.1:8080 tcp` (ServiceKey's form), or UNNAMED."""
        if self.addr is None:
            return UNNAMED
        return str(ServiceKey(self.addr, self.port or 0, self.proto or ""))

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["norm_cost"] = round(self.norm_cost, 6)
        return out


def _row(r: dict[str, Any]) -> ServiceRow:
    named = bool(r["service_addr"])
    return ServiceRow(
        str(r["service_addr"]) if named else None,
        int(r["service_port"]) if named else None,
        str(r["proto"]) if named else None,
        direction_name(int(r["direction"])),
        int(r["flows"]),
        int(r["n"]),
        float(r["cost"]),
    )


def top_services(
    backend: Backend,
    since_s: float,
    event: str | int | None = None,
    limit: int = 20,
    *,
    now_s: float | None = None,
) -> list[ServiceRow]:
    """The `limit` (service, direction) rows with the most norm cost in the last
    `since_s` seconds (of one event when given), highest first; samples on no flow
    are left out, as in top-flows."""
    if not isinstance(limit, int) or limit < 1:
        raise UsageError(f"--limit: expected a whole number above zero, got {limit!r}")
    code = parse_event_code(event) if isinstance(event, str) else event
    where = _where(since_s, now_s, event=code)
    return [_row(r) for r in backend.query(SQL["top_services"].format(where=where, limit=limit))]
