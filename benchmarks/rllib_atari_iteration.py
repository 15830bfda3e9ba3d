"""Atari DQN iteration time on ALE Qbert, native RLlib vs Conduit at equal work (issue 31).

    python benchmarks/rllib_atari_iteration.py [--quick | --demo] [--steps-per-iter 1000] [--iters 12]
        [--capacity 100000] [--env ale_py:ALE/Qbert-v5] [--overlap sync|async] [--seed 1] [--out FILE]

Needs the ``atari`` extra. RLlib 2.60's Atari DQN (:func:`make_config`); native stacks frames in the env
(float32 ``[64, 64, 4]`` per step in its buffer: its ``FrameStackingLearner`` cannot run beside the
prioritized episode buffer), Conduit runs RLlib's frame-stacking connectors and stores each frame once as
uint8. Both alternate iteration by iteration in one process through ``rllib_iteration.run_workload``
(same timing wrappers, work counters per row; a ratio is refused when the work differs). Targets:
exposed ≤ 0.1×, wall ≤ 0.8×. Rows also record the replay's bytes and the shared process's RSS. Method:
``benchmarks/notes/rllib_atari_iteration.md``. ``--quick`` is a smoke run writing to /tmp; ``--demo`` is
``./dev demo atari``, writing ``atari_demo.json`` and ``.png`` into ``demo_results/``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
import report_rllib  # noqa: E402
import rllib_iteration  # noqa: E402
import script  # noqa: E402
from atari_stream import memory as resident  # noqa: E402
from rllib_native_timing import PathTimer  # noqa: E402

NAME = "rllib_atari_iteration"
TARGETS = {"ratio_exposed": 0.1, "ratio_wall": 0.8}  # Conduit ÷ native, at most
ENV, DIM, NUM_FRAMES, N_STEP, BATCH, FRAGMENT = "ale_py:ALE/Qbert-v5", 64, 4, 3, 32, 4
MODES = {  # steps per iteration, measured iterations, default output
    "full": (1000, 12, script.RESULTS / f"{NAME}.json"),
    "quick": (200, 2, Path(f"/tmp/{NAME}_quick.json")),
    "demo": (500, 6, Path("demo_results/atari_demo.json")),
}


def make_config(
    stack_in_env: bool,
    steps_per_iter: int,
    capacity: int = 100_000,
    seed: int = 1,
    env: str = ENV,
    hiddens: list[int] | None = None,
) -> Any:
    """RLlib's Atari DQN on ``env``: frames stacked in the env (``stack_in_env``, native's only way beside
    the prioritized buffer) or by RLlib's frame-stacking connectors (what the plugin stores frames once
    from). Learning starts after ``steps_per_iter`` env steps; ``hiddens``: the Q head (default [256])."""
    import ale_py
    import gymnasium as gym
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.connectors.env_to_module.frame_stacking import FrameStackingEnvToModule
    from ray.rllib.connectors.learner.frame_stacking import FrameStackingLearner
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack
    from ray.tune.registry import register_env

    gym.register_envs(ale_py)
    stack = NUM_FRAMES if stack_in_env else None
    name = f"conduit-atari-{'envstack' if stack_in_env else 'frames'}"
    register_env(name, lambda c: wrap_atari_for_new_api_stack(gym.make(env, **c), dim=DIM, framestack=stack))
    runners: dict[str, Any] = {"num_env_runners": 0, "rollout_fragment_length": FRAGMENT}
    learners: dict[str, Any] = {}
    if not stack_in_env:  # the env-to-module stacks see as far back as the learner's
        runners["episode_lookback_horizon"] = NUM_FRAMES - 1
        runners["env_to_module_connector"] = lambda e, s, d: FrameStackingEnvToModule(num_frames=NUM_FRAMES)
        learners["learner_connector"] = lambda o, a: FrameStackingLearner(num_frames=NUM_FRAMES)
    return (
        DQNConfig()
        .environment(
            name,
            env_config={"frameskip": 1, "full_action_space": False, "repeat_action_probability": 0.0},
            clip_rewards=True,
        )
        .env_runners(**runners)
        .learners(**learners)
        .training(
            n_step=N_STEP,
            train_batch_size=BATCH,
            num_steps_sampled_before_learning_starts=steps_per_iter,
            replay_buffer_config={
                "type": "PrioritizedEpisodeReplayBuffer",
                "capacity": capacity,
                "alpha": 0.5,
                "beta": 0.4,
            },
        )
        .reporting(min_sample_timesteps_per_iteration=steps_per_iter)
        .rl_module(
            model_config=DefaultModelConfig(
                conv_filters=[(16, 4, 2), (32, 4, 2), (64, 4, 2), (128, 4, 2)],
                conv_activation="relu",
                head_fcnet_hiddens=list(hiddens or [256]),
            )
        )
        .debugging(seed=seed)
    )


def _nbytes(data: Any) -> int:
    """Bytes of an episode column's data (an array, or a list of arrays)."""
    if hasattr(data, "nbytes"):
        return int(data.nbytes)
    return sum(int(getattr(x, "nbytes", 0)) for x in data)


def memory(system: str, algo: Any) -> dict[str, Any]:
    """What ``system``'s replay holds now (GiB): native's episodes' observations (env-stacked float32);
    Conduit's frames (uint8, once each) plus its transition rows; and the process's resident memory.
    Conduit's frames include those ``add`` handed over and the ingestion worker has not stored yet (async),
    counted at their stored size: until then it holds the chunks' own float32 arrays (4x that; at most the
    steps staged for the next put and those of the puts queued for ingestion)."""
    if system == "native":
        held = sum(_nbytes(ep.observations.data) for ep in algo.local_replay_buffer.episodes)
    else:
        from conduit_rllib.replay import ROW_BOOKKEEPING

        held = 0
        for mid, packer in algo.conduit_path.packers.items():
            store, buf = packer.store, algo.conduit_path.conduits[mid].buffer
            held += min(store.appended + packer.pending_frames, store.capacity) * DIM * DIM
            held += min(buf.inserted, buf.capacity) * (buf.schema.nbytes_per_item + ROW_BOOKKEEPING)
    rss = resident()["rss"]
    return {"replay_gib": round(held / 2**30, 4), "process_rss_gib": round(rss / 2**30, 3)}


def summary(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """``rllib_iteration.ratios`` for the one workload, the replay's final size per system, targets met."""
    rat = rllib_iteration.ratios(rows)[name]
    for system in ("native", "conduit"):
        last = [r for r in rows if r["system"] == system][-1]
        rat[f"{system}_replay_gib"] = last["replay_gib"]
    rat["process_rss_gib"] = max(r["process_rss_gib"] for r in rows)
    return rat


def targets_met(rat: dict[str, Any]) -> dict[str, bool | None]:
    """Per target: met, missed, or None where the ratio was refused (unequal work)."""
    return rllib_iteration.targets_met(rat, TARGETS)


def plot(rows: list[dict[str, Any]], rat: dict[str, Any], title: str, path: Path) -> None:
    """Per-iteration wall, exposed time and replay bytes of both systems; the ratios against the targets."""
    panels = (
        ("wall_s", "iteration wall (s)"),
        ("exposed_s", "exposed path (s)"),
        ("replay_gib", "replay GiB"),
    )
    rllib_iteration.plot_side_by_side(rows, rat, TARGETS, panels, title, path)


def main(argv: list[str] | None = None) -> Path:
    p = script.parser(__doc__, quick="200 env steps per iteration, 2 iterations (a smoke run, to /tmp)")
    p.add_argument("--demo", action="store_true", help="./dev demo atari: a few minutes, to demo_results/")
    p.add_argument("--env", default=ENV)
    p.add_argument("--steps-per-iter", type=int, default=None, help="env steps per iteration (1000)")
    p.add_argument("--iters", type=int, default=None, help="measured iterations per system (12)")
    p.add_argument("--capacity", type=int, default=100_000, help="replay capacity (transitions)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--overlap", choices=["sync", "async"], default="async")
    p.add_argument("--hiddens", type=int, nargs="+", default=None, help="Q head sizes (default 256)")
    a = p.parse_args(argv)
    if a.quick and a.demo:
        p.error("--quick and --demo are exclusive")
    mode = "quick" if a.quick else "demo" if a.demo else "full"
    steps = MODES[mode][0] if a.steps_per_iter is None else a.steps_per_iter
    iters = MODES[mode][1] if a.iters is None else a.iters
    for flag, v, least in (
        ("--steps-per-iter", steps, FRAGMENT),
        ("--iters", iters, 1),
        ("--capacity", a.capacity, 1),
    ):
        if v < least:
            p.error(f"{flag} must be at least {least}, got {v}")
    if a.capacity < steps:
        p.error(f"--capacity {a.capacity} is below one iteration's steps ({steps}): the warm-up must fit")
    a.out = a.out or MODES[mode][2]  # a smoke or demo run never overwrites the canonical results
    try:
        import ale_py  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"ale-py is not installed ({e}): pip install -e '.[rllib,atari,bench]'") from e
    prov = provenance.start()
    t0 = time.perf_counter()

    import ray
    import torch
    from conduit_rllib.local_ray import init_local_ray

    started_ray = not ray.is_initialized()  # a caller's (a test's) Ray is left running
    if started_ray:
        torch.set_num_threads(1)
        init_local_ray(log_to_driver=False)
    w = rllib_iteration.Workload("dqn", a.env.removeprefix("ale_py:"), BATCH)
    print(f"building native and Conduit DQN ({a.env}, {steps} env steps per iteration) ...", flush=True)
    try:
        rows = rllib_iteration.run_workload(
            w,
            iters,
            warmup=1,
            steps=steps,
            overlap=a.overlap,
            timer=PathTimer(),
            make=lambda: make_config(False, steps, a.capacity, a.seed, a.env, a.hiddens),
            make_native=lambda: make_config(True, steps, a.capacity, a.seed, a.env, a.hiddens),
            extra=memory,
        )
    finally:
        if started_ray:
            ray.shutdown()
    rat = summary(rows, w.name)
    settings = {
        "env": a.env,
        "dim": DIM,
        "num_frames": NUM_FRAMES,
        "n_step": N_STEP,
        "train_batch_size": BATCH,
        "rollout_fragment_length": FRAGMENT,
        "env_steps_per_iteration": steps,
        "replay": {
            "type": "PrioritizedEpisodeReplayBuffer",
            "capacity": a.capacity,
            "alpha": 0.5,
            "beta": 0.4,
        },
        "model": {
            "conv_filters": [[16, 4, 2], [32, 4, 2], [64, 4, 2], [128, 4, 2]],
            "head": a.hiddens or [256],
        },
        "native_stacking": "env (wrap_atari_for_new_api_stack(framestack=4)): float32 [64, 64, 4] per step",
        "conduit_stacking": "RLlib's FrameStacking connectors; frames stored once as uint8, stacked at delivery",
        "seed": a.seed,
        "overlap": a.overlap,
        "measured_iterations": iters,
        "warmup_iterations": 1,
        "mode": mode,
        "exposed_timing": "benchmark wrappers on both systems (rllib_native_timing.install(conduit=True))",
    }
    machine = script.machine(
        prov,
        ale_py=script.version("ale-py"),
        gymnasium=script.version("gymnasium"),
        run_s=round(time.perf_counter() - t0, 1),
    )
    record = rllib_iteration.record(machine, settings, rows, rat, TARGETS)
    title = (
        f"DQN {w.env} (RLlib Atari wrappers, dim 64, 4 frames, n-step 3, PER, batch 32): native vs Conduit"
    )
    print(f"\nmedians over {iters} iterations per system ({machine['run_s']:.0f} s in all):")
    return script.write_result(
        NAME, a, record, lambda png: plot(rows, rat, title, png), report_rllib.rllib_atari_iteration
    )


if __name__ == "__main__":
    main()
