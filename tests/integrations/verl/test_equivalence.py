"""``conduit`` (streaming) and ``sync`` give the same samples, advantages and losses (same seed).

Real 2-iteration runs of verl 0.9.1 in CPU mode (~70-100 s each on an idle 2-core machine): GRPO,
and PPO (GAE with a critic: also the same values, returns and critic losses). Generation is sampled
but seeded per request (``hf_server.request_seed``: rollout seed, weight version, prompt, k-th
request of that prompt), so all runs see the same responses.

TransferQueue's storage backend is a second dimension: verl's ``sync`` always runs on verl's own
SimpleStorage (the reference); the ``conduit`` mode runs on Conduit's backend (``tq_conduit``, its
default) and on SimpleStorage (``tq_simple``). The backend only stores data, so both must match the
reference. The reference run is made once per algorithm and shared by both backends' cases.

The paced rollout (``--rollout paced``: long-tail response lengths, responses released at a
modelled inference server's times, so groups complete far apart) must match too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")
pytest.importorskip("conduit_verl_cpu")  # the CPU harness: pip install --no-deps -e tools/verl_cpu

from conduit_verl_cpu.metrics import read_metrics  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(1200)]

#: ``--tq-backend`` -> the TransferQueue storage backend the run's summary must report
BACKENDS = {"conduit": "Conduit", "simple": "SimpleStorage"}
#: the conduit mode's storage backend, as a test-id-friendly parameter
#: SimpleStorage runs in the full slow suite (``long``); CI's slow stage runs Conduit's backend
ON_BACKEND = pytest.mark.parametrize(
    "backend", ["conduit", pytest.param("simple", marks=pytest.mark.long)], ids=["tq_conduit", "tq_simple"]
)

SyncRuns = Callable[[str, tuple[str, ...]], Path]


def _run(work: Path, mode: str, algo: str = "grpo", extra: tuple[str, ...] = (), backend: str = "") -> str:
    """One run; ``backend`` "": the harness's default (Conduit's in conduit mode, SimpleStorage otherwise)."""
    cmd = [sys.executable, "-m", "conduit_verl_cpu.run", "--steps", "2", "--trainer-mode", mode]
    cmd += ["--seed", "0", "--algo", algo, "--dump-samples", "--work-dir", str(work), *extra]
    cmd += ["--tq-backend", backend] if backend else []
    if mode == "conduit" and not any("piece_groups" in e for e in extra):
        cmd.append("+trainer.v1.conduit.piece_groups=1")  # one group per piece: the most pieces
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=840)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    want = BACKENDS[backend or ("conduit" if mode == "conduit" else "simple")]
    summary = json.loads((work / "summary.json").read_text())
    assert summary["tq_backend_ran"] == want, summary  # the backend that verl's TransferQueue used
    if want == "Conduit":
        assert summary["tq_store"]["bytes_put"] > 0, summary
    return tail


@pytest.fixture(scope="module")
def sync_runs(tmp_path_factory: pytest.TempPathFactory) -> SyncRuns:
    """verl's sync trainer on SimpleStorage: made once per (algo, extra overrides), then shared."""
    done: dict[tuple[str, tuple[str, ...]], Path] = {}

    def get(algo: str, extra: tuple[str, ...]) -> Path:
        if (algo, extra) not in done:
            work = tmp_path_factory.mktemp(f"sync_{algo}")
            _run(work, "sync", algo, extra, backend="simple")
            done[algo, extra] = work
        return done[algo, extra]

    return get


def _dump(work: Path) -> list[dict]:
    """Per step, the samples in a fixed order (verl balances the batch over the ranks, so the
    order depends on how it was cut into pieces)."""
    steps = [json.loads(line) for line in (work / "samples.jsonl").read_text().splitlines()]
    for step in steps:
        step["samples"].sort(key=lambda s: (s["prompt"], s["response"]))
    return steps


def _run_both(
    sync_runs: SyncRuns, tmp_path: Path, algo: str, extra: tuple[str, ...] = (), backend: str = "conduit"
) -> list[tuple[dict, dict, dict, dict]]:
    """sync (SimpleStorage) and conduit (on ``backend``), same seed; per step: (sync dump, conduit
    dump, sync metrics, conduit metrics).

    Also checks what both algorithms share: the same steps, the same prompts and responses, and that
    the conduit run streamed in pieces.
    """
    sync_work = sync_runs(algo, extra)
    _run(tmp_path / "conduit", "conduit", algo, extra, backend)
    sync, cond = _dump(sync_work), _dump(tmp_path / "conduit")
    rows_s = read_metrics(sync_work / "metrics.jsonl")
    rows_c = read_metrics(tmp_path / "conduit" / "metrics.jsonl")
    assert [d["step"] for d in sync] == [d["step"] for d in cond] == [1, 2]
    steps = list(zip(sync, cond, rows_s, rows_c, strict=True))
    for a, b, _, rc in steps:
        assert len(a["samples"]) == len(b["samples"]) == 16
        for x, y in zip(a["samples"], b["samples"], strict=True):
            assert (x["prompt"], x["response"]) == (y["prompt"], y["response"])  # same samples
        assert rc["conduit/pieces"] >= 2  # streamed in pieces
        assert rc["conduit/buffer/inserted"] == rc["conduit/buffer/sampled"] == 16  # each sample once
    return steps


#: GRPO's per-sample fields and their absolute tolerances; the actor's losses
GRPO_SAMPLES = {"adv": 1e-5, "old_log_prob": 1e-4}
ACTOR = ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm")


def _same_samples(a: dict, b: dict, tolerance: dict[str, float]) -> None:
    """Sample by sample, the fields ``tolerance`` names agree to within its absolute tolerance."""
    for x, y in zip(a["samples"], b["samples"], strict=True):
        for key, tol in tolerance.items():
            assert x[key] == pytest.approx(y[key], abs=tol), key


def _same_metrics(
    rc: dict, rs: dict, keys: tuple[str, ...], rel: float | None = 1e-4, tol: float = 1e-6
) -> None:
    """The conduit run's metrics ``keys`` equal the sync run's, to ``rel`` or the absolute ``tol`` (``rel``
    None: to ``tol`` only)."""
    for key in keys:
        assert rc[key] == pytest.approx(rs[key], rel=rel, abs=tol), key


@ON_BACKEND
def test_conduit_matches_sync(sync_runs: SyncRuns, tmp_path: Path, backend: str) -> None:
    for a, b, rs, rc in _run_both(sync_runs, tmp_path, "grpo", backend=backend):
        _same_samples(a, b, GRPO_SAMPLES)
        assert any(abs(v) > 1e-3 for s in a["samples"] for v in s["adv"]), "degenerate: all advantages 0"
        _same_metrics(rc, rs, ACTOR)
        _same_metrics(rc, rs, ("critic/advantages/mean",), rel=None, tol=1e-5)


@ON_BACKEND
def test_conduit_matches_sync_ppo(sync_runs: SyncRuns, tmp_path: Path, backend: str) -> None:
    """PPO: values and the GAE recursion per piece, whitening over the whole batch = verl's GAE."""
    for a, b, rs, rc in _run_both(sync_runs, tmp_path, "ppo", backend=backend):
        # advantages whitened: O(1) values
        _same_samples(a, b, {"values": 1e-5, "returns": 1e-5, "adv": 1e-4, "old_log_prob": 1e-4})
        assert any(abs(v) > 1e-3 for s in a["samples"] for v in s["values"]), "degenerate: all values 0"
        # whitened advantages: pg_loss is ~1e-8 at ratio 1, so an absolute tolerance
        _same_metrics(rc, rs, (*ACTOR, "critic/vf_loss", "critic/grad_norm"))
        means = ("critic/values/mean", "critic/returns/mean", "critic/advantages/mean")
        _same_metrics(rc, rs, means, rel=None, tol=1e-5)


@pytest.mark.long
def test_conduit_matches_sync_two_ranks(sync_runs: SyncRuns, tmp_path: Path) -> None:
    """Two data-parallel actor ranks (FSDP2 on gloo): pieces split evenly over the ranks (conduit
    mode on Conduit's backend, its default)."""
    two_ranks = (
        "trainer.n_gpus_per_node=2",
        "ray_kwargs.ray_init.num_gpus=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",  # 16 samples over 2 ranks
        # one rollout server over both "GPUs": with one per GPU, which server gets which request
        # (so which per-server request seed) depends on timing, and the samples would differ
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "+trainer.v1.conduit.piece_groups=auto",  # pieces of 2 groups: 8 samples, 4 per rank
    )
    for _, _, rs, rc in _run_both(sync_runs, tmp_path, "grpo", two_ranks):
        _same_metrics(rc, rs, ACTOR)


#: a short paced rollout: lengths 12 tokens median, p99 4x that, capped at 48; modelled times x 10, so
#: a step's generation spans ~1 s (median response) to ~4 s (the longest): long enough that finished
#: responses wait through several of the streaming wait's 0.1-s idle slices before their groups finish
#: (at x 0.2 the whole generation took ~0.1 s and whether early rows ran depended on timing)
PACED = (
    "--rollout",
    "paced",
    "--response-length",
    "48",
    "--pace-median",
    "12",
    "--pace-tail",
    "4",
    "--pace-scale",
    "10",
)


def _early_rows_ran(steps: list[tuple[dict, dict, dict, dict]]) -> None:
    """Each step after the first ingested responses before their groups finished (the paced rollout has
    hardware of its own, and the run is on-policy). The first step is the warm-up one: the tiny model's
    first generation on CPU is slower than the pace, so its groups are released together (measured: three
    of four groups within 30 ms of each other after ~6 s) and nothing is left to ingest early."""
    assert len(steps) >= 2, "the run needs steps after the warm-up one"
    for _, _, _, rc in steps[1:]:
        assert rc.get("conduit/early_rows", 0) >= 1, rc


def test_conduit_matches_sync_paced(sync_runs: SyncRuns, tmp_path: Path) -> None:
    """Paced rollout: same samples (long-tail lengths), advantages and losses as verl's sync."""
    steps = _run_both(sync_runs, tmp_path, "grpo", PACED)
    for a, b, rs, rc in steps:
        # responses come padded; EOS (id 1) is held back to the drawn length, so it ends each one
        lengths = {x["response"].index(1) + 1 if 1 in x["response"] else -1 for x in a["samples"]}
        assert len(lengths) > 3, lengths  # the drawn lengths, not a fixed one
        _same_samples(a, b, GRPO_SAMPLES)
        _same_metrics(rc, rs, ACTOR)
    _early_rows_ran(steps)
    for work in (sync_runs("grpo", PACED), tmp_path / "conduit"):
        assert json.loads((work / "summary.json").read_text())["rollout"] == "paced"
        events = [json.loads(x) for x in (work / "gen_events.jsonl").read_text().splitlines()]
        assert events and all(e["model_s"] > 0 for e in events)  # released by the pacer


@pytest.mark.long
def test_conduit_matches_sync_paced_ppo(sync_runs: SyncRuns, tmp_path: Path) -> None:
    """Paced rollout, PPO: values computed early per response, GAE per group piece, whitening over the
    batch: the same values, returns, advantages and losses as verl's sync."""
    steps = _run_both(sync_runs, tmp_path, "ppo", PACED)
    for a, b, rs, rc in steps:
        _same_samples(a, b, {"values": 1e-5, "returns": 1e-5, "adv": 1e-4, "old_log_prob": 1e-4})
        _same_metrics(rc, rs, (*ACTOR, "critic/vf_loss", "critic/grad_norm"))
    _early_rows_ran(steps)
