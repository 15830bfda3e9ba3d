"""``piece_groups=auto`` between runs (the core's ``LoopTuner``): its decision kept per workload in the core's tuner cache, recalled by
a later run instead of probing, re-opened when the workload drifts."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest

from conduit.piece_policy import REPROBE_EVERY, PieceChoice, PiecePolicy, piece_tuner  # noqa: E402
from conduit.tuner import ChoiceCache, Signature  # noqa: E402
from conduit.tuner_loop import LoopTuner, size_bucket  # noqa: E402

GROUPS, N = 8, 8


def _tuning(cache_dir: Path) -> LoopTuner[PieceChoice]:
    return piece_tuner(cache_dir, "verl/grpo", GROUPS * N, "machine-a")


def _run(policy: PiecePolicy, steps: int, tokens: list[float], seconds: dict[str, float]) -> list[str]:
    """Steps of 8 groups finishing 0.5 s apart; pieces cost ``0.2 + 0.05 * groups`` s, three times
    that beside generation (contention: the cost model cannot tell, so only probes decide); each
    step takes ``seconds[arm]``; ``tokens[i]``: mean tokens per sample of step ``i`` (the last
    repeats). The arm of each step."""
    finish = [0.5 * i for i in range(1, GROUPS + 1)]
    arms, now = [], 0.0
    for i in range(steps):
        per_sample = tokens[min(i, len(tokens) - 1)]
        g = policy.begin_step(now)
        arms.append(policy.arm)
        sizes = [g] * (GROUPS // g) + ([GROUPS % g] if GROUPS % g else [])
        for j, k in enumerate(sizes):
            last = j == len(sizes) - 1
            cost = (0.2 + 0.05 * k) * (1.0 if last else 3.0)
            policy.record_piece(k, cost, overlapped=not last, work=[per_sample * N] * k)
        policy.record_step(finish)
        now += seconds[policy.arm]
    return arms


WHOLE_FASTER = {"stream": 1.2, "whole": 1.0}


def test_size_bucket_groups_nearby_lengths_and_separates_far_ones() -> None:
    assert size_bucket(64.0) == size_bucket(70.0) == 64.0
    assert size_bucket(100.0) != size_bucket(64.0)
    assert size_bucket(0.0) == 0.0


def test_a_settled_decision_is_cached_and_a_second_run_starts_from_it(tmp_path: Path) -> None:
    first = PiecePolicy("auto", GROUPS, 1, _tuning(tmp_path))
    arms = _run(first, 12, [64.0], WHOLE_FASTER)
    assert "stream" in arms[1:7] and "whole" in arms[1:7]  # the probes of both arms
    assert first.probe_steps >= 5 and not first.recalled
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    record = json.loads(files[0].read_text())
    assert record["config"] == {"arm": "whole", "piece_groups": GROUPS}
    assert record["signature"]["item_size"] == 64.0 and record["signature"]["batch_size"] == GROUPS * N
    assert record["measured_s"]["whole"] < record["measured_s"]["stream"]

    second = PiecePolicy("auto", GROUPS, 1, _tuning(tmp_path))
    arms = _run(second, 12, [66.0], WHOLE_FASTER)  # same workload, a little noise in the lengths
    assert second.recalled
    # from the first step after warm-up: the cached arm, the other re-measured only every 10th step
    assert arms[1:] == ["stream" if s % REPROBE_EVERY == 0 else "whole" for s in range(2, 13)]
    assert second.probe_steps == 1 < first.probe_steps
    assert second.report()["recalled"] == 1.0


def test_the_cached_streaming_decision_restores_its_g(tmp_path: Path) -> None:
    tuning = _tuning(tmp_path)
    tuning.recall(64.0)
    tuning.keep(PieceChoice("stream", 3), "measured", {"stream": 1.0, "whole": 1.2})
    policy = PiecePolicy("auto", GROUPS, 1, _tuning(tmp_path))
    assert policy.begin_step(0.0) == 2  # warm-up: the default (a quarter of the groups)
    policy.record_piece(GROUPS, 0.5, work=[64.0 * N] * GROUPS)
    policy.record_step([0.5 * i for i in range(1, GROUPS + 1)])
    assert policy.recalled and policy.arm == "stream" and policy.chosen == 3
    assert policy.begin_step(10.0) == 3


def test_another_workload_or_machine_does_not_see_the_cached_decision(tmp_path: Path) -> None:
    _run(PiecePolicy("auto", GROUPS, 1, _tuning(tmp_path)), 12, [64.0], WHOLE_FASTER)
    longer = PiecePolicy("auto", GROUPS, 1, _tuning(tmp_path))
    _run(longer, 8, [256.0], WHOLE_FASTER)
    assert not longer.recalled and longer.probe_steps >= 5
    other = piece_tuner(tmp_path, "verl/grpo", GROUPS * N, "machine-b")
    assert other.recall(64.0) is None


def test_drift_drops_the_measurements_and_probes_the_new_workload(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _run(PiecePolicy("auto", GROUPS, 1, _tuning(tmp_path)), 12, [64.0], WHOLE_FASTER)
    policy = PiecePolicy("auto", GROUPS, 1, _tuning(tmp_path))
    with caplog.at_level(logging.INFO):
        # responses four times longer from step 6: three steps outside the tolerance, then re-opened
        arms = _run(policy, 14, [64.0] * 5 + [256.0], WHOLE_FASTER)
    assert any("drifted" in r.getMessage() for r in caplog.records)
    assert arms[1:5] == ["whole"] * 4  # recalled, before the drift
    assert not policy.recalled  # the new workload has no cached decision
    assert "stream" in arms[9:] and "whole" in arms[9:]  # measuring both again
    assert policy.probe_steps >= 3
    assert len(list(tmp_path.glob("*.json"))) == 2  # the new workload's decision kept beside the old


def test_a_corrupt_cache_file_is_ignored_and_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tuning = _tuning(tmp_path)
    path = tuning.cache.path(Signature("verl/grpo", GROUPS * N, 64.0, "machine-a"))
    path.write_text('{"config": {"arm": "whole"')  # a write cut short
    policy = PiecePolicy("auto", GROUPS, 1, tuning)
    with caplog.at_level(logging.WARNING):
        _run(policy, 12, [64.0], WHOLE_FASTER)
    assert any("unreadable tuner cache" in r.getMessage() for r in caplog.records)
    assert not policy.recalled and policy.probe_steps >= 5
    assert json.loads(path.read_text())["config"]["arm"] == "whole"


def test_an_unwritable_cache_is_logged_and_the_run_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    policy = PiecePolicy("auto", GROUPS, 1, _tuning(blocked))
    with caplog.at_level(logging.WARNING):
        arms = _run(policy, 12, [64.0], WHOLE_FASTER)
    assert any("could not write the tuner cache" in r.getMessage() for r in caplog.records)
    assert arms[-1] == "whole"


def test_concurrent_writers_leave_one_whole_record(tmp_path: Path) -> None:
    cache = ChoiceCache(PieceChoice, tmp_path)
    sig = Signature("verl/grpo", GROUPS * N, 64.0, "machine-a")
    choices = [PieceChoice("stream", g) for g in range(1, 9)]

    def write(choice: PieceChoice) -> None:
        for _ in range(50):
            cache.save(sig, choice, "race", {})

    threads = [threading.Thread(target=write, args=(c,)) for c in choices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    hit = cache.load(sig)
    assert hit is not None and hit[0] in choices
    assert not list(tmp_path.glob("*.tmp"))


def test_a_fixed_piece_groups_neither_reads_nor_writes_the_cache(tmp_path: Path) -> None:
    policy = PiecePolicy(2, GROUPS, 1, _tuning(tmp_path))
    _run(policy, 8, [64.0], WHOLE_FASTER)
    assert not list(tmp_path.iterdir()) and policy.probe_steps == 0


def test_a_drift_keeps_streaming_where_the_model_says_it_pays(tmp_path: Path) -> None:
    """Responses that grow as the policy learns (the vLLM run: 107 -> 178 tokens per sample over six
    steps) re-open the cached decision, but the model's streamed steps are the new workload's own:
    where they say streaming pays (a rollout on its own hardware, cheap pieces, groups spread out),
    no whole-batch step is run to re-measure it."""
    policy = PiecePolicy("auto", GROUPS, 1, _tuning(tmp_path), separate_rollout=True)
    finish = [0.5 * i for i in range(1, GROUPS + 1)]
    arms, now = [], 0.0
    for i in range(14):
        per_sample = 64.0 * 1.25**i  # drifts out of the tolerance every few steps
        g = policy.begin_step(now)
        arms.append(policy.arm)
        sizes = [g] * (GROUPS // g) + ([GROUPS % g] if GROUPS % g else [])
        for j, k in enumerate(sizes):
            work = [per_sample * N] * k
            policy.record_piece(k, 0.05 + 0.0002 * sum(work), overlapped=j < len(sizes) - 1, work=work)
        policy.record_step(finish, ended=finish[-1] + 0.05 + 0.0002 * per_sample * N * sizes[-1])
        now += 10.0
    assert policy.tuner.signature is not None and len(policy.streamed) == 3
    assert arms == ["stream"] * 14 and policy.probe_steps <= 1  # the first streamed step only
