"""Real verl (CPU mode): SIGKILL a ``conduit``-mode trainer mid-step, resume, keep the journaled groups;
and the same running ahead (``max_staleness=1``): the prompts drawn ahead of the checkpoint neither
lost nor trained twice (the second test's docstring).

The trainer runs two steps with a checkpoint after each and a paced rollout (responses released
at modelled times, so step 2 lasts seconds). Once some of step 2's groups are in the journal, the
whole job (launcher, Ray, workers) gets SIGKILL. The same command then resumes from the step-1
checkpoint. Checked: the resumed step took every journaled group back and generated only the
others (the rollout server's request log), each of the step's prompts was trained exactly once
(the per-step sample dump), and the trained responses of the kept groups are the journaled ones
(checksum of the response ids).
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("conduit_verl_cpu")

from conduit_verl import ahead  # noqa: E402
from conduit_verl.journal import journal_root, journaled_steps, read_step  # noqa: E402
from conduit_verl_cpu.crash import kill_session, responses_checksum  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[3]
BATCH, N, STEP = 8, 2, 2
sys.path.insert(0, str(ROOT / "benchmarks"))
import verl_crash_analysis as vca  # noqa: E402
import verl_crash_resume as vcr  # noqa: E402  (the benchmark's harness command, env and JSON-lines reader)

# the benchmark's command at this shape (the journal "on" is what "auto" gives with a checkpoint per step)
SHAPE = SimpleNamespace(pace_scale=6, batch_size=BATCH, n=N, seed=0)


def _resume(command: list[str]) -> None:
    """Run ``command`` again (the resume) to the end; fail with its output's tail if it fails."""
    second = subprocess.run(
        command, cwd=ROOT, env=vcr.env(), capture_output=True, text=True, timeout=900, start_new_session=True
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]


def test_sigkill_mid_step_then_resume_keeps_the_journaled_groups(tmp_path):
    work = tmp_path / "run"
    root = journal_root(work / "ckpt")
    log = open(tmp_path / "first.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        vcr.command(work, STEP, SHAPE, "on"),
        cwd=ROOT,
        env=vcr.env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 900
        journaled = 0
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            if any(m.get("step") == STEP - 1 for m in vca.lines(work / "metrics.jsonl")):
                journaled = len(read_step(root, STEP)[0])
                if 2 <= journaled < BATCH:
                    break
                assert journaled < BATCH, "step 2 finished generating before the kill: slow the pace"
            time.sleep(0.05)
        else:
            pytest.fail("step 2 never journaled 2 groups")
    finally:
        kill_session(proc)
        log.close()
    assert not any(m.get("step") == STEP for m in vca.lines(work / "metrics.jsonl")), (
        "step 2 was trained before the kill"
    )
    kept, problems = read_step(root, STEP)
    assert len(kept) >= journaled
    events_before = len(vca.lines(work / "gen_events.jsonl"))

    _resume(vcr.command(work, STEP, SHAPE, "on"))

    (metrics,) = [m["data"] for m in vca.lines(work / "metrics.jsonl") if m.get("step") == STEP]
    assert metrics["conduit/journal_restored_groups"] == len(kept)
    assert metrics["conduit/journal_generated_groups"] == BATCH - len(kept)
    # the journaled groups were not generated again: only the other groups' requests reached the server
    # (the resumed run trains step 2 only, so every request it sent is one of step 2's)
    regenerated = vca.lines(work / "gen_events.jsonl")[events_before:]
    assert len(regenerated) == (BATCH - len(kept)) * N

    # every prompt of the step trained exactly once: n samples per prompt, BATCH prompts in all
    (dump,) = [d["samples"] for d in vca.lines(work / "samples.jsonl") if d["step"] == STEP]
    assert len(dump) == BATCH * N
    per_prompt = collections.Counter(tuple(s["prompt"]) for s in dump)
    assert all(c % N == 0 for c in per_prompt.values()), per_prompt
    trained: dict[tuple, list[list[int]]] = collections.defaultdict(list)
    for s in dump:
        trained[tuple(s["prompt"])].append(s["response"])
    # the kept groups' trained responses are the journaled ones (checksum of the response ids)
    for group in kept:
        prompt = tuple(group.samples[0]["prompts"].tolist())
        journaled_responses = [s["responses"].tolist() for s in group.samples]
        assert len(journaled_responses) == N
        got = trained[prompt]
        if per_prompt[prompt] == N:
            assert responses_checksum(got) == responses_checksum(journaled_responses)
        else:  # the same prompt text drawn twice in the step: the journaled group is among them
            assert all(r in got for r in journaled_responses)
    # the step's journal was pruned once step 2 was checkpointed
    assert read_step(root, STEP) == ([], [])


STEPS = 3  # the run-ahead case: step 1 checkpointed, killed in step 2, resumed through step 3


def _command(work: Path) -> list[str]:
    return [
        *vcr.command(work, STEPS, SHAPE, "on"),
        "+trainer.v1.conduit.max_staleness=1",
        f"+trainer.v1.conduit.group_log={work / 'groups.jsonl'}",
    ]


def _journaled_since(work: Path, rows: ahead.AheadRows | None) -> bool:
    """Whether a prompt in flight at the checkpoint (``rows``) has a journaled group by now."""
    if rows is None:
        return False
    in_flight = set(rows.prompts(ahead.IN_FLIGHT))
    root = journal_root(work / "ckpt")
    return any(g.uid in in_flight for step in journaled_steps(root) for g in read_step(root, step)[0])


@pytest.mark.long
def test_sigkill_while_running_ahead_then_resume_trains_every_prompt_once(tmp_path):
    """Running ahead (``max_staleness=1``), 3 steps, a checkpoint after each: SIGKILL in step 2 once a
    prompt in flight at the step-1 checkpoint has finished and been journaled; resume from that
    checkpoint, whose ``conduit_ahead.cdr`` holds the prompts drawn for the next step (the journaled
    group goes back finished, the other in-flight ones are re-issued). Checked on the final lineage
    (the last dump of each step): every step trained its whole batch, no prompt was trained in two
    steps or twice in one, every group finished before the checkpoint was trained with the responses
    it had then, no trained group was older than the bound, and verl's TransferQueue pickle
    checkpoint was never written."""
    work = tmp_path / "run"
    log = open(tmp_path / "first.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        _command(work), cwd=ROOT, env=vcr.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    folder = work / "ckpt" / "global_step_1"
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            if any(m.get("step") == 1 for m in vca.lines(work / "metrics.jsonl")):
                # step 1 is checkpointed; kill once a prompt in flight at the checkpoint has finished since
                if _journaled_since(work, ahead.read(folder)):
                    break
                assert not any(m.get("step") == 2 for m in vca.lines(work / "metrics.jsonl")), "slow the pace"
            time.sleep(0.05)
        else:
            pytest.fail("no prompt in flight at the step-1 checkpoint finished during step 2")
    finally:
        kill_session(proc)
        log.close()
    assert not any(m.get("step") == 2 for m in vca.lines(work / "metrics.jsonl")), (
        "step 2 ended before the kill"
    )
    rows = ahead.read(folder)
    assert rows is not None and rows.step == 1 and rows.prompts(), "the checkpoint kept no prompt drawn ahead"
    assert not (folder / "transfer_queue").exists()  # verl's pickle checkpoint of TransferQueue: never
    finished_before = collections.defaultdict(list)
    for sample in rows.samples:
        if sample is not None and "responses" in sample:
            finished_before[tuple(sample["prompts"].tolist())].append(sample["responses"].tolist())

    _resume(_command(work))

    resumed = [m["data"] for m in vca.lines(work / "metrics.jsonl") if m.get("step") == 2]
    assert resumed and resumed[-1]["conduit/ahead_restored_groups"] == len(rows.prompts())
    # in flight at the checkpoint, journaled after it: put back finished, not generated again
    assert resumed[-1]["conduit/ahead_journal_groups"] >= 1
    # the final lineage: step 1 from the first run, steps 2 and 3 from the resumed one
    dumps = {d["step"]: d["samples"] for d in vca.lines(work / "samples.jsonl")}
    assert sorted(dumps) == [1, 2, 3]
    steps_of: dict[tuple, set[int]] = collections.defaultdict(set)
    trained: dict[tuple, list[list[int]]] = collections.defaultdict(list)
    for step, samples in dumps.items():
        assert len(samples) == BATCH * N, (step, len(samples))
        for s in samples:
            steps_of[tuple(s["prompt"])].add(step)
            trained[tuple(s["prompt"])].append(s["response"])
    assert all(len(v) == 1 for v in steps_of.values()), "a prompt was trained in two steps"
    assert all(len(r) == N for r in trained.values()), "a prompt was trained twice in a step"
    assert len(trained) == STEPS * BATCH
    # the groups finished before the checkpoint were trained as they were (their responses kept)
    for prompt, responses in finished_before.items():
        assert len(responses) == N
        assert responses_checksum(trained[prompt]) == responses_checksum(responses)
    # the bound held for every group the resumed run trained
    lines = [json.loads(x) for x in (work / "groups.jsonl").read_text().splitlines()]
    assert lines and max(x["staleness"] for x in lines) <= 1
