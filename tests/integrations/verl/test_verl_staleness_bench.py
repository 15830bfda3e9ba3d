"""``benchmarks/verl_staleness.py`` without Ray: staleness from a run's files, the rows' fields, the
ratio refused at unequal measured staleness, and its renderer.

The runs are files written here the way the CPU harness writes them (``metrics.jsonl``: one
``{"step", "data"}`` line per step; ``gen_events.jsonl``; a conduit run's ``groups.jsonl`` from
``conduit_verl.staleness.StalenessLedger``); ``verl_runs.run`` is replaced by a writer of such files, so
what is checked is the benchmark's own analysis and the flags it gives each system.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from blank_values import blank

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCH))

import report  # noqa: E402
import report_staleness  # noqa: E402
import verl_runs  # noqa: E402
import verl_staleness as vs  # noqa: E402
import verl_staleness_analysis as va  # noqa: E402

ROW_FIELDS = (
    "algo",
    "system",
    "max_staleness",
    "staleness_median",
    "staleness_max",
    "wall_s",
    "exposed_s",
    "work",
    "prompts_trained",
    "prompts_generated",
    "stale_dropped",
    "update_weights_s",
)
BATCH = 4


def _metrics(work: Path, steps: dict[int, dict[str, float]], wall: float = 8.0) -> None:
    lines, events = [], []
    for step, extra in steps.items():
        data = {
            "timing_s/step": wall,
            "timing_s/gen": 3.0,
            "timing_s/old_log_prob": 0.5,
            "timing_s/ref": 0.4,
            "timing_s/update_actor": 2.0,
            "timing_s/update_weights": 0.02,
            "critic/score/mean": 0.1 * step,
            **extra,
        }
        lines.append(json.dumps({"step": step, "data": data}))
        events += [json.dumps({"version": step, "t0": 10.0 * step, "t1": 10.0 * step + 2.5, "length": 7})] * 8
    work.mkdir(parents=True, exist_ok=True)
    (work / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (work / "gen_events.jsonl").write_text("\n".join(events) + "\n")


def _groups(work: Path, lags: dict[int, list[int]]) -> list[str]:
    return [
        json.dumps(
            {"step": s, "uid": f"u{s}_{i}", "generated": s - 1 - lag, "trained": s - 1, "staleness": lag}
        )
        for s, per in lags.items()
        for i, lag in enumerate(per)
    ]


def _conduit_metrics(lags: list[int], dropped: int = 0) -> dict[str, float]:
    return {
        "conduit/staleness/groups": float(len(lags)),
        "conduit/staleness/median": float(sorted(lags)[len(lags) // 2]),
        "conduit/staleness/max": float(max(lags)),
        "conduit/staleness/mean": sum(lags) / len(lags),
        "conduit/stale_dropped": float(dropped),
        "conduit/exposed_s": 0.3,
    }


def test_conduit_staleness_comes_from_the_group_log_and_its_last_run(tmp_path: Path) -> None:
    lags = {1: [0, 0, 0, 0], 2: [1, 1, 1, 0], 3: [1, 1, 1, 1]}
    _metrics(tmp_path, {s: _conduit_metrics(v, dropped=2 if s == 3 else 0) for s, v in lags.items()})
    earlier = _groups(tmp_path, {1: [0] * 4, 2: [9] * 4})  # an earlier run in a reused work dir
    (tmp_path / "groups.jsonl").write_text("\n".join(earlier + _groups(tmp_path, lags)) + "\n")
    assert va.group_lags(tmp_path / "groups.jsonl") == lags
    per = va.step_staleness(tmp_path, "conduit_k1", BATCH)
    assert per[2]["staleness_median"] == 1.0 and per[2]["staleness_max"] == 1.0
    assert per[2]["staleness_mean"] == 0.75 and per[2]["staleness_source"] == "group_log"
    assert per[2]["lags"] == [1, 1, 1, 0]
    assert per[3]["stale_dropped"] == 2 and per[3]["prompts_trained"] == 4


def test_a_group_log_that_disagrees_with_the_metrics_is_not_used(tmp_path: Path) -> None:
    _metrics(tmp_path, {1: _conduit_metrics([0, 0, 0, 0]), 2: _conduit_metrics([1, 1, 2, 2])})
    (tmp_path / "groups.jsonl").write_text("\n".join(_groups(tmp_path, {1: [0] * 4, 2: [1, 1]})) + "\n")
    per = va.step_staleness(tmp_path, "conduit_k2", BATCH)
    assert per[1]["staleness_source"] == "group_log"
    assert per[2]["staleness_source"] == "conduit_metrics"  # 2 logged groups, 4 trained: the metrics
    assert per[2]["staleness_max"] == 2.0 and per[2]["lags"] is None


def test_verl_staleness_is_verls_per_step_mean_and_max(tmp_path: Path) -> None:
    worst = va.VERL_WORST
    _metrics(
        tmp_path,
        {
            1: {f"{worst}/mean": 0.0, f"{worst}/max": 0.0},
            2: {f"{worst}/mean": 0.75, f"{worst}/max": 1.0, va.VERL_EVICTED: 3},
        },
    )
    per = va.step_staleness(tmp_path, "verl_colocate_async+tq_conduit", BATCH)
    assert per[2] == {
        "staleness_median": 0.75,  # the step's mean: verl has no per-group source
        "staleness_max": 1.0,
        "staleness_mean": 0.75,
        "staleness_source": "verl_step_mean",
        "lags": None,
        "prompts_trained": BATCH,
        "stale_dropped": 3,
    }
    assert per[1]["stale_dropped"] == 0  # verl logs no eviction count when it evicts nothing


def test_bounds_and_the_conduit_systems_flags() -> None:
    assert va.bound("conduit_k2") == 2 and va.bound("conduit_k0+tq_simple") == 0
    assert va.bound("verl_sync_tuned") == 0 and va.bound("verl_colocate_async+tq_conduit") is None
    modes = vs.conduit_modes(["conduit_k1", "verl_colocate_async"], "auto")
    assert modes == {
        "conduit_k1": (
            "conduit",
            [
                "+trainer.v1.conduit.max_staleness=1",
                "+trainer.v1.conduit.group_log={work}/groups.jsonl",
                "+trainer.v1.conduit.piece_groups=auto",
            ],
        )
    }


def test_verl_under_its_own_bound_is_the_same_trainer_with_verls_threshold() -> None:
    """``verl_colocate_async_k1``: verl's trainer, its own threshold = k + 1 versions spanned, dropping."""
    assert va.bound("verl_colocate_async_k1") == 1 and va.bound("verl_separate_async_k2+tq_conduit") == 2
    assert va.verl_async("verl_colocate_async_k1") and va.verl_async("verl_separate_async+tq_conduit")
    assert not va.verl_async("verl_sync_tuned") and not va.verl_async("conduit_k1")
    modes = vs.conduit_modes(["verl_colocate_async_k1", "verl_separate_async_k2+tq_conduit"], "auto")
    assert modes == {
        "verl_colocate_async_k1": (
            "colocate_async",
            [
                "trainer.v1.sampler.max_off_policy_threshold=2",
                "trainer.v1.sampler.max_off_policy_strategy=drop",
            ],
        ),
        "verl_separate_async_k2": (
            "separate_async",
            [
                "trainer.v1.sampler.max_off_policy_threshold=3",
                "trainer.v1.sampler.max_off_policy_strategy=drop",
            ],
        ),
    }
    assert "verl_colocate_async_k1" in vs.SYSTEMS  # the equal-bound baseline runs by default
    for bad in ("verl_colocate_async_k0", "verl_sync_k1"):
        with pytest.raises(SystemExit):
            vs.parse(["--systems", bad])


def test_the_equal_bound_ratio_and_its_targets(tmp_path: Path, monkeypatch) -> None:
    systems = ["verl_colocate_async", "verl_colocate_async_k1", "conduit_k1"]
    lags = dict.fromkeys(systems, K1)
    walls = {"verl_colocate_async": 10.0, "verl_colocate_async_k1": 11.0, "conduit_k1": 9.5}
    rows, summary, ratio, calls = _bench(tmp_path, monkeypatch, systems, lags, walls)
    assert calls["verl_colocate_async_k1"][:3] == [
        "colocate_async",
        "trainer.v1.sampler.max_off_policy_threshold=2",
        "trainer.v1.sampler.max_off_policy_strategy=drop",
    ]
    by = {s["system"]: s for s in summary}
    assert by["verl_colocate_async_k1"]["max_staleness"] == 1
    assert ratio["wall/conduit_k1_over_verl_colocate_async_k1"] == pytest.approx(0.864)
    t = va.targets(ratio, summary)
    assert t["k1_wall<=0.9x"] is False  # 9.5 / 10
    assert t["k1_equal_bound_wall<=0.9x"] is True  # 9.5 / 11


def test_parse_defaults_and_bad_systems() -> None:
    args = vs.parse([])
    assert args.systems.split(",") == list(vs.SYSTEMS) and args.poll == 0.02 and args.rollout == "paced"
    assert args.reward_steps == 0 and args.seeds == 3
    assert vs.parse(["--quick"]).systems.split(",") == list(vs.QUICK_SYSTEMS)
    for bad in ("conduit_kx", "verl_colocate_async+tq_fast", "conduit"):
        with pytest.raises(SystemExit):
            vs.parse(["--systems", bad])


def _fake_runs(lags_by_system: dict[str, dict[int, list[int]]], walls: dict[str, float]) -> Any:
    """A ``verl_runs.run`` that writes a finished run's files; records each call's flags."""
    calls: dict[str, list[str]] = {}

    def run(work: Path, mode: str, steps: int, args: Any, extra: list[str]) -> tuple[int, str]:
        system = work.name.rsplit("_r", 1)[0]
        calls[system] = [mode, *extra]
        lags = lags_by_system[system]
        if system.startswith("conduit"):
            _metrics(work, {s: _conduit_metrics(v) for s, v in lags.items()}, walls[system])
            log = next(x.split("=", 1)[1] for x in extra if "group_log=" in x)
            Path(log).write_text("\n".join(_groups(work, lags)) + "\n")
        else:
            w = va.VERL_WORST
            means = {s: {f"{w}/mean": sum(v) / len(v), f"{w}/max": max(v)} for s, v in lags.items()}
            _metrics(work, means, walls[system])
        (work / "summary.json").write_text(
            json.dumps({"tq_backend_ran": "Conduit" if "conduit" in system else "SimpleStorage"})
        )
        return 0, ""

    return run, calls


def _bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, systems: list[str], lags: dict, walls: dict):
    run, calls = _fake_runs(lags, walls)
    monkeypatch.setattr(verl_runs, "run", run)
    args = vs.parse(["--systems", ",".join(systems), "--steps", "3", "--rounds", "1"])
    plan = {
        "poll": args.poll,
        "rounds": 1,
        "steps": 3,
        "label": "",
        "harness": ["--rollout", "paced"],
        "info": {"rollout": "paced", "tail": 4.0, "R": 4.0},
        "modes": vs.conduit_modes(systems, "auto"),
    }
    result: dict[str, Any] = {"errors": {}}
    rows = verl_runs.run_systems(tmp_path, args, systems, plan, result)
    va.annotate(rows, result["work_dirs"], "", BATCH)
    summary = va.summarize(rows, systems)
    ratio = va.all_ratios(rows, summary)
    return rows, summary, ratio, calls


K1 = {1: [0] * 4, 2: [1] * 4, 3: [1] * 4, 4: [1] * 4}


def test_rows_fields_flags_and_the_ratio_at_equal_staleness(tmp_path: Path, monkeypatch) -> None:
    systems = ["verl_colocate_async", "verl_colocate_async+tq_conduit", "conduit_k1", "conduit_k0"]
    lags = {s: K1 for s in systems} | {"conduit_k0": {s: [0] * 4 for s in range(1, 5)}}
    walls = {
        "verl_colocate_async": 10.0,
        "verl_colocate_async+tq_conduit": 9.5,
        "conduit_k1": 8.0,
        "conduit_k0": 12.0,
    }
    rows, summary, ratio, calls = _bench(tmp_path, monkeypatch, systems, lags, walls)
    assert calls["conduit_k1"][0] == "conduit"
    assert "+trainer.v1.conduit.max_staleness=1" in calls["conduit_k1"]
    log = tmp_path / "conduit_k1_r0" / "groups.jsonl"
    assert f"+trainer.v1.conduit.group_log={log}" in calls["conduit_k1"]  # {work} = the run's dir
    assert calls["verl_colocate_async"][0] == "colocate_async"
    assert not any("max_staleness" in x for x in calls["verl_colocate_async"])
    # every verl async trainer polls at the benchmark's short period, not verl's 2 s (issue 47)
    assert calls["verl_colocate_async+tq_conduit"][1:5] == [
        "--poll-interval",
        "0.02",
        "--tq-backend",
        "conduit",
    ]
    assert calls["verl_colocate_async"][1:3] == ["--poll-interval", "0.02"]
    assert len(rows) == 4 * 3  # warm-up iteration dropped
    for row in rows:
        assert all(f in row for f in ROW_FIELDS), row
        assert row["update_weights_s"] == 0.02 and row["prompts_generated"] == BATCH
    by = {s["system"]: s for s in summary}
    assert by["conduit_k1"]["staleness_median"] == 1.0 and by["conduit_k1"]["staleness_max"] == 1.0
    assert by["conduit_k1"]["lag_histogram"] == {"1": 12}  # steps 2-4, 4 groups each
    assert by["conduit_k1"]["max_staleness"] == 1 and by["verl_colocate_async"]["max_staleness"] is None
    assert by["verl_colocate_async"]["staleness_source"].startswith("verl_step_mean")
    assert by["conduit_k0"]["staleness_max"] == 0.0
    for s in summary:
        assert all(f in s for f in ROW_FIELDS if f != "work"), s
        assert s["responses"] == 3 * 8 and s["prompts_generated"] == 3 * BATCH
    assert ratio["wall/conduit_k1_over_verl_colocate_async"] == pytest.approx(0.8)
    assert ratio["work/conduit_k1_vs_verl_colocate_async"] == "equal"
    assert ratio["backend/wall/verl_colocate_async+tq_conduit_over_verl_colocate_async"] == pytest.approx(
        0.95
    )
    assert "wall/conduit_k0_over_verl_colocate_async" not in ratio  # no k0 / async ratio at all
    t = va.targets(ratio, summary)
    assert t["k1_wall<=0.9x"] is True and t["k1_exposed<=0.5x"] is False
    # exposed: verl's = gen wait 0.5 + old_log_prob and ref 0.9; conduit's = 0.5 + conduit/exposed_s 0.3
    assert ratio["exposed/conduit_k1_over_verl_colocate_async"] == pytest.approx(0.8 / 1.4, abs=1e-3)
    assert t["backend_verl_colocate_async>=1.1x"] is False  # 0.95 > 1/1.1
    assert "backend_verl_colocate_async_storage_share" in t


def test_the_ratio_is_refused_at_unequal_staleness(tmp_path: Path, monkeypatch) -> None:
    systems = ["verl_colocate_async", "conduit_k1", "conduit_k2"]
    ahead = {1: [0] * 4, 2: [1] * 4, 3: [2] * 4, 4: [2] * 4}
    half = {1: [0] * 4, 2: [1, 1, 0, 0], 3: [1, 1, 0, 0], 4: [1, 1, 0, 0]}  # step means 0.5
    lags = {"verl_colocate_async": half, "conduit_k1": K1, "conduit_k2": ahead}
    walls = {"verl_colocate_async": 10.0, "conduit_k1": 8.0, "conduit_k2": 7.0}
    _, summary, ratio, _ = _bench(tmp_path, monkeypatch, systems, lags, walls)
    why = ratio["refused/conduit_k1_over_verl_colocate_async"]
    assert "staleness differs" in why and "staleness_median_of_step_means" in why and "0.5" in why
    assert "wall/conduit_k1_over_verl_colocate_async" not in ratio
    assert "staleness_max conduit_k2 2" in ratio["refused/conduit_k2_over_verl_colocate_async"]
    t = va.targets(ratio, summary)
    assert t["k1_wall<=0.9x"] is None and t["k1_exposed<=0.5x"] is None and "differs" in t["k1_refused"]
    by = {s["system"]: s for s in summary}
    assert va.staleness_differs(by, "conduit_k1", "conduit_k1") is None
    assert va.staleness_differs(by, "conduit_k1", "verl_missing") == "no measured staleness for verl_missing"
    assert "conduit_k1 trained staler data" in why


def test_the_ratio_is_computed_where_conduit_trained_fresher_data(tmp_path: Path, monkeypatch) -> None:
    """verl's unbounded async trainer reached lag 2 in a step; k = 1 never did: compared, both shown."""
    systems = ["verl_colocate_async", "conduit_k1"]
    ahead = {1: [0] * 4, 2: [1] * 4, 3: [2] * 4, 4: [1] * 4}
    lags = {"verl_colocate_async": ahead, "conduit_k1": K1}
    walls = {"verl_colocate_async": 10.0, "conduit_k1": 8.0}
    _, summary, ratio, _ = _bench(tmp_path, monkeypatch, systems, lags, walls)
    assert "refused/conduit_k1_over_verl_colocate_async" not in ratio
    assert ratio["wall/conduit_k1_over_verl_colocate_async"] == pytest.approx(0.8, abs=1e-3)
    assert "staleness_max 1" in ratio["staleness/conduit_k1_vs_verl_colocate_async"]
    by = {s["system"]: s for s in summary}
    assert va.staleness_differs(by, "verl_colocate_async", "conduit_k1")  # the other way round: staler


def test_the_renderer_shows_rows_ratios_refusals_and_survives_blank_values(
    tmp_path: Path, monkeypatch
) -> None:
    systems = ["verl_colocate_async", "verl_colocate_async+tq_conduit", "conduit_k1", "conduit_k2"]
    ahead = {1: [0] * 4, 2: [1] * 4, 3: [2] * 4, 4: [2] * 4}
    lags = {s: K1 for s in systems} | {"conduit_k2": ahead}
    walls = dict.fromkeys(systems, 9.0)
    rows, summary, ratio, _ = _bench(tmp_path, monkeypatch, systems, lags, walls)
    doc = {
        "algo": "grpo",
        "rows": rows,
        "summary": summary,
        "ratios": ratio,
        "targets": va.targets(ratio, summary),
    }
    doc["reward_curve"] = {"final_over_last": 10, "iterations": 50, "final_score": {"conduit_k1": {"0": 0.4}}}
    page = "\n".join(
        report_staleness.staleness({"verl_staleness_grpo.json": doc, "verl_staleness_ppo.json": {}})
    )
    assert "| GRPO | conduit_k1 | Conduit | 1 | 1.00 / 1.00 | group_log" in page
    assert "| GRPO | verl_colocate_async | SimpleStorage | none |" in page
    assert "conduit_k1 ÷ verl_colocate_async | Conduit no staler | 1.000 / " in page
    assert "conduit_k2 ÷ verl_colocate_async | Conduit no staler | refused [1]" in page
    assert "- [1] refused: staleness differs" in page
    assert "storage backend" in page and "k1_wall<=0.9x" in page and "reward" in page
    empty = "\n".join(report_staleness.staleness({"verl_staleness_grpo.json": blank(doc)}))
    assert "| GRPO |" not in empty and "—" in empty  # no algo left: the file's name labels it


def test_help_works() -> None:
    with pytest.raises(SystemExit) as e:
        vs.parse(["--help"])
    assert e.value.code == 0


def test_reward_only_needs_reward_steps() -> None:
    with pytest.raises(SystemExit):
        vs.parse(["--reward-only"])
    args = vs.parse(["--reward-only", "--reward-steps", "50"])
    assert args.reward_only and args.reward_steps == 50 and args.seeds == 3
    assert not vs.parse([]).reward_only


def test_reward_only_writes_its_file_after_every_run(tmp_path: Path, monkeypatch) -> None:
    """``--reward-only`` on the paced rollout (calibration stubbed): per seed verl's run, then k = 1's;
    the file, in the timing file's ``reward_curve`` structure with provenance, rewritten after every
    run, so a run that fails leaves the others' comparison in it."""
    out = tmp_path / "verl_staleness_reward_grpo.json"
    seen: list[tuple[str, Any]] = []

    def run(work: Path, mode: str, steps: int, args: Any, extra: list[str]) -> tuple[int, str]:
        seen.append((work.name, json.loads(out.read_text())["reward_curve"] if out.exists() else None))
        assert ["--lr", "0.003"] == extra[extra.index("--lr") :][:2] and "--pace-scale" in extra
        if work.name == "reward_s1_conduit_k1_r0":
            return 1, "boom"
        scores = {s: {"critic/score/mean": 0.1 * s + 0.01 * args.seed} for s in range(1, steps + 1)}
        _metrics(work, scores)
        return 0, ""

    monkeypatch.setattr(verl_runs, "run", run)
    monkeypatch.setattr(vs, "calibrate", lambda root, args, tail: [])
    monkeypatch.setattr(vs, "calibration", lambda rows: {"time_scale_per_R": 0.5})
    monkeypatch.setattr(vs, "machine", lambda: {"cpus": 2})  # no torch / verl import
    argv = ["--reward-only", "--reward-steps", "4", "--work", str(tmp_path / "w"), "--out", str(out)]
    monkeypatch.setattr(sys, "argv", ["verl_staleness.py", *argv])  # the command the JSON records
    result, path = vs.bench(vs.parse(argv))
    assert path == out
    assert [name for name, _ in seen] == [
        f"reward_s{seed}_{system}_r0" for seed in range(3) for system in ("verl_colocate_async", "conduit_k1")
    ]
    assert seen[0][1] is None and list(seen[1][1]["curves"]) == ["verl_colocate_async seed 0"]
    assert list(seen[4][1]["final_score"]["conduit_k1"]) == ["0"]  # the failed run: nothing added
    doc = json.loads(out.read_text())
    committed = json.loads((BENCH / "results" / "verl_staleness_reward_grpo.json").read_text())[
        "reward_curve"
    ]
    rc = doc["reward_curve"]
    assert list(rc) == list(committed)  # the committed file's structure
    assert rc["iterations"] == 4 and rc["seeds"] == 3 and rc["lr"] == 0.003
    assert rc["final_score"] == {
        "conduit_k1": {"0": pytest.approx(0.3), "2": pytest.approx(0.32)},
        "verl_colocate_async": {"0": pytest.approx(0.3), "1": pytest.approx(0.31), "2": pytest.approx(0.32)},
    }
    assert rc["verl_colocate_async_spread"] == pytest.approx([0.3, 0.32]) and rc["k1_within_spread"] is True
    assert list(rc["curves"]["conduit_k1 seed 2"][0]) == [2, pytest.approx(0.22)]  # warm-up dropped
    assert doc["benchmark"] == "verl_staleness_reward_grpo" and doc["algo"] == "grpo"
    assert doc["errors"] == {"reward_s1_conduit_k1_r0": "boom"}
    assert doc["calibration"] == {"tail=4": {"time_scale_per_R": 0.5}}
    for key in ("git_commit", "git_dirty", "load_average_start", "load_average_end", "created_utc"):
        assert key in doc["machine"]
    assert doc["method"]["command"] == " ".join(["verl_staleness.py", *argv])
    assert doc["method"]["shape"].startswith("16 prompts")
    assert "rewritten after every run" in doc["method"]["reward"]
    assert out.with_suffix(".png").exists() and json.loads(json.dumps(result["reward_curve"])) == rc


def test_the_report_shows_the_reward_only_file(tmp_path: Path) -> None:
    doc = {
        "benchmark": "verl_staleness_reward_grpo",
        "algo": "grpo",
        "rollout": "paced",
        "machine": {
            "git_commit": "abcdef1234",
            "git_dirty": False,
            "load_average_start": [0.1, 0.1, 0.1],
            "load_average_end": [2.0, 1.0, 1.0],
            "created_utc": "2026-12-03T23:00:00+00:00",
        },
        "errors": {"reward_s2_conduit_k1_r0": "boom"},
        "reward_curve": {
            "lr": 0.003,
            "seeds": 3,
            "iterations": 50,
            "final_over_last": 10,
            "final_score": {
                "conduit_k1": {"0": 0.2, "1": 0.25},
                "verl_colocate_async": {"0": 0.19, "1": 0.23, "2": 0.26},
            },
            "verl_colocate_async_spread": [0.19, 0.26],
            "k1_within_spread": True,
            "curves": {},
        },
        "method": {
            "command": "verl_staleness.py --algo grpo --reward-only --reward-steps 50 --seeds 3",
            "shape": "16 prompts x n=8, responses up to 256 tokens",
        },
    }
    heading = "### Reward curves: conduit_k1 within verl_colocate_async's seed spread"
    (tmp_path / "verl_staleness_reward_grpo.json").write_text(json.dumps(doc))
    page = report.render(results=tmp_path)
    start = page.index(heading)
    part = page[start : page.index("### On vLLM", start)]
    assert "`verl_staleness_reward_grpo.json`" in part and "replace the 30-iteration" in part
    assert "- Run `verl_staleness_reward_grpo.json`: commit abcdef1, dirty=false, load 0.10 → 2.00" in part
    assert "command `verl_staleness.py --algo grpo --reward-only --reward-steps 50 --seeds 3`" in part
    assert (
        "| GRPO | conduit_k1 | 1 | 0.2500 |" in part and "| GRPO | verl_colocate_async | 2 | 0.2600 |" in part
    )
    assert "50 iterations per run, lr " in part
    assert "verl_colocate_async's spread over seeds: 0.1900 .. 0.2600; conduit_k1's mean final score" in part
    assert "within it: met." in part and "errors in reward_s2_conduit_k1_r0" in part
    assert "- Rollout paced; 16 prompts x n=8, responses up to 256 tokens." in part
    assert "—" in "\n".join(report_staleness.reward(blank(doc)))  # every value missing: no crash


def test_on_vllm_the_headline_is_separate_async_at_equal_bound() -> None:
    from verl_staleness_analysis import HEADLINE, bound_held, headline_pair, headlines

    assert headline_pair("paced") == HEADLINE
    assert headline_pair("vllm") == ("conduit_k1", "verl_separate_async_k1")

    def row(system: str, rnd: int, it: int, wall: float, by: str) -> dict:
        return {
            "system": system,
            "round": rnd,
            "iteration": it,
            "wall_s": wall,
            "exposed_s": wall / 3,
            "algo": "grpo",
            "rollout": "vllm",
            "bound_by": by,
        }

    def rows(by: str) -> list[dict]:
        return [
            row(s, rnd, it, wall + 0.01 * it, by)
            for rnd in range(3)
            for it in range(2, 10)
            for s, wall in (("conduit_k1", 5.0), ("verl_separate_async_k1", 6.0))
        ]

    assert bound_held(rows("generation"), "verl_separate_async_k1") == "generation"
    assert bound_held([], "verl_separate_async_k1") is None
    (trainer,) = headlines(rows("trainer"), {}, {})
    assert trainer["pair"] == ["conduit_k1", "verl_separate_async_k1"] and trainer["target"] == 0.9
    assert "trainer-bound" in trainer["claim"] and trainer["verdict"] == "met"
    (gen,) = headlines(rows("generation"), {}, {})
    assert gen["target"] == 1.0 and "generation-bound" in gen["claim"]
    (refused,) = headlines(rows("trainer"), {"refused/conduit_k1_over_verl_separate_async_k1": "staler"}, {})
    assert refused["verdict"] == "refused"
