"""Real verl (CPU mode): SIGKILL a ``conduit``-mode trainer mid-step, resume, keep the journaled groups.

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
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("conduit_verl_cpu")

from conduit_verl.journal import journal_root, read_step  # noqa: E402
from conduit_verl_cpu.crash import kill_session, responses_checksum  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[3]
BATCH, N, STEP = 8, 2, 2
sys.path.insert(0, str(ROOT / "benchmarks"))
import verl_crash_resume as vcr  # noqa: E402  (the benchmark's harness command, env and JSON-lines reader)

# the benchmark's command at this shape (the journal "on" is what "auto" gives with a checkpoint per step)
SHAPE = SimpleNamespace(pace_scale=6, batch_size=BATCH, n=N, seed=0)


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
            if any(m.get("step") == STEP - 1 for m in vcr.lines(work / "metrics.jsonl")):
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
    assert not any(m.get("step") == STEP for m in vcr.lines(work / "metrics.jsonl")), (
        "step 2 was trained before the kill"
    )
    kept, problems = read_step(root, STEP)
    assert len(kept) >= journaled
    events_before = len(vcr.lines(work / "gen_events.jsonl"))

    second = subprocess.run(
        vcr.command(work, STEP, SHAPE, "on"),
        cwd=ROOT,
        env=vcr.env(),
        capture_output=True,
        text=True,
        timeout=900,
        start_new_session=True,
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]

    (metrics,) = [m["data"] for m in vcr.lines(work / "metrics.jsonl") if m.get("step") == STEP]
    assert metrics["conduit/journal_restored_groups"] == len(kept)
    assert metrics["conduit/journal_generated_groups"] == BATCH - len(kept)
    # the journaled groups were not generated again: only the other groups' requests reached the server
    # (the resumed run trains step 2 only, so every request it sent is one of step 2's)
    regenerated = vcr.lines(work / "gen_events.jsonl")[events_before:]
    assert len(regenerated) == (BATCH - len(kept)) * N

    # every prompt of the step trained exactly once: n samples per prompt, BATCH prompts in all
    (dump,) = [d["samples"] for d in vcr.lines(work / "samples.jsonl") if d["step"] == STEP]
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
