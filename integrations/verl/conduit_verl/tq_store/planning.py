"""``default_tier=auto``: the store's fields planned by Conduit's placement planner.

Candidates are the tiers a reader on the same node maps and reads in place (``shm``, ``disk``), so
every choice keeps reads zero-copy; ``host``, ``pinned`` and ``cuda`` are used when pinned by hand
(``placement.<field>=<tier>``). Each field is priced with its projected size and its *observed*
traffic — puts and reads counted per field so far (plus one of each, so a new field is not free) —
over this machine's measured links (``conduit.discovery``), within the store's budgets. A field's
tier changes when its array next grows (the re-allocation copies it anyway: no extra copy); until
then it stays where it is.
"""

from __future__ import annotations

import logging

from conduit.discovery import local_topology
from conduit.errors import ConduitError
from conduit.placement import Access, Field, plan
from conduit.topology import Tier, Topology

logger = logging.getLogger(__name__)

CANDIDATES = ("shm", "disk")


def _store_topology(base: Topology, budgets: dict[str, int | None]) -> tuple[Topology, dict[str, str]]:
    """The node's host, shm and disk tiers; shm and disk capacities capped by the store's budgets,
    host kept only as the writers' tier (no capacity: not a candidate)."""
    node = base.nodes[0]
    chosen, names = [], {}
    for t in base.tiers_on(node):
        if t.kind not in ("host", *CANDIDATES) or t.kind in names:
            continue
        cap = 0 if t.kind == "host" else t.capacity_bytes
        limit = budgets.get(t.kind)
        if limit is not None:
            cap = min(cap, limit)
        chosen.append(Tier(t.name, t.kind, t.node, cap, t.device))
        names[t.kind] = t.name
    kept = {t.name for t in chosen}
    links = tuple(lk for lk in base.links if lk.src in kept and lk.dst in kept)
    return Topology(tuple(chosen), links, base.source), names


def plan_store_tiers(
    sizes: dict[str, int], puts: dict[str, int], reads: dict[str, int], budgets: dict[str, int | None]
) -> dict[str, str] | None:
    """A tier (``shm`` or ``disk``) per field of ``sizes`` (projected bytes), or None when the planner
    finds no placement within ``budgets`` (total bytes per tier; the spill rule then decides)."""
    try:
        topo, names = _store_topology(local_topology(), budgets)
        if not all(k in names for k in ("host", *CANDIDATES)):
            return None
        fields = [
            Field(
                name,
                nbytes,
                1,
                (Access(names["host"], 1 + puts.get(name, 0)),),
                (Access(names["shm"], 1 + reads.get(name, 0)),),
            )
            for name, nbytes in sizes.items()
        ]
        chosen = plan(fields, topo)
    except ConduitError as e:
        logger.info("conduit tq store: no planned placement (%s); the spill rule decides", e)
        return None
    back = {v: k for k, v in names.items()}
    logger.info("conduit tq store: planned placement\n%s", chosen.explain())
    return {name: back[tier] for name, tier in chosen.assignment.items()}
