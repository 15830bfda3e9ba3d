"""Equal work in every RLlib A/B: Conduit's PPO makes RLlib's number of updates; unequal work refuses a ratio."""

import math

import conduit_rllib
import numpy as np
import pytest
from benchmark_modules import load
from conduit_rllib.onpolicy import rllib_minibatches
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.minibatch_utils import MiniBatchCyclicIterator


def _timing():
    return load("rllib_native_timing")


def _rllib_cycles(padded: dict[str, int], num_epochs: int, minibatch_size: int) -> int:
    """Minibatches RLlib's own iterator yields over a batch of ``padded`` rows per module."""
    batch = MultiAgentBatch(
        {mid: SampleBatch({"x": np.arange(n)}) for mid, n in padded.items()}, max(padded.values())
    )
    it = MiniBatchCyclicIterator(batch, num_epochs=num_epochs, minibatch_size=minibatch_size)
    return sum(1 for _ in it)


@pytest.mark.parametrize(
    ("rows", "chunks", "epochs", "mb"),
    [
        ({"m": 500}, {"m": 22}, 3, 64),
        ({"m": 4000}, {"m": 40}, 30, 128),
        ({"m": 512}, {"m": 0}, 2, 128),  # exact multiple: no extra cycle
        ({"a": 300, "b": 200}, {"a": 9, "b": 30}, 4, 50),  # the module that needs most decides
        ({"m": 40}, {"m": 3}, 2, 64),  # minibatch larger than the batch
    ],
)
def test_rllib_minibatches_matches_rllibs_cyclic_iterator(rows, chunks, epochs, mb):
    padded = {mid: n + chunks[mid] for mid, n in rows.items()}
    assert rllib_minibatches(rows, chunks, epochs, mb) == _rllib_cycles(padded, epochs, mb)


def test_rllib_minibatches_counts_the_padding():
    assert rllib_minibatches({"m": 500}, {"m": 22}, 3, 64) == 25
    assert math.ceil(3 * 500 / 64) == 24  # what Conduit delivered before: one update fewer than RLlib


def test_rllib_minibatches_with_several_learners_is_rllibs_fixed_count():
    # RLlib: int(epochs * max module rows / (learners * minibatch)), no padding
    assert rllib_minibatches({"a": 4000, "b": 3000}, {"a": 40, "b": 30}, 30, 128, ranks=2) == 468
    # ... unless that is 0: then each learner covers its padded share
    assert rllib_minibatches({"m": 100}, {"m": 5}, 1, 128, ranks=2) == 1


def test_ratio_is_given_only_for_equal_work():
    t = _timing()
    work = {"env_steps_sampled": 4000, "gradient_updates": 943, "module_steps_trained": 120_704}
    assert t.ratio_or_refusal(2.0, 1.5, work, dict(work)) == (0.75, None)
    ratio, why = t.ratio_or_refusal(2.0, 1.5, work, {**work, "gradient_updates": 942})
    assert ratio is None
    assert why == "gradient_updates differ: native 943, conduit 942"
    ratio, why = t.ratio_or_refusal(
        2.0, 1.5, work, {**work, "env_steps_sampled": 4001, "module_steps_trained": 1}
    )
    assert ratio is None and "env_steps_sampled" in why and "module_steps_trained" in why
    assert "gradient_updates" not in why
    assert t.ratio_or_refusal(None, 1.5, work, dict(work)) == (None, "no measurement")


def test_work_totals_sum_each_systems_rows():
    t = _timing()
    rows = [
        {"system": "native", "env_steps_sampled": 10, "gradient_updates": 2, "module_steps_trained": 64},
        {"system": "native", "env_steps_sampled": 10, "gradient_updates": 3, "module_steps_trained": 96},
        {"system": "conduit", "env_steps_sampled": 10, "gradient_updates": 5, "module_steps_trained": 160},
    ]
    assert t.work_totals(rows, "native") == {
        "env_steps_sampled": 20,
        "gradient_updates": 5,
        "module_steps_trained": 160,
    }
    assert t.work_totals(rows, "conduit")["gradient_updates"] == 5


def _row(system, wall, updates, **kw):
    work = {"env_steps_sampled": 200, "gradient_updates": updates, "module_steps_trained": 32 * updates}
    return {"system": system, "wall_s": wall, "exposed_s": wall / 10, **work, **kw}


def test_demo_summary_refuses_its_ratios_when_work_differs():
    """The demo summarises with the benchmark's rule (``rllib_iteration.ratios``)."""
    it = load("rllib_iteration")
    key = {"algo": "dqn", "env": "CartPole-v1", "train_batch_size": 32}
    equal = it.ratios([_row("native", 2.0, 200, **key), _row("conduit", 1.0, 200, **key)])[
        "dqn CartPole-v1 b32"
    ]
    assert equal["ratio_wall"] == 0.5 and equal["ratio_exposed"] == 0.5 and equal["ratio_refused"] is None
    unequal = it.ratios([_row("native", 2.0, 200, **key), _row("conduit", 1.0, 190, **key)])[
        "dqn CartPole-v1 b32"
    ]
    assert unequal["ratio_wall"] is None and unequal["ratio_exposed"] is None
    assert unequal["ratio_refused"].startswith("gradient_updates differ: native 200, conduit 190")
    assert unequal["native_work"]["gradient_updates"] == 200
    assert "summarize" not in vars(load("rllib_demo"))  # no second rule of its own


def test_iteration_table_prints_a_refused_ratio_with_the_reason():
    it = load("rllib_iteration")
    key = {"algo": "ppo", "env": "CartPole-v1", "train_batch_size": 1000}
    rows = [_row("native", 4.0, 240, **key), _row("conduit", 3.0, 238, **key)]
    rat = it.ratios(rows)["ppo CartPole-v1 b1000"]
    assert rat["ratio_wall"] is None and rat["ratio_exposed"] is None
    assert "gradient_updates differ: native 240, conduit 238" in rat["ratio_refused"]
    assert rat["native_wall_s_per_update"] == pytest.approx(4.0 / 240)
    assert rat["conduit_wall_s_per_update"] == pytest.approx(3.0 / 238)
    text = "\n".join(load("report_tables").rllib_iteration({"ratios": {"ppo CartPole-v1 b1000": rat}}))
    assert "refused [1]" in text and "[1] refused: gradient_updates differ" in text
    rows = [_row("native", 4.0, 240, **key), _row("conduit", 3.0, 240, **key)]
    assert it.ratios(rows)["ppo CartPole-v1 b1000"]["ratio_wall"] == pytest.approx(0.75)


def _ppo(minibatch_size, seed=3):
    return (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .training(train_batch_size=500, minibatch_size=minibatch_size, num_epochs=3)
        .debugging(seed=seed)
    )


def _first_iteration_work(config, t):
    algo = config.build_algo()
    try:
        counter = t.WorkCounter(algo)
        result = algo.train()
        work = counter.take(result)
        work["episodes"] = result["env_runners"]["num_episodes"]
        work["rllib_module_steps"] = result["learners"]["default_policy"]["num_module_steps_trained"]
        return work
    finally:
        algo.stop()


@pytest.mark.ray
@pytest.mark.parametrize(("overlap", "minibatch_size"), [("sync", 64), ("async", 64), ("sync", None)])
def test_ppo_through_conduit_does_rllibs_updates_on_rllibs_rows(ray_local, overlap, minibatch_size):
    t = _timing()
    native = _first_iteration_work(_ppo(minibatch_size), t)
    conduit = _first_iteration_work(conduit_rllib.enable(_ppo(minibatch_size), overlap=overlap), t)
    assert native["episodes"] == conduit["episodes"]  # same seed, same first-iteration episodes
    for w in (native, conduit):
        assert w["env_steps_sampled"] == 500
        assert w["module_steps_trained"] == w["rllib_module_steps"]
    assert conduit["gradient_updates"] == native["gradient_updates"]
    assert conduit["module_steps_trained"] == native["module_steps_trained"]  # so equal rows per update
    # RLlib pads each episode chunk by one masked step and covers the padded batch num_epochs times
    if minibatch_size is None:  # one update per epoch on the whole padded batch
        assert native["gradient_updates"] == 3
        assert 500 + native["episodes"] <= native["module_steps_trained"] // 3 <= 501 + native["episodes"]
    else:
        assert native["gradient_updates"] > math.ceil(3 * 500 / 64)
        assert native["module_steps_trained"] == 64 * native["gradient_updates"]
