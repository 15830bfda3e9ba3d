"""Topology: memory tiers, their free capacity, and the measured links between them.

A :class:`Topology` is either *discovered* on this machine (:func:`conduit.discovery.discover`:
capacities read from the OS and CUDA, links measured by a short calibration, cached per machine) or
*described* in a TOML file (``topologies/*.toml``) to plan for machines we do not have. Units: bytes, GB/s (1e9 bytes per second), microseconds. Links are directed; a copy within
one tier uses that tier's self link, so a move is never assumed free.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from conduit.errors import ConfigError

log = logging.getLogger(__name__)

TIER_KINDS = ("hbm", "pinned", "host", "shm", "disk")
_LINK_SCOPES = ("any", "same-node", "cross-node")


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _field(where: str, name: str, value: object, ok: bool, what: str) -> None:
    if not ok:
        raise ConfigError(f"{where}: {name} must be {what}, got {value!r}")


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _is_name(x: object) -> bool:
    return isinstance(x, str) and bool(x)


@dataclass(frozen=True)
class Tier:
    """One memory tier of one node, e.g. ``Tier("node0/cuda:0", "hbm", "node0", 141e9, "cuda:0")``."""

    name: str
    kind: str
    node: str
    capacity_bytes: int
    device: str | None = None

    def __post_init__(self) -> None:
        _field("tier", "name", self.name, _is_name(self.name), "a non-empty string")
        w = f"tier {self.name!r}"
        _field(w, "kind", self.kind, self.kind in TIER_KINDS, f"one of {TIER_KINDS}")
        _field(w, "node", self.node, _is_name(self.node), "a non-empty string")
        cap, dev = self.capacity_bytes, self.device
        _field(
            w, "capacity_bytes", cap, isinstance(cap, int) and _is_number(cap) and cap >= 0, "an integer >= 0"
        )
        _field(w, "device", dev, dev is None or _is_name(dev), "a non-empty string or absent")
        _need(self.kind != "hbm" or self.device is not None, f"{w}: an hbm tier needs device (e.g. 'cuda:0')")

    @property
    def buffer_tier(self) -> str:
        """The ``BufferConfig`` tier string that allocates here: ``'cuda:N'``, ``'pinned'``, ``'host'``, ..."""
        if self.kind == "hbm" and self.device is not None:
            return self.device
        return self.kind


@dataclass(frozen=True)
class Link:
    """A directed link between two tiers (``src == dst``: a copy within the tier)."""

    src: str
    dst: str
    gb_per_s: float
    latency_us: float

    def __post_init__(self) -> None:
        for end in (self.src, self.dst):
            _field("link", "each end", end, _is_name(end), "a tier name")
        w, bw, lat = f"link {self.src!r} -> {self.dst!r}", self.gb_per_s, self.latency_us
        _field(w, "gb_per_s", bw, _is_number(bw) and bw > 0, "a finite number > 0")
        _field(w, "latency_us", lat, _is_number(lat) and lat >= 0, "a finite number >= 0")
        object.__setattr__(self, "gb_per_s", float(bw))
        object.__setattr__(self, "latency_us", float(lat))

    def seconds(self, nbytes: float) -> float:
        """Predicted time to move ``nbytes`` over this link: latency + bytes / bandwidth."""
        return self.latency_us * 1e-6 + nbytes / (self.gb_per_s * 1e9)


@dataclass(frozen=True)
class Topology:
    """Tiers (unique names) and directed links between them; ``source`` says where it came from.

    ``node_count`` (default: the nodes written out) describes a larger cluster of identical nodes
    compactly: the written nodes (at least two, all of one shape) stand for all ``node_count`` of them,
    every node like each written one and every pair of nodes linked like two written ones.
    """

    tiers: tuple[Tier, ...]
    links: tuple[Link, ...]
    source: str = "in memory"
    node_count: int | None = None
    _tiers: dict[str, Tier] = field(init=False, repr=False, compare=False)
    _links: dict[tuple[str, str], Link] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tiers", tuple(self.tiers))
        object.__setattr__(self, "links", tuple(self.links))
        _need(len(self.tiers) > 0, "a topology needs at least one tier")
        tiers: dict[str, Tier] = {}
        for t in self.tiers:
            _need(isinstance(t, Tier), f"tiers must be Tier objects, got {t!r}")
            _need(t.name not in tiers, f"duplicate tier name {t.name!r}")
            tiers[t.name] = t
        links: dict[tuple[str, str], Link] = {}
        for lk in self.links:
            _need(isinstance(lk, Link), f"links must be Link objects, got {lk!r}")
            for end in (lk.src, lk.dst):
                _need(
                    end in tiers,
                    f"link {lk.src!r} -> {lk.dst!r}: unknown tier {end!r} (tiers: {', '.join(tiers)})",
                )
            _need((lk.src, lk.dst) not in links, f"link {lk.src!r} -> {lk.dst!r} is given twice")
            links[(lk.src, lk.dst)] = lk
        object.__setattr__(self, "_tiers", tiers)
        object.__setattr__(self, "_links", links)
        self._check_node_count()

    def _check_node_count(self) -> None:
        written, n = self.nodes, self.node_count
        if n is None:
            object.__setattr__(self, "node_count", len(written))
            return
        _field(
            "topology",
            "node_count",
            n,
            isinstance(n, int) and not isinstance(n, bool) and n >= len(written),
            f"an integer >= the {len(written)} node(s) written out",
        )
        if n == len(written):
            return
        _need(len(written) >= 2, f"node_count = {n} needs two written nodes to show how nodes are linked")
        shapes = {node: self._shape(node) for node in written}
        first = written[0]
        for node, shape in shapes.items():
            _need(
                shape == shapes[first],
                f"node_count = {n} needs identical written nodes; {node!r} differs from {first!r} "
                "(tier names after the node, kinds, capacities, devices)",
            )

    def _shape(self, node: str) -> tuple[tuple[str, str, int, str | None], ...]:
        return tuple(
            (t.name.split("/", 1)[-1], t.kind, t.capacity_bytes, t.device) for t in self.tiers_on(node)
        )

    @property
    def gpu_count(self) -> int:
        """GPUs (hbm tiers) in the whole cluster: per written node times ``node_count``."""
        written = sum(t.kind == "hbm" for t in self.tiers)
        return written * (self.node_count or len(self.nodes)) // len(self.nodes)

    def without(self, kind: str) -> Topology:
        """This topology less its tiers of ``kind`` (and their links); itself if it has none or only those."""
        keep = tuple(t for t in self.tiers if t.kind != kind)
        if len(keep) in (0, len(self.tiers)):
            return self
        names = {t.name for t in keep}
        links = tuple(lk for lk in self.links if lk.src in names and lk.dst in names)
        return Topology(keep, links, self.source, self.node_count)

    @property
    def nodes(self) -> tuple[str, ...]:
        """Node names in order of first appearance."""
        return tuple(dict.fromkeys(t.node for t in self.tiers))

    def tier(self, name: str) -> Tier:
        if name not in self._tiers:
            raise ConfigError(
                f"topology {self.source!r} has no tier {name!r} (tiers: {', '.join(self._tiers)})"
            )
        return self._tiers[name]

    def tiers_on(self, node: str) -> tuple[Tier, ...]:
        return tuple(t for t in self.tiers if t.node == node)

    def link(self, src: str, dst: str) -> Link | None:
        return self._links.get((src, dst))

    def missing_links(self) -> list[tuple[str, str]]:
        """Ordered tier pairs (self pairs included) that have no link."""
        return [
            (a.name, b.name) for a in self.tiers for b in self.tiers if (a.name, b.name) not in self._links
        ]

    def transfer_seconds(self, src: str, dst: str, nbytes: float) -> float:
        """Predicted seconds to move ``nbytes`` from tier ``src`` to ``dst`` (0 bytes: 0 s)."""
        _need(_is_number(nbytes) and nbytes >= 0, f"nbytes must be a finite number >= 0, got {nbytes!r}")
        self.tier(src)
        self.tier(dst)
        lk = self.link(src, dst)
        if lk is None:
            hint = " (a copy within a tier uses its self link)" if src == dst else ""
            raise ConfigError(f"topology {self.source!r} has no link {src!r} -> {dst!r}{hint}")
        return 0.0 if nbytes == 0 else lk.seconds(nbytes)

    def to_dict(self) -> dict[str, Any]:
        tiers = [{k: v for k, v in asdict(t).items() if v is not None} for t in self.tiers]
        out: dict[str, Any] = {
            "source": self.source,
            "tiers": tiers,
            "links": [asdict(lk) for lk in self.links],
        }
        if self.node_count != len(self.nodes):
            out["node_count"] = self.node_count
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str | None = None) -> Topology:
        """Build from :meth:`to_dict` output or a described file's table (see ``topologies/README.md``
        forms: a tier's ``copy_gb_per_s``/``copy_latency_us`` is its self link; a link's ``src``/``dst``
        may be lists of names or glob patterns, with ``both_ways`` and ``scope``)."""
        _need(isinstance(data, Mapping), f"a topology must be a table, got {type(data).__name__}")
        unknown = set(data) - {"source", "description", "tiers", "links", "node_count"}
        _need(
            not unknown,
            f"unknown top-level key(s) {sorted(unknown)}; expected tiers, links, description, node_count",
        )
        raw_tiers: Any = data.get("tiers")
        _need(isinstance(raw_tiers, list) and bool(raw_tiers), "'tiers' must be a non-empty array of tables")
        raw_links = data.get("links", [])
        _need(isinstance(raw_links, list), "'links' must be an array of tables")
        tiers: list[Tier] = []
        links: list[Link] = []
        for i, raw in enumerate(raw_tiers):
            tier, self_link = _tier_from(raw, f"tiers[{i}]")
            tiers.append(tier)
            links.extend(self_link)
        for i, raw in enumerate(raw_links):
            links.extend(_links_from(raw, f"links[{i}]", tiers))
        return cls(
            tuple(tiers),
            tuple(links),
            source if source is not None else str(data.get("source", "described")),
            data.get("node_count"),
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Topology:
        """Read a described topology from a TOML file."""
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise ConfigError(f"topology file {str(p)!r}: cannot read it: {e}") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"topology file {str(p)!r}: not valid TOML: {e}") from None
        try:
            return cls.from_dict(data, source=str(p))
        except ConfigError as e:
            raise ConfigError(f"topology file {str(p)!r}: {e}") from None


load = Topology.load


def _check_keys(
    raw: object, where: str, required: tuple[str, ...], optional: tuple[str, ...]
) -> dict[str, Any]:
    _need(isinstance(raw, Mapping), f"{where}: must be a table, got {raw!r}")
    assert isinstance(raw, Mapping)
    for key in required:
        _need(key in raw, f"{where}: missing key {key!r}")
    extra = set(raw) - set(required) - set(optional)
    _need(not extra, f"{where}: unknown key(s) {sorted(extra)}; allowed: {', '.join(required + optional)}")
    return dict(raw)


def _tier_from(raw: object, where: str) -> tuple[Tier, list[Link]]:
    opt = ("node", "device", "copy_gb_per_s", "copy_latency_us")
    d = _check_keys(raw, where, ("name", "kind", "capacity_bytes"), opt)
    name = d["name"]
    node: Any = d.get("node")
    if node is None and isinstance(name, str) and "/" in name:
        node = name.split("/", 1)[0]  # "node0/host" -> "node0"
    _need(node is not None or not isinstance(name, str), f"{where} ({name!r}): missing key 'node'")
    tier = Tier(name, d["kind"], node, d["capacity_bytes"], d.get("device"))
    copy = [k for k in ("copy_gb_per_s", "copy_latency_us") if k in d]
    if not copy:
        return tier, []
    _need(len(copy) == 2, f"{where} ({name!r}): give both copy_gb_per_s and copy_latency_us, or neither")
    return tier, [Link(name, name, d["copy_gb_per_s"], d["copy_latency_us"])]


def _links_from(raw: object, where: str, tiers: list[Tier]) -> list[Link]:
    d = _check_keys(raw, where, ("src", "dst", "gb_per_s", "latency_us"), ("both_ways", "scope"))
    scope, both = d.get("scope", "any"), d.get("both_ways", False)
    _need(scope in _LINK_SCOPES, f"{where}: scope must be one of {_LINK_SCOPES}, got {scope!r}")
    _need(isinstance(both, bool), f"{where}: both_ways must be true or false, got {both!r}")
    ends: dict[str, list[Tier]] = {}
    for side in ("src", "dst"):
        pats = d[side] if isinstance(d[side], list) else [d[side]]
        _need(
            bool(pats) and all(isinstance(p, str) for p in pats),
            f"{where}: {side} must be a tier name or a list of names",
        )
        ends[side] = []
        for pat in pats:
            hit = [t for t in tiers if fnmatch.fnmatchcase(t.name, pat)]
            _need(
                bool(hit),
                f"{where}: {side} {pat!r} names no tier (tiers: {', '.join(t.name for t in tiers)})",
            )
            ends[side].extend(t for t in hit if t not in ends[side])
    explicit_self = len(ends["src"]) == len(ends["dst"]) == 1  # "a" -> "a" written out: a self link
    pairs: list[tuple[str, str]] = []
    for a in ends["src"]:
        for b in ends["dst"]:
            same = a.node == b.node
            if (a.name == b.name and not explicit_self) or (scope == "same-node" and not same):
                continue
            if scope == "cross-node" and same:
                continue
            pairs.append((a.name, b.name))
            if both and a.name != b.name:
                pairs.append((b.name, a.name))
    _need(bool(pairs), f"{where}: src/dst/scope select no tier pair")
    return [Link(a, b, d["gb_per_s"], d["latency_us"]) for a, b in dict.fromkeys(pairs)]


# ---------------------------------------------------------------------------------------------- discovery
