"""A hung rollout request (or a dead rollout server) in the real verl CPU harness ends the step by
policy or with a clear error, never hangs it.

``CONDUIT_CPU_HANG_REQUEST=3`` makes the CPU rollout server's third generate call of the run never
return (one prompt group can never finish). With ``rollout_timeout_s=20`` the ``conduit`` trainer
mode then either fails step 1 with ``RolloutTimeoutError`` naming that group (``on_timeout=error``)
or trains step 1 on the other groups and counts the dropped one (``on_timeout=drop``).
``CONDUIT_CPU_KILL_REQUEST=3`` instead SIGKILLs the rollout server's process there. Each run is a
real verl 0.9.1 V1 trainer: about 100-200 s on an idle 2-core machine, so they are marked slow.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")
pytest.importorskip("conduit_verl_cpu")  # the CPU harness: pip install --no-deps -e tools/verl_cpu

from conduit_verl_cpu.hf_server import (  # noqa: E402
    HANG_REQUEST_ENV,
    KILL_AGENT_LOOP_ENV,
    KILL_REQUEST_ENV,
    request_number,
)
from conduit_verl_cpu.metrics import read_metrics  # noqa: E402

TIMEOUT_S = 20
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def run_with_a_failing_request(
    work: Path, *overrides: str, steps: int = 1, switch: str = HANG_REQUEST_ENV
) -> tuple[int, str, float]:
    """(exit code, output, seconds) of a ``conduit``-mode CPU run whose 3rd request never returns
    (``switch=KILL_REQUEST_ENV``: kills the rollout server's process)."""
    cmd = [sys.executable, "-m", "conduit_verl_cpu.run", "--steps", str(steps), "--trainer-mode", "conduit"]
    cmd += ["--work-dir", str(work), f"+trainer.v1.conduit.rollout_timeout_s={TIMEOUT_S}", *overrides]
    env = {**os.environ, switch: "3"}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=840, env=env)
    out = proc.stdout + proc.stderr
    what = {HANG_REQUEST_ENV: "hangs", KILL_REQUEST_ENV: "kills the server"}.get(
        switch, "kills the agent loop"
    )
    assert re.search(rf"hf server: request 3 .*{what}", out), out[-4000:]  # the switch reached the server
    return proc.returncode, out, time.monotonic() - t0


@pytest.mark.parametrize("env", [HANG_REQUEST_ENV, KILL_REQUEST_ENV, KILL_AGENT_LOOP_ENV])
def test_the_test_switches_are_validated(monkeypatch: pytest.MonkeyPatch, env: str) -> None:
    monkeypatch.delenv(env, raising=False)
    assert request_number(env) is None
    monkeypatch.setenv(env, "3")
    assert request_number(env) == 3
    for bad in ("0", "-1", "x"):
        monkeypatch.setenv(env, bad)
        with pytest.raises(ValueError, match=env):
            request_number(env)


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_hung_request_fails_step_one_with_a_timeout_naming_the_group(tmp_path: Path) -> None:
    rc, out, wall = run_with_a_failing_request(tmp_path / "run")
    tail = out[-4000:]
    assert rc != 0, tail
    match = re.search(
        rf"RolloutTimeoutError: no prompt group finished for {TIMEOUT_S}s .*?unfinished groups: (.*?)\.", out
    )
    assert match, tail
    assert re.fullmatch(UUID, match.group(1)), f"expected exactly the one hung group, got {match.group(1)!r}"
    assert read_metrics(tmp_path / "run" / "metrics.jsonl") == [], "step 1 must not complete"
    assert wall < 600, f"the run took {wall:.0f}s: the timeout did not end it"


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.ray
@pytest.mark.timeout(900)
def test_on_timeout_drop_trains_step_one_on_the_other_groups(tmp_path: Path) -> None:
    # one prompt group (4 responses) per actor mini-batch: the 3 finished groups divide evenly
    mini = [
        "actor_rollout_ref.actor.ppo_mini_batch_size=1",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    ]
    rc, out, _ = run_with_a_failing_request(
        tmp_path / "run", "+trainer.v1.conduit.on_timeout=drop", *mini, steps=2
    )
    assert rc == 0, out[-4000:]
    assert "conduit: dropping 1 unfinished prompt group(s)" in out  # logged
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["conduit/dropped_groups"] == 1  # the hung group, counted
    assert rows[1]["conduit/dropped_groups"] == 0  # the next step is whole again
    assert rows[0]["conduit/update_calls"] >= 1 and rows[0]["actor/grad_norm"] > 0


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.ray
@pytest.mark.timeout(900)
def test_on_timeout_drop_with_the_default_mini_batch(tmp_path: Path) -> None:
    """The actor mini-batch is the whole batch by default: a step cut short cannot be trained (verl
    refuses a remainder), so drop ends the run with a clear error naming the mini-batch."""
    rc, out, _ = run_with_a_failing_request(tmp_path / "run", "+trainer.v1.conduit.on_timeout=drop")
    assert rc != 0, out[-4000:]
    assert "RolloutTimeoutError" in out and "ppo_mini_batch_size" in out, out[-4000:]
    assert "AssertionError" not in out, out[-4000:]  # not verl's assert on the remainder
    assert read_metrics(tmp_path / "run" / "metrics.jsonl") == []


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_dead_rollout_server_ends_the_run_with_a_clear_error(tmp_path: Path) -> None:
    """SIGKILL of the rollout server's process at request 3: every request in flight fails, the groups
    turn failed, and verl's sampler refuses them (its refill is off by default): a clear error, fast."""
    rc, out, wall = run_with_a_failing_request(tmp_path / "run", switch=KILL_REQUEST_ENV)
    assert rc != 0, out[-4000:]
    assert "ActorDiedError" in out and "HFGenerationServer" in out  # the cause is named
    assert re.search(r"no materializable trajectories|RolloutTimeoutError", out), out[-4000:]
    assert read_metrics(tmp_path / "run" / "metrics.jsonl") == []
    assert wall < 600


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_killed_agent_loop_worker_ends_the_step_within_its_timeout(tmp_path: Path) -> None:
    """SIGKILL of verl's agent-loop worker process mid-step (request 3): its groups can never finish.
    The step ends by the trainer's policy (``on_timeout=error``) within the timeout, with an error
    naming the cause; nothing is trained (no metrics row), so nothing can be trained twice."""
    rc, out, wall = run_with_a_failing_request(tmp_path / "run", switch=KILL_AGENT_LOOP_ENV)
    assert re.search(r"kills the agent loop worker\(s\) \[\d+", out), out[-4000:]  # a real pid was killed
    assert rc != 0, out[-4000:]
    cause = re.search(r"(RolloutTimeoutError|ActorDiedError)[^\n]{0,300}", out)
    assert cause, out[-4000:]
    print("the run ended with:", cause.group(0))
    assert read_metrics(tmp_path / "run" / "metrics.jsonl") == [], "step 1 must not be trained"
    assert wall < 600, f"the run took {wall:.0f}s: the timeout did not end it"
