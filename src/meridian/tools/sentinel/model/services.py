"""Services: flows grouped by their listening side (address, port, protocol), so that
400 short connections to one server read as one row, `10.0.0.1:8080 tcp (400 flows)`,
not as 400 rows of a sample or two each. A flow and its reverse direction (each its
own flow id: the kernel keys src -> dst) have the same service; a service row keeps
the direction (rx/tx as the flow was seen) and the event, like a flow row.

Which side listens, for a flow `src:sport -> dst:dport proto`, the first rule that
tells the two sides apart:

1. the side that is a socket listening on this host: TCP in state LISTEN, or UDP bound
   and unconnected on a port outside the ephemeral range (an unconnected UDP socket
   on an ephemeral port is most often a client's: a resolver's); matched by protocol,
   port and address, or a wildcard address (0.0.0.0, ::). Read from the agent's
   /proc/net/{tcp,tcp6,udp,udp6} (pipeline/listening.py): the host's network
   namespace only, so flows between other namespaces (containers, veth pairs) fall
   through to the rules below, which need nothing of the host;
2. the side whose port is well-known (below 1024) when the other's is not;
3. the side whose port is outside the ephemeral range (the host's
   /proc/sys/net/ipv4/ip_local_port_range, Linux's default 32768-60999) when the
   other's is in it: clients connect from ephemeral ports;
4. the lower port; equal ports (ICMP has none) the lower address as text.

Rules 2-4 are a function of the 5-tuple alone, so `meridian sentinel query
top-services` applies them in SQL (query/store.py, with the default range); it
differs from the agent only for a server the host listens on whose port rules 2-4
would not pick (a server on an ephemeral port, or above its clients' ports).

A service row counts its flows, directional 5-tuples: on a host that holds both ends
of a connection (two namespaces of one host), the connection is seen arriving at
each end, so it can be two rx flows (and two tx flows) of its service.

A row whose flow has no known 5-tuple yet (the source names flows up to half a second
after their first samples) stays that flow's own row, and the run's totals
(`ServiceTotals`) merge it into its service once the name is known; flow 0 (no flow,
idle) is its own row as in the flow view.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .flows import FlowKey
from .window import FlowStat, Names

__all__ = [
    "EPHEMERAL",
    "WELL_KNOWN",
    "Listening",
    "ServiceKey",
    "ServiceStat",
    "ServiceTotals",
    "server_side",
    "service_lookup",
    "service_stats",
]

EPHEMERAL = (32768, 60999)  # Linux's default ip_local_port_range
WELL_KNOWN = 1024  # ports below it are well-known (privileged)
_WILDCARDS = ("0.0.0.0", "::")

ServiceOf = Callable[[int], "ServiceKey | None"]


@dataclass(frozen=True, order=True)
class ServiceKey:
    """The listening side of a flow: `10.0.0.1:8080 tcp`."""

    addr: str
    port: int
    proto: str

    def __str__(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"{host}:{self.port} {self.proto}" if self.port else f"{host} {self.proto}"


@dataclass(frozen=True)
class Listening:
    """The sockets this host listens on, as (proto, address, port); the address may
    be a wildcard. An IPv4-mapped IPv6 address is kept as the IPv4 one (as `has`
    looks it up)."""

    sockets: frozenset[tuple[str, str, int]] = frozenset()

    def has(self, proto: str, addr: str, port: int) -> bool:
        s = self.sockets
        if not s:
            return False
        if ":" in addr:  # ::ffff:10.0.0.1 is 10.0.0.1 to /proc/net
            mapped = ipaddress.IPv6Address(addr).ipv4_mapped
            addr = str(mapped) if mapped is not None else addr
        return (proto, addr, port) in s or any((proto, w, port) in s for w in _WILDCARDS)


NOBODY = Listening()


def _side(key: FlowKey, src: bool) -> ServiceKey:
    if src:
        return ServiceKey(key.src, key.sport, str(key.proto))
    return ServiceKey(key.dst, key.dport, str(key.proto))


def server_side(
    key: FlowKey, listening: Listening = NOBODY, ephemeral: tuple[int, int] = EPHEMERAL
) -> ServiceKey:
    """The service of a flow: its listening side by the module's rules."""
    src, dst = _side(key, True), _side(key, False)
    lo, hi = ephemeral
    tests: tuple[Callable[[ServiceKey], bool], ...] = (
        lambda s: listening.has(s.proto, s.addr, s.port),
        lambda s: s.port < WELL_KNOWN,
        lambda s: not lo <= s.port <= hi,
    )
    for test in tests:
        a, b = test(src), test(dst)
        if a != b:
            return src if a else dst
    if src.port != dst.port:
        return src if src.port < dst.port else dst
    return src if src.addr <= dst.addr else dst


def service_lookup(names: Names) -> ServiceOf:
    """flow id -> its service: the names' own `service` (the runtime's, which knows
    the host's listening sockets), else the rules on the 5-tuple alone."""
    found: ServiceOf | None = getattr(names, "service", None)
    if found is not None:
        return found

    def service(flow_id: int) -> ServiceKey | None:
        key = names.flow(flow_id) if flow_id else None
        return server_side(key) if key is not None else None

    return service


@dataclass
class ServiceStat(FlowStat):
    """One (service, direction, event) row: the sums of its flows, and which flows
    (`flow_ids`; `more_flows`: the count is a lower bound, past the bound of ids kept).
    With no service, the row of one flow whose 5-tuple is not known (`flow_id`) or
    of no flow (flow_id 0), as in the flow view."""

    service: ServiceKey | None = None
    flow_ids: set[int] = field(default_factory=set)
    more_flows: bool = False

    @property
    def flows(self) -> int:
        return len(self.flow_ids)

    def flows_text(self) -> str:
        n = self.flows
        return f"{n}+ flows" if self.more_flows else f"{n} flow" if n == 1 else f"{n} flows"


Key = tuple[ServiceKey | None, int, int, int]  # service, flow id (no service), dir, event


def _key(s: FlowStat, service: ServiceKey | None) -> Key:
    return (service, 0 if service is not None else s.flow_id, s.direction, s.event)


def _order(s: ServiceStat) -> tuple[float, str, int, int, int]:
    return (-s.norm_cost, str(s.service or ""), s.flow_id, s.direction, s.event)


def _merge_into(cells: dict[Key, ServiceStat], k: Key, s: FlowStat) -> ServiceStat:
    cell = cells.get(k)
    if cell is None:
        cell = cells[k] = ServiceStat(k[1], k[2], k[3], service=k[0])
    cell.merge(s)
    return cell


def service_stats(stats: Iterable[FlowStat], service_of: ServiceOf) -> list[ServiceStat]:
    """A window's flow rows summed per (service, direction, event), highest norm cost
    first."""
    cells: dict[Key, ServiceStat] = {}
    for s in stats:
        service = service_of(s.flow_id) if s.flow_id else None
        cell = _merge_into(cells, _key(s, service), s)
        if s.flow_id:
            cell.flow_ids.add(s.flow_id)
    return sorted(cells.values(), key=_order)


class ServiceTotals:
    """The whole run by service, for the exit summary, fed every window's flow rows:
    bounded like model.window.Totals (the `max_rows` costliest rows, the
    `max_per_row` costliest functions and stacks of each), and at most `max_ids` flow
    ids kept to count the flows (past it, counts are lower bounds). Rows of flows not
    named yet are merged into their service at each window and before `top`."""

    def __init__(
        self,
        service_of: ServiceOf,
        max_rows: int = 4096,
        max_per_row: int = 64,
        max_ids: int = 1 << 18,
    ) -> None:
        self.service_of = service_of
        self.max_rows = max_rows
        self.max_per_row = max_per_row
        self.max_ids = max_ids
        self.rows: dict[Key, ServiceStat] = {}
        self._ids = 0

    def add(self, stats: Iterable[FlowStat]) -> None:
        self._name_pending()
        for s in stats:
            service = self.service_of(s.flow_id) if s.flow_id else None
            self._add(s, service, {s.flow_id} if s.flow_id else set(), False)
        if len(self.rows) > 2 * self.max_rows:
            keep = sorted(self.rows.values(), key=_order)[: self.max_rows]
            self.rows = {_key(s, s.service): s for s in keep}
            self._ids = sum(s.flows for s in keep)

    def _add(self, s: FlowStat, service: ServiceKey | None, ids: set[int], more: bool) -> None:
        cell = _merge_into(self.rows, _key(s, service), s)
        new = ids - cell.flow_ids
        room = max(0, self.max_ids - self._ids)
        if len(new) > room:
            new = set(sorted(new)[:room])
            more = True
        cell.flow_ids |= new
        cell.more_flows |= more
        self._ids += len(new)
        if len(cell.functions) > 2 * self.max_per_row:
            cell.functions = dict(cell.hottest(self.max_per_row))
        if len(cell.stacks) > 2 * self.max_per_row:
            cell.stacks = dict(cell.hottest_stacks(self.max_per_row))

    def _name_pending(self) -> None:
        """Rows of a flow with no service yet: into their service once it is known."""
        for k, s in list(self.rows.items()):
            if k[0] is not None or not s.flow_id:
                continue
            service = self.service_of(s.flow_id)
            if service is not None:
                del self.rows[k]
                self._ids -= s.flows
                self._add(s, service, s.flow_ids, s.more_flows)

    def top(self, n: int) -> list[ServiceStat]:
        self._name_pending()
        return sorted(self.rows.values(), key=_order)[:n]
