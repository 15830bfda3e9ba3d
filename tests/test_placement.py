"""Tests of conduit.placement: the exact plan, its explanation, the heuristic's bound, capacity errors,
the named baselines and the re-plan hysteresis."""

from __future__ import annotations

import random
import time
from dataclasses import replace

import pytest

from conduit.errors import CapacityError, ConfigError
from conduit.placement import (
    HEURISTIC_FACTOR,
    Access,
    Field,
    PlacementCapacityError,
    all_pageable_host,
    one_gpu,
    pinned_zero_copy,
    plan,
    sharded_gpus,
    should_replan,
)
from conduit.topology import Link, Tier, Topology

GB = 10**9


def _both(src: str, dst: str, gb_per_s: float, latency_us: float = 5.0) -> list[Link]:
    return [Link(src, dst, gb_per_s, latency_us), Link(dst, src, gb_per_s, latency_us)]


def _node(
    node: str, gpus: int, hbm: int, pinned: int, host: int, rng: random.Random | None = None
) -> tuple[list[Tier], list[Link]]:
    """One node: ``gpus`` HBM tiers, a pinned and a pageable host tier, all linked both ways."""

    def bw(x: float) -> float:
        return x * rng.uniform(0.5, 1.5) if rng else x

    tiers = [Tier(f"{node}/cuda:{g}", "hbm", node, hbm, f"cuda:{g}") for g in range(gpus)]
    tiers += [Tier(f"{node}/pinned", "pinned", node, pinned), Tier(f"{node}/host", "host", node, host)]
    links = _both(f"{node}/host", f"{node}/pinned", bw(20.0))
    for g in range(gpus):
        gpu = f"{node}/cuda:{g}"
        links += _both(f"{node}/pinned", gpu, bw(50.0)) + _both(f"{node}/host", gpu, bw(10.0))
        for h in range(g + 1, gpus):
            links += _both(gpu, f"{node}/cuda:{h}", bw(400.0), 2.0)
    return tiers, links


def _topology(
    nodes: int, gpus: int, hbm: int, pinned: int, host: int, rng: random.Random | None = None
) -> Topology:
    tiers: list[Tier] = []
    links: list[Link] = []
    for n in range(nodes):
        t, lk = _node(f"node{n}", gpus, hbm, pinned, host, rng)
        tiers += t
        links += lk
    for a in range(nodes):  # nodes reach each other host to host only (a slower network)
        for b in range(a + 1, nodes):
            links += _both(f"node{a}/host", f"node{b}/host", 12.5, 20.0)
    return Topology(tuple(tiers), tuple(links), "test")


# ------------------------------------------------------------------------------------ known optimum


def _hot_and_cold() -> tuple[list[Field], Topology, dict[str, int]]:
    topo = _topology(1, 1, hbm=80 * GB, pinned=16 * GB, host=512 * GB)
    host, gpu = Access("node0/host"), "node0/cuda:0"
    fields = [
        # read 32 times per iteration by the learner: HBM saves the most
        Field("hot", 12 * GB // 1000, 1000, writers=(host,), readers=(Access(gpu, 32.0),)),
        # cheaper on HBM too, but 12 + 30 GB exceed the 40 GB left after the model; too big for pinned
        Field(
            "cold", 30 * GB // 100, 100, writers=(Access("node0/host", 0.25),), readers=(Access(gpu, 1.0),)
        ),
        Field("unread", 1 * GB, 1, writers=(host,)),
    ]
    return fields, topo, {gpu: 40 * GB}


def test_known_optimum_hot_to_hbm_cold_to_host() -> None:
    fields, topo, headroom = _hot_and_cold()
    p = plan(fields, topo, headroom=headroom)
    assert p.method.startswith("exact")
    assert p.assignment == {"hot": "node0/cuda:0", "cold": "node0/host", "unread": "node0/host"}
    # hot: one write host->HBM (12 GB at 10 GB/s); cold: one read HBM<-host (30 GB at 10 GB/s)
    lat = 5e-6
    assert p.per_field_s["hot"] == pytest.approx(1.2 + lat)
    assert p.per_field_s["cold"] == pytest.approx(3.0 + lat)
    assert p.per_field_s["unread"] == 0.0
    assert p.predicted_s == pytest.approx(sum(p.per_field_s.values()))
    assert p.tier_bytes["node0/cuda:0"] == 12 * GB
    assert p.tier_bytes["node0/host"] == 31 * GB


def test_capacity_respected_and_headroom_kept() -> None:
    fields, topo, headroom = _hot_and_cold()
    p = plan(fields, topo, headroom=headroom)
    for tier in topo.tiers:
        assert p.tier_bytes[tier.name] <= tier.capacity_bytes - headroom.get(tier.name, 0)
    assert plan([], topo, headroom=headroom).assignment == {}
    # without headroom both fit on the GPU
    free = plan(fields, topo)
    assert free.assignment["cold"] == "node0/cuda:0"
    assert free.predicted_s < p.predicted_s


def test_explain_names_each_field_its_runner_up_and_the_binding_budget() -> None:
    fields, topo, headroom = _hot_and_cold()
    text = plan(fields, topo, headroom=headroom).explain()
    lines = {ln.split()[0]: ln for ln in text.splitlines()[1:] if ln.startswith("  ") and "->" in ln}
    assert set(lines) == {"hot", "cold", "unread"}
    assert "runner-up node0/pinned" in lines["hot"] and "no budget binds" in lines["hot"]
    assert "runner-up node0/cuda:0" in lines["cold"]
    assert "budget of node0/cuda:0 binds" in lines["cold"] and "short" in lines["cold"]
    assert "total:" in text.splitlines()[-1]
    assert "exact" in text.splitlines()[0]


# ------------------------------------------------------------------------------------ the heuristic


def _random_instance(
    rng: random.Random, n_fields: int, nodes: int, gpus: int, max_items: int = 100, host_gb: int = 0
) -> tuple[list[Field], Topology]:
    """Each field lives around a home node (its writers and most readers there); some are also read
    from another node's host, so the home host tier is always reachable."""
    hbm, pinned = rng.randint(20, 60) * GB, rng.randint(10, 40) * GB
    host = (host_gb or rng.choice([40, 60, 200])) * GB  # 40 and 60 GB: budgets often bind
    topo = _topology(nodes, gpus, hbm, pinned, host, rng=rng)
    fields = []
    for i in range(n_fields):
        home = rng.randrange(nodes)
        local = [f"node{home}/host"] + [f"node{home}/cuda:{g}" for g in range(gpus)]
        writers = tuple(
            Access(rng.choice(local), rng.choice([0.25, 0.5, 1.0])) for _ in range(rng.randint(1, 2))
        )
        readers = [
            Access(rng.choice(local), rng.choice([0.125, 1.0, 2.0, 4.0, 16.0]))
            for _ in range(rng.randint(0, 3))
        ]
        if nodes > 1 and rng.random() < 0.2:
            readers.append(Access(f"node{(home + 1) % nodes}/host", rng.choice([0.125, 1.0])))
        fields.append(
            Field(f"f{i}", rng.randint(1, 400) * 10**6, rng.randint(1, max_items), writers, tuple(readers))
        )
    return fields, topo


def test_heuristic_within_factor_of_exact_on_random_instances() -> None:
    rng = random.Random(1234)
    ratios: list[float] = []
    bound = 0  # instances where a budget binds: the optimum is not every field on its cheapest tier
    while len(ratios) < 50:
        fields, topo = _random_instance(rng, rng.randint(4, 12), rng.randint(1, 2), rng.randint(1, 3))
        try:
            exact = plan(fields, topo)
        except CapacityError:
            continue
        heur = plan(fields, topo, exact_limit=0)
        assert exact.method.startswith("exact") and heur.method.startswith("heuristic")
        assert heur.predicted_s >= exact.predicted_s * (1 - 1e-9)
        ratios.append(heur.predicted_s / exact.predicted_s if exact.predicted_s > 0 else 1.0)
        bound += any(min(exact.costs[f].values()) < s * (1 - 1e-9) for f, s in exact.per_field_s.items())
        for t in topo.tiers:
            assert heur.tier_bytes[t.name] <= t.capacity_bytes
    print(
        f"heuristic/exact over {len(ratios)} instances ({bound} with a binding budget):"
        f" worst {max(ratios):.4f}, mean {sum(ratios) / len(ratios):.4f}"
    )
    assert bound >= 15
    assert max(ratios) <= HEURISTIC_FACTOR


def test_large_instance_uses_the_heuristic_fast() -> None:
    rng = random.Random(7)
    fields, topo = _random_instance(rng, 400, nodes=2, gpus=4, max_items=8, host_gb=200)
    assert len(topo.tiers) == 12  # 400 fields x 12 tiers = 4800 variables > the default exact_limit
    start = time.perf_counter()
    p = plan(fields, topo)
    elapsed = time.perf_counter() - start
    assert p.method.startswith("heuristic")
    assert elapsed < 2.0, elapsed
    for t in topo.tiers:
        assert p.tier_bytes[t.name] <= t.capacity_bytes
    assert len(p.explain().splitlines()) >= 400


def test_a_self_link_prices_access_on_the_fields_own_tier() -> None:
    fields, topo, headroom = _hot_and_cold()
    gather = Link("node0/cuda:0", "node0/cuda:0", 2000.0, 10.0)  # HBM-to-HBM gather
    p = plan(fields, Topology(topo.tiers, (*topo.links, gather), "test"), headroom=headroom)
    assert p.assignment["hot"] == "node0/cuda:0"
    assert p.per_field_s["hot"] == pytest.approx(1.2 + 5e-6 + 32 * (12 / 2000 + 10e-6))


# --------------------------------------------------------------------------------- capacity errors


def test_total_demand_over_budget_names_missing_bytes() -> None:
    topo = _topology(1, 1, hbm=10 * GB, pinned=5 * GB, host=20 * GB)
    fields = [Field(f"f{i}", GB, 8, (Access("node0/host"),)) for i in range(5)]  # 40 GB into 35 GB
    with pytest.raises(CapacityError, match="5000000000 bytes missing") as info:
        plan(fields, topo)
    assert isinstance(info.value, PlacementCapacityError)
    assert info.value.missing_bytes == 5 * GB


def test_field_that_fits_nowhere_names_the_tier_and_headroom() -> None:
    topo = _topology(1, 1, hbm=10 * GB, pinned=5 * GB, host=20 * GB)
    fields = [Field("small", GB, 1), Field("huge", GB, 25)]
    with pytest.raises(PlacementCapacityError, match="'huge'") as info:
        plan(fields, topo, headroom={"node0/host": 2 * GB})
    assert info.value.missing_bytes == 7 * GB  # 25 GB against 20 - 2 GB on the host
    assert info.value.tiers == ("node0/host",)
    assert "headroom 2000000000" in str(info.value)


def test_packing_infeasible_though_total_fits() -> None:
    # 6 + 6 + 3 GB into tiers of 10, 5, 5 GB: 15 <= 20 in total, but the 6 GB fields fit only on n/a
    topo = Topology(
        (
            Tier("n/a", "host", "n", 10 * GB),
            Tier("n/b", "host", "n", 5 * GB),
            Tier("n/c", "host", "n", 5 * GB),
        ),
        (),
        "test",
    )
    fields = [Field(f"f{i}", 6 * GB, 1) for i in range(2)] + [Field("g", 3 * GB, 1)]
    # f0, f1 only fit on n/a (10 GB): one of them is left 2 GB short
    with pytest.raises(PlacementCapacityError, match="no packing") as info:
        plan(fields, topo)
    assert info.value.missing_bytes == 2 * GB


def test_bad_input_is_a_config_error() -> None:
    topo = _topology(1, 1, hbm=10 * GB, pinned=5 * GB, host=20 * GB)
    with pytest.raises(ConfigError, match="unknown tier"):
        plan([Field("x", 1, 1, readers=(Access("node9/cuda:0"),))], topo)
    with pytest.raises(ConfigError, match="twice"):
        plan([Field("x", 1, 1), Field("x", 1, 1)], topo)
    with pytest.raises(ConfigError, match="headroom"):
        plan([Field("x", 1, 1)], topo, headroom={"nope": 1})
    with pytest.raises(ConfigError, match="per_iteration"):
        plan([Field("x", 1, 1, readers=(Access("node0/host", -1.0),))], topo)


def test_unreachable_tiers_are_not_candidates() -> None:
    topo = _topology(2, 1, hbm=80 * GB, pinned=16 * GB, host=64 * GB)
    # written on node0's host, read on node1's host: node0's pinned and GPU tiers do not reach node1
    f = Field("x", GB, 1, (Access("node0/host"),), (Access("node1/host"),))
    p = plan([f], topo)
    assert p.assignment["x"] in {"node0/host", "node1/host"}
    assert p.per_field_s["x"] == pytest.approx(1 / 12.5 + 20e-6)
    island = Topology((Tier("a/host", "host", "a", GB), Tier("b/host", "host", "b", GB)), (), "test")
    with pytest.raises(ConfigError, match="no tier has links to and from all of its accesses"):
        plan([Field("y", 1, 1, (Access("a/host"),), (Access("b/host"),))], island)


# -------------------------------------------------------------------------------------- baselines


def _baseline_case() -> tuple[list[Field], Topology]:
    topo = _topology(1, 2, hbm=80 * GB, pinned=64 * GB, host=512 * GB)
    fields = [
        Field(f"f{i}", GB, 10, (Access("node0/host"),), (Access(f"node0/cuda:{i % 2}", 4.0),))
        for i in range(4)
    ]
    return fields, topo


def test_baselines_assignments_and_costs() -> None:
    fields, topo = _baseline_case()
    host = all_pageable_host(fields, topo)
    assert set(host.assignment.values()) == {"node0/host"}
    assert host.per_field_s["f0"] == pytest.approx(4 * (1.0 + 5e-6))  # 4 reads of 10 GB at 10 GB/s
    pinned = pinned_zero_copy(fields, topo)
    assert set(pinned.assignment.values()) == {"node0/pinned"}
    assert one_gpu(fields, topo).assignment == dict.fromkeys(["f0", "f1", "f2", "f3"], "node0/cuda:0")
    sharded = sharded_gpus(fields, topo)
    assert sharded.assignment == {
        "f0": "node0/cuda:0",
        "f1": "node0/cuda:1",
        "f2": "node0/cuda:0",
        "f3": "node0/cuda:1",
    }
    best = plan(fields, topo)
    assert best.assignment == sharded.assignment  # each field on the GPU that reads it
    for base in (host, pinned, one_gpu(fields, topo)):
        assert best.predicted_s <= base.predicted_s
        assert base.method.startswith("baseline")


def test_baselines_raise_when_they_do_not_fit() -> None:
    fields, topo = _baseline_case()
    with pytest.raises(PlacementCapacityError, match="one_gpu") as info:
        one_gpu(fields, topo, headroom={"node0/cuda:0": 50 * GB})  # 40 GB into 30 GB
    assert info.value.missing_bytes == 10 * GB and info.value.tiers == ("node0/cuda:0",)
    with pytest.raises(CapacityError, match="sharded_gpus"):
        sharded_gpus(fields, topo, headroom={"node0/cuda:1": 70 * GB})
    with pytest.raises(CapacityError):
        pinned_zero_copy(fields, topo, headroom={"node0/pinned": 30 * GB})
    no_gpu = _topology(1, 0, hbm=0, pinned=GB, host=GB)
    with pytest.raises(ConfigError, match="hbm"):
        one_gpu([Field("x", 1, 1)], no_gpu)


# -------------------------------------------------------------------------------------- hysteresis


def test_should_replan_only_past_the_threshold() -> None:
    fields, topo, headroom = _hot_and_cold()
    current = plan(fields, topo, headroom=headroom)
    roomier = plan(fields, topo)  # 4.2 s -> 1.95 s
    assert should_replan(current, roomier)
    assert not should_replan(roomier, current)
    assert not should_replan(current, current)
    slightly = replace(current, predicted_s=current.predicted_s * 0.95)
    assert not should_replan(current, slightly, threshold=0.1)
    assert should_replan(current, slightly, threshold=0.04)
    assert should_replan(current, roomier, threshold=0.5)
    assert not should_replan(current, roomier, threshold=0.6)
    with pytest.raises(ConfigError):
        should_replan(current, roomier, threshold=1.0)
