"""``--core-split`` (issue 28, seam S7): vLLM's processes on some cores, the trainer's on the others.

Fast: the flag's parsing and refusals, the vLLM server's environment (verl's ``rollout_env_vars``
hook), pinning every thread of a process, and the affinity watch on a child process. Slow (vLLM,
Ray): one ``--rollout vllm`` conduit-mode step whose summary reports each process's CPU affinity
sampled during the run: vLLM's server, EngineCore and Worker, verl's agent loops, reward workers and
load balancer on core 0, the driver, TaskRunner,
FSDP workers (WorkerDict), Conduit's storage actors and the rest of Ray on core 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("conduit_verl_cpu")  # the CPU harness: pip install --no-deps -e tools/verl_cpu

from conduit_verl_cpu import vllm_cpu  # noqa: E402
from conduit_verl_cpu.vllm_cpu import CoreSplit, parse_core_split  # noqa: E402
from verl_cpu_run import run_harness  # noqa: E402

from conduit.errors import ConfigError  # noqa: E402

TWO = {0, 1}


def test_default_puts_vllm_on_the_first_core_and_the_rest_on_the_others() -> None:
    assert parse_core_split(None, TWO) == CoreSplit(vllm=(0,), trainer=(1,))
    assert parse_core_split(None, {2, 5, 7}) == CoreSplit(vllm=(2,), trainer=(5, 7))
    assert parse_core_split("none", TWO) is None and parse_core_split(" None ", {0}) is None


def test_explicit_splits_parse() -> None:
    assert parse_core_split("0:1", TWO).as_dict() == {"vllm": [0], "trainer": [1]}  # type: ignore[union-attr]
    assert parse_core_split("1:0", TWO) == CoreSplit(vllm=(1,), trainer=(0,))
    assert parse_core_split("0-1,4:2,3", set(range(8))) == CoreSplit(vllm=(0, 1, 4), trainer=(2, 3))


@pytest.mark.parametrize(
    ("raw", "available", "names"),
    [
        ("0", TWO, "VLLM_CORES:TRAINER_CORES"),
        ("0:", TWO, "VLLM_CORES:TRAINER_CORES"),
        (":1", TWO, "VLLM_CORES:TRAINER_CORES"),
        ("a:1", TWO, "not a core list"),
        ("0:1.5", TWO, "not a core list"),
        ("3-1:0", set(range(4)), "bad core range"),
        ("-1:0", TWO, "not a core list"),
        ("0,1:1", TWO, "[1] are on both sides"),
        ("0:2", TWO, "[2] are not available"),
        ("0:1", {0}, "at least 2 cores"),
        (None, {0}, "at least 2 cores"),
    ],
)
def test_bad_splits_are_refused_by_name(raw: str | None, available: set[int], names: str) -> None:
    with pytest.raises(ConfigError, match=None) as e:
        parse_core_split(raw, available)
    assert names in str(e.value)


def test_flag_default_and_refusals_in_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    from conduit_verl_cpu import run

    monkeypatch.setattr(vllm_cpu, "cpu_build_version", lambda: "0.30.0")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    args, _ = run.parse_args(["--rollout", "vllm"])
    assert args.core_split == CoreSplit(vllm=(0,), trainer=(1,))
    assert run.parse_args(["--rollout", "vllm", "--core-split", "none"])[0].core_split is None
    assert run.parse_args(["--rollout", "hf"])[0].core_split is None
    with pytest.raises(ConfigError, match="--rollout vllm only"):
        run.parse_args(["--rollout", "paced", "--core-split", "0:1"])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})  # a one-core machine
    with pytest.raises(ConfigError, match="at least 2 cores"):
        run.parse_args(["--rollout", "vllm"])


def test_vllm_servers_environment_binds_vllm_to_its_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    from conduit_verl_cpu.platform import PlatformCPU

    monkeypatch.delenv(vllm_cpu.VLLM_CORES_ENV, raising=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert PlatformCPU().rollout_env_vars() == {"VLLM_CPU_KVCACHE_SPACE": "1"}  # no split: vLLM's auto
    monkeypatch.setenv(vllm_cpu.VLLM_CORES_ENV, "0")
    assert PlatformCPU().rollout_env_vars() == {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "0",  # vLLM's Worker: OMP_PLACES={0}, OMP_PROC_BIND=true
        vllm_cpu.AFFINITY_ENV: "0",  # the server actor (so EngineCore, Worker) pinned by the plugin
    }


_CHILD = """
import sys, threading
ev = threading.Event()
threads = [threading.Thread(target=ev.wait) for _ in range(3)]
[t.start() for t in threads]  # threads that run before the process is pinned
print("ready", flush=True)
sys.stdin.readline()  # the test pins this process (or not) meanwhile
late = threading.Thread(target=ev.wait); late.start()  # and one started after
print("started", flush=True)
sys.stdin.readline()
"""


def _thread_cores(pid: int) -> list[set[int]]:
    return [os.sched_getaffinity(int(t)) for t in os.listdir(f"/proc/{pid}/task")]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 usable cores")
@pytest.mark.parametrize("pin", [True, False])
def test_pin_process_moves_every_thread_and_the_watch_sees_it(pin: bool) -> None:
    """Every thread of the child (4 running when it is pinned, 1 started after) ends on the core; the
    watch (sampling this process's tree) reports it. Without the pin the watch reports every core."""
    core = min(os.sched_getaffinity(0))
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        if pin:
            vllm_cpu.pin_process((core,), pid=proc.pid)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "started"
        cores = _thread_cores(proc.pid)
        assert len(cores) >= 5
        watch = vllm_cpu.AffinityWatch(period_s=0.05)
        watch.start()
        time.sleep(0.2)
        watch.stop()
        assert watch.samples >= 2
        seen = watch.report()["trainer"]["python -c"]
        if pin:
            assert all(c == {core} for c in cores), cores
            assert seen == [core]
        else:
            assert seen == sorted(os.sched_getaffinity(0)) != [core]
    finally:
        proc.kill()
        proc.wait()


def test_watch_puts_vllm_processes_and_their_children_on_vllms_side() -> None:
    assert vllm_cpu.is_vllm_side("VLLM::Worker_TP0") and vllm_cpu.is_vllm_side("VLLM::EngineCore")
    assert vllm_cpu.is_vllm_side("ray::vLLMHttpServer")
    for actor in ("AgentLoopWorkerTQ", "_NotifyingWorker", "_JournalingWorker", "RewardLoopWorker"):
        assert vllm_cpu.is_vllm_side(f"ray::{actor}"), actor
    assert vllm_cpu.is_vllm_side("ray::GlobalRequestLoadBalancer")
    assert not vllm_cpu.is_vllm_side("ray::WorkerDict") and not vllm_cpu.is_vllm_side("raylet")
    assert not vllm_cpu.is_vllm_side("ray::CompletionChannel")  # Conduit's: the trainer's side


@pytest.mark.parametrize("split", [True, False])
def test_rollout_side_actors_pin_to_vllms_cores_as_they_start(
    split: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S7: an instance of a rollout-side actor class (verl's agent-loop worker, reward worker, load
    balancer: ``ROLLOUT_ACTORS``; their presence in verl is checked with the other seams) or of a
    subclass pins its process to vLLM's cores before the class's own ``__init__`` runs, wrapped once
    however often the hook fires; without a split (no ``CONDUIT_VLLM_CORES``) nothing moves.
    ``pin_process`` itself: the child-process test above; the real actors: the slow run below."""
    events: list[object] = []
    module = types.ModuleType("rollout_side")  # stands in for verl's module of an actor class

    class AgentLoopWorker:
        def __init__(self, config: object) -> None:
            events.append(("init", config))

    module.AgentLoopWorker = AgentLoopWorker  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rollout_side", module)
    monkeypatch.setattr(vllm_cpu, "pin_process", lambda cores, pid=None: events.append(("pin", cores)))
    monkeypatch.delenv(vllm_cpu.VLLM_CORES_ENV, raising=False)
    if split:
        monkeypatch.setenv(vllm_cpu.VLLM_CORES_ENV, "0,2")
    vllm_cpu._pin_on_start("rollout_side", "AgentLoopWorker")
    vllm_cpu._pin_on_start("rollout_side", "AgentLoopWorker")  # a second hook: still one wrap

    class Sub(AgentLoopWorker):  # the conduit mode's agent-loop workers are subclasses
        pass

    AgentLoopWorker("a")
    Sub("b")
    pins = [("pin", (0, 2))] if split else []
    assert events == [*pins, ("init", "a"), *pins, ("init", "b")]
    assert {name for _, name in vllm_cpu.ROLLOUT_ACTORS} == {
        "AgentLoopWorker",
        "RewardLoopWorker",
        "GlobalRequestLoadBalancer",
    }


@pytest.mark.vllm
@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(900)
def test_vllm_step_runs_on_split_cores(tmp_path: Path) -> None:
    """One conduit-mode GRPO step on vLLM with the default split: every process's affinity, as
    the harness sampled it during the run (``summary.json``'s ``affinity``), is its side's core."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 usable cores")
    vllm_core, *rest = sorted(os.sched_getaffinity(0))
    work = tmp_path / "run"
    run_harness(work, "--rollout", "vllm", "--steps", "1", "--trainer-mode", "conduit")
    summary = json.loads((work / "summary.json").read_text())
    assert summary["rollout"] == "vllm"
    assert summary["cores"] == {"vllm": [vllm_core], "trainer": rest}
    seen = summary["affinity"]
    vllm_names = set(seen["vllm"])
    assert "ray::vLLMHttpServer" in vllm_names, seen
    assert any(n.startswith("VLLM::Worker") for n in vllm_names), seen
    assert any(n.startswith("VLLM::EngineCore") for n in vllm_names), seen
    assert all(cores == [vllm_core] for cores in seen["vllm"].values()), seen
    trainer = seen["trainer"]
    assert "ray::_NotifyingWorker" in vllm_names, seen  # the conduit mode's agent loops: the rollout's side
    for name in ("ray::TaskRunnerV1", "ray::WorkerDict", "ray::StorageActor", "raylet"):
        assert name in trainer, (name, seen)
    assert all(cores == rest for cores in trainer.values()), seen
