"""Topology: validation errors, described files, discovery on this machine, its cache, the CLI."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from conduit import discovery as topo_mod
from conduit.cli import draw_png, format_table, main
from conduit.discovery import discover
from conduit.errors import ConfigError
from conduit.topology import Link, Tier, Topology, load

EXAMPLES = Path(__file__).resolve().parent.parent / "topologies"
FILES = ["h200x8.toml", "gpu8_nonuniform.toml", "cluster4.toml", "cluster128_h100.toml"]


def two_tiers() -> tuple[Tier, Tier]:
    return Tier("node0/host", "host", "node0", 10**9), Tier("node0/cuda:0", "hbm", "node0", 10**9, "cuda:0")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.toml"
    path.write_text(text)
    return path


def load_edited(tmp_path: Path, good: str, edit: tuple[str, str], message: str) -> None:
    """``good`` with ``edit`` (old, new) applied must fail to load, with an error matching ``message``."""
    text = good.replace(*edit)
    assert text != good
    with pytest.raises(ConfigError, match=message):
        load(write(tmp_path, text))


GOOD = """
tiers = [
  { name = "node0/host", kind = "host", capacity_bytes = 1000, copy_gb_per_s = 10, copy_latency_us = 1 },
  { name = "node0/disk", kind = "disk", capacity_bytes = 5000 },
]
[[links]]
src = "node0/host"
dst = "node0/disk"
both_ways = true
gb_per_s = 2
latency_us = 100
"""


# ------------------------------------------------------------------------------------------ validation


def test_link_to_unknown_tier_names_it():
    host, gpu = two_tiers()
    with pytest.raises(ConfigError, match="unknown tier 'node0/cuda:9'"):
        Topology((host, gpu), (Link("node0/host", "node0/cuda:9", 10, 1),), "test")


def test_link_pattern_matching_no_tier_in_a_file_names_it(tmp_path):
    path = write(tmp_path, GOOD.replace('dst = "node0/disk"', 'dst = "node0/cuda:*"'))
    with pytest.raises(ConfigError, match=r"t\.toml.*links\[0\]: dst 'node0/cuda:\*' names no tier"):
        load(path)


@pytest.mark.parametrize("bad", [0, -5.0, float("nan"), "fast", True])
def test_bandwidth_must_be_positive(bad):
    with pytest.raises(ConfigError, match="link 'a' -> 'b': gb_per_s must be a finite number > 0"):
        Link("a", "b", bad, 1.0)


def test_negative_bandwidth_or_latency_in_a_file(tmp_path):
    with pytest.raises(ConfigError, match="gb_per_s must be a finite number > 0, got -2"):
        load(write(tmp_path, GOOD.replace("gb_per_s = 2", "gb_per_s = -2")))
    with pytest.raises(ConfigError, match="latency_us must be a finite number >= 0, got -100"):
        load(write(tmp_path, GOOD.replace("latency_us = 100", "latency_us = -100")))


def test_duplicate_tier_names_and_links():
    host, gpu = two_tiers()
    with pytest.raises(ConfigError, match="duplicate tier name 'node0/host'"):
        Topology((host, gpu, host), (), "test")
    lk = Link("node0/host", "node0/cuda:0", 10, 1)
    with pytest.raises(ConfigError, match="link 'node0/host' -> 'node0/cuda:0' is given twice"):
        Topology((host, gpu), (lk, lk), "test")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ((", capacity_bytes = 5000", ""), r"tiers\[1\]: missing key 'capacity_bytes'"),
        (("latency_us = 100", ""), r"links\[0\]: missing key 'latency_us'"),
        (
            ("capacity_bytes = 5000", 'capacity_bytes = "5 kB"'),
            "capacity_bytes must be an integer >= 0, got '5 kB'",
        ),
        (
            ("capacity_bytes = 5000", "capacity_bytes = 5.5"),
            "capacity_bytes must be an integer >= 0, got 5.5",
        ),
        (('kind = "disk"', 'kind = "tape"'), "kind must be one of"),
        (("both_ways = true", 'both_ways = "yes"'), "both_ways must be true or false"),
        (("both_ways = true", "speed = 3"), r"unknown key\(s\) \['speed'\]"),
        ((", copy_latency_us = 1", ""), "give both copy_gb_per_s and copy_latency_us"),
        (("tiers = [", "tiers = [ [ "), "not valid TOML"),
    ],
)
def test_malformed_file_names_the_problem(tmp_path, edit, message):
    load_edited(tmp_path, GOOD, edit, message)


def test_missing_file_and_hbm_without_device(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match="an hbm tier needs device"):
        Tier("node0/cuda:0", "hbm", "node0", 1)


def test_transfer_seconds_and_round_trip(tmp_path):
    t = load(write(tmp_path, GOOD))
    assert t.nodes == ("node0",) and t.tier("node0/disk").capacity_bytes == 5000
    assert t.transfer_seconds("node0/host", "node0/disk", 2e9) == pytest.approx(1.0 + 100e-6)
    assert t.transfer_seconds("node0/host", "node0/host", 1e10) == pytest.approx(1.0 + 1e-6)  # the self link
    assert t.transfer_seconds("node0/host", "node0/disk", 0) == 0.0
    with pytest.raises(ConfigError, match="no link 'node0/disk' -> 'node0/disk'.*self link"):
        t.transfer_seconds("node0/disk", "node0/disk", 1)  # in place is never assumed free
    with pytest.raises(ConfigError, match="no tier 'node0/shm'"):
        t.transfer_seconds("node0/shm", "node0/disk", 1)
    assert t.missing_links() == [("node0/disk", "node0/disk")]
    again = Topology.from_dict(json.loads(json.dumps(t.to_dict())))
    assert again == t and again.source == t.source


# ------------------------------------------------------------------------------------ described files


@pytest.mark.parametrize("name", FILES)
def test_example_files_load_complete_and_cite_their_sources(name):
    path = EXAMPLES / name
    t = load(path)
    assert t.missing_links() == []  # every ordered pair of tiers, self pairs included
    assert all(lk.gb_per_s > 0 and lk.latency_us >= 0 for lk in t.links)
    text = path.read_text()
    defined = set(re.findall(r"^# \[([A-Z0-9]+)\]", text, flags=re.M))
    used = set(re.findall(r"\[([A-Z][A-Z0-9]+)\]", text))
    assert defined and used <= defined, f"tags cited but not defined in the sources: {used - defined}"
    assert text.count("[[links]]") <= text.count("# ") // 2  # each link entry carries comments


def test_h200x8_has_nvlink_between_every_gpu_pair():
    t = load(EXAMPLES / "h200x8.toml")
    gpus = [x.name for x in t.tiers if x.kind == "hbm"]
    assert len(gpus) == 8 and {x.kind for x in t.tiers} == {"hbm", "pinned", "host", "shm", "disk"}
    nvlink = {t.link(a, b).gb_per_s for a in gpus for b in gpus if a != b}  # type: ignore[union-attr]
    pcie = t.link("node0/pinned", "node0/cuda:0")
    assert pcie is not None and nvlink == {450.0} and pcie.gb_per_s == pytest.approx(63.0)


def test_gpu8_nonuniform_is_faster_within_a_group_than_across():
    t = load(EXAMPLES / "gpu8_nonuniform.toml")
    within = t.transfer_seconds("node0/cuda:0", "node0/cuda:3", 1e9)
    across = t.transfer_seconds("node0/cuda:0", "node0/cuda:4", 1e9)
    assert across > 3 * within
    assert t.link("node0/cuda:5", "node0/cuda:6").gb_per_s == t.link("node0/cuda:1", "node0/cuda:2").gb_per_s  # type: ignore[union-attr]


def test_cluster4_network_is_much_slower_than_inside_a_node():
    t = load(EXAMPLES / "cluster4.toml")
    assert t.nodes == ("node0", "node1", "node2", "node3")
    kinds = [sorted(x.kind for x in t.tiers_on(n)) for n in t.nodes]
    assert all(k == kinds[0] for k in kinds)
    cross = [lk for lk in t.links if t.tier(lk.src).node != t.tier(lk.dst).node]
    assert len(cross) == 4 * 3 * 6 * 6 and max(lk.gb_per_s for lk in cross) == 50
    inside = t.transfer_seconds("node1/cuda:0", "node1/cuda:1", 1e9)
    assert t.transfer_seconds("node0/cuda:0", "node1/cuda:0", 1e9) > 5 * inside


def test_cluster128_stands_for_1024_h100_with_one_nic_per_gpu():
    t = load(EXAMPLES / "cluster128_h100.toml")
    assert t.nodes == ("node0", "node1") and t.node_count == 128 and t.gpu_count == 1024
    assert t.tier("node1/cuda:7").capacity_bytes == 80_000_000_000
    assert t.link("node0/cuda:3", "node1/cuda:5").gb_per_s == 50  # type: ignore[union-attr]
    assert t.link("node0/host", "node1/host").gb_per_s == 50  # type: ignore[union-attr]
    again = Topology.from_dict(json.loads(json.dumps(t.to_dict())))
    assert again == t and again.node_count == 128


TWO_NODES = """
node_count = 4
tiers = [
  { name = "a/host", kind = "host", capacity_bytes = 1000 },
  { name = "b/host", kind = "host", capacity_bytes = 1000 },
]
[[links]]
src = "*/host"
dst = "*/host"
gb_per_s = 1
latency_us = 1
"""


@pytest.mark.parametrize(
    "edit, message",
    [
        (("node_count = 4", "node_count = 1"), r"node_count must be an integer >= the 2 node\(s\)"),
        (("node_count = 4", "node_count = 4.5"), "node_count must be an integer"),
        (("capacity_bytes = 1000 },\n]", "capacity_bytes = 999 },\n]"), "'b' differs from 'a'"),
        (('  { name = "b/host", kind = "host", capacity_bytes = 1000 },\n', ""), "needs two written nodes"),
    ],
)
def test_node_count_is_checked(tmp_path, edit, message):
    load_edited(tmp_path, TWO_NODES, edit, message)


def test_node_count_defaults_to_the_written_nodes(tmp_path):
    t = load(write(tmp_path, TWO_NODES.replace("node_count = 4", "")))
    assert t.node_count == 2 and t.gpu_count == 0 and "node_count" not in t.to_dict()
    four = load(write(tmp_path, TWO_NODES))
    assert four.node_count == 4 and four.without("disk") is four


# ------------------------------------------------------------------------------------------- discovery


def test_discovery_on_this_machine_and_its_cache(tmp_path, monkeypatch):
    t = discover(cache_dir=str(tmp_path), seconds=0.3)
    kinds = {x.kind: x for x in t.tiers}
    assert {"host", "shm", "disk"} <= set(kinds) and t.nodes == ("node0",)
    assert all(kinds[k].capacity_bytes > 0 for k in ("host", "shm", "disk"))
    assert t.missing_links() == [] and len(t.links) == len(t.tiers) ** 2
    assert all(lk.gb_per_s > 0 and lk.latency_us >= 0 for lk in t.links)
    (cache,) = tmp_path.glob("topology-*.json")
    assert json.loads(cache.read_text())["fingerprint"] == topo_mod.fingerprint()

    def no_measuring(*args, **kwargs):
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(topo_mod, "_calibrate", no_measuring)
    hit = discover(cache_dir=str(tmp_path), seconds=0.3)
    assert hit.links == t.links and "calibration cache" in hit.source
    with pytest.raises(AssertionError, match="cache should have been used"):
        discover(cache_dir=str(tmp_path), recalibrate=True)


def test_unreadable_cache_is_measured_again(tmp_path, monkeypatch):
    calls = []

    def fake(tiers, seconds):
        calls.append(seconds)
        return tuple(Link(a.name, b.name, 1.0, 1.0) for a in tiers for b in tiers)

    monkeypatch.setattr(topo_mod, "_calibrate", fake)
    discover(cache_dir=str(tmp_path), seconds=0.1)
    (cache,) = tmp_path.glob("topology-*.json")
    cache.write_text("{ not json")
    t = discover(cache_dir=str(tmp_path), seconds=0.1)
    assert len(calls) == 2 and t.missing_links() == []
    with pytest.raises(ConfigError, match="seconds must be a number > 0"):
        discover(cache_dir=str(tmp_path), seconds=0)


# ------------------------------------------------------------------------------------------------- CLI


def test_cli_prints_and_draws_a_described_topology(tmp_path, capsys):
    out = tmp_path / "h200.png"
    assert main(["topology", "--file", str(EXAMPLES / "h200x8.toml"), "--png", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "node0/cuda:7" in printed and "141.00 GB" in printed and "450" in printed and "µs" in printed
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_discovers_this_machine(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(
        topo_mod,
        "_calibrate",
        lambda tiers, s: tuple(Link(a.name, b.name, 2.0, 3.0) for a in tiers for b in tiers),
    )
    assert main(["topology", "--cache-dir", str(tmp_path), "--seconds", "0.2"]) == 0
    printed = capsys.readouterr().out
    assert "node0/host" in printed and "node0/disk" in printed and "this machine" in printed


def test_cli_errors(tmp_path, capsys):
    bad = write(tmp_path, GOOD.replace("gb_per_s = 2", "gb_per_s = 0"))
    assert main(["topology", "--file", str(bad)]) == 2
    assert "gb_per_s must be a finite number > 0" in capsys.readouterr().err
    assert main(["topology", "--file", str(bad), "--recalibrate"]) == 2
    assert "--recalibrate" in capsys.readouterr().err


def test_png_without_matplotlib_is_a_clear_error(tmp_path, monkeypatch):
    t = load(write(tmp_path, GOOD))
    assert "node0/disk" in format_table(t)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ConfigError, match="--png needs matplotlib"):
        draw_png(t, str(tmp_path / "x.png"))
