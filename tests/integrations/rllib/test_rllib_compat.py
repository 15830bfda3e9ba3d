"""conduit_rllib's RLlib seams (``conduit_rllib/compat.py``): each one holds in the installed RLlib, and a
missing one fails with an error that names it and the ray version."""

import logging
import re
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from conduit_rllib import RLlibVersionError, compat
from conduit_rllib.compat import Seam

from conduit.errors import ConduitError

ROOT = Path(__file__).resolve().parents[3]
PLUGIN = ROOT / "integrations" / "rllib" / "conduit_rllib"


# -- every seam holds in the installed RLlib (one test each) -------------------------------------------


@pytest.mark.parametrize("seam", compat.SEAMS, ids=lambda s: s.name)
def test_seam_present(seam):
    assert seam.check() is None


def test_installed_ray_is_the_tested_one():
    assert compat.RAY_VERSION == compat.TESTED_RAY
    assert f'"ray[rllib]=={compat.TESTED_RAY}"' in (ROOT / "pyproject.toml").read_text()
    assert compat.verify() == {}
    assert compat._FAST_SAMPLE_BATCH and compat._FAST_CHUNKS  # both fast paths are on


def test_only_compat_imports_rllib():
    """Every other plugin module reaches RLlib through compat."""
    offenders = []
    for path in sorted(PLUGIN.glob("*.py")):
        if path.name == "compat.py":
            continue
        for line in path.read_text().splitlines():
            if re.search(r"\bray\.rllib\b", line) and not line.lstrip().startswith("#"):
                offenders.append(f"{path.name}: {line.strip()}")
    assert offenders == []


def test_tensor_sample_batch_equals_constructor():
    cols = {"obs": torch.randn(4, 3), "actions": torch.arange(4)}
    fast = compat.tensor_sample_batch(dict(cols), 4)
    slow = compat.SampleBatch(dict(cols))
    assert type(fast) is type(slow) and vars(fast) == vars(slow)
    assert fast.keys() == slow.keys() and all(fast[k] is cols[k] for k in cols)
    assert len(fast) == 4


def test_chunk_arrays_equal_getters_on_cut_episode():
    ep = compat.SingleAgentEpisode()
    ep.add_env_reset(observation=np.zeros(2, np.float32))
    for t in range(5):
        ep.add_env_step(np.full(2, t + 1, np.float32), t % 2, float(t))
    nxt = ep.cut()
    for t in range(3):
        nxt.add_env_step(np.full(2, t + 10, np.float32), 1, 1.0, terminated=t == 2)
    for chunk in (ep.to_numpy(), nxt.to_numpy()):
        fast = compat.chunk_arrays(chunk)
        assert len(fast[0]) == len(fast[1]) + 1
        for f, g in zip(fast, compat._getter_chunk_arrays(chunk), strict=True):
            np.testing.assert_array_equal(f, g)


@pytest.fixture(scope="module")
def learner_group():
    from conduit_rllib.learner import ConduitPPOTorchLearner

    cfg = (
        compat.PPOConfig()
        .environment("CartPole-v1")
        .learners(learner_class=ConduitPPOTorchLearner)
        .debugging(seed=0)
    )
    lg = cfg.build_learner_group(env=gym.make("CartPole-v1"))
    yield lg
    lg.shutdown()


def test_local_learner_and_device(learner_group):
    learner = compat.local_learner(learner_group)
    assert isinstance(learner, compat.Learner)
    assert torch.device(compat.learner_device(learner)) == torch.device("cpu")


def test_call_first_learner(learner_group):
    assert compat.call_first_learner(learner_group, lambda learner: type(learner).__name__) == (
        "ConduitPPOTorchLearner"
    )


def test_iterator_hook_hands_over_prepared_minibatches(learner_group):
    from conduit_rllib.learner import PreparedMinibatches

    learner = compat.local_learner(learner_group)
    mid = next(iter(learner.module.keys()))
    sb = compat.tensor_sample_batch(
        {"obs": torch.randn(8, 4), "actions": torch.zeros(8, dtype=torch.int64)}, 8
    )
    prepared = PreparedMinibatches({mid: sb}, 8, minibatch_size=4)
    it = learner._create_iterator_if_necessary(training_data=compat.TrainingData(batch=prepared))
    mbs = list(it)
    assert len(mbs) == 2 and all(isinstance(m, compat.MultiAgentBatch) for m in mbs)
    assert torch.equal(mbs[1].policy_batches[mid]["obs"], sb["obs"][4:])
    # a plain MultiAgentBatch still goes through RLlib's own iterator
    plain = compat.MultiAgentBatch({mid: compat.SampleBatch({"obs": torch.randn(8, 4)})}, 8)
    rllib_it = learner._create_iterator_if_necessary(training_data=compat.TrainingData(batch=plain))
    assert type(rllib_it).__module__.startswith("ray.rllib")


def test_pop_td_errors_from_learner_results():
    from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

    results = []
    for td in (np.array([1.0, 2.0]), np.array([3.0])):
        m = MetricsLogger()
        m.log_value(("p0", compat.TD_ERROR_KEY), td, reduce="item_series")
        m.log_value(("p0", "loss"), 1.0)
        results.append(m.reduce())
    tds = compat.pop_td_errors(results)
    np.testing.assert_array_equal(tds["p0"], [1.0, 2.0, 3.0])
    assert all(compat.TD_ERROR_KEY not in r["p0"] and "loss" in r["p0"] for r in results)


def test_settings_ride_on_the_config():
    cfg = compat.DQNConfig()
    compat.store_settings(cfg, {"overlap": "async"})
    assert compat.stored_settings(cfg.copy(copy_frozen=False)) == {"overlap": "async"}
    assert compat.stored_settings(compat.DQNConfig()) == {}


def test_module_spaces_drop_env_entries():
    box, disc = gym.spaces.Box(0, 1, (2,)), gym.spaces.Discrete(2)
    algo = SimpleNamespace(spaces={"__env__": (box, disc), "__env_single__": (box, disc), "p0": (box, disc)})
    assert compat.module_spaces(algo) == {"p0": (box, disc)}
    assert compat.module_spaces(SimpleNamespace(spaces=None)) == {}


def test_sample_episodes_passes_rllib_private_flags(monkeypatch):
    seen = {}

    def fake(**kwargs):
        seen.update(kwargs)
        return [], []

    monkeypatch.setattr(compat, "synchronous_parallel_sample", fake)
    compat.sample_episodes("group", sample_timeout_s=1.0, max_env_steps=10)
    assert seen["worker_set"] == "group" and seen["max_env_steps"] == 10
    assert seen["_uses_new_env_runners"] is True and seen["_return_metrics"] is True


# -- a missing seam: a clear error, naming it and the ray version --------------------------------------


def test_missing_seam_raises_clear_error():
    seam = Seam("Learner._device", "test", lambda: "Learner attribute `_device` not found")
    with pytest.raises(RLlibVersionError) as info:
        compat.verify([seam], version="2.61.0")
    assert str(info.value) == (
        "ray 2.61.0: Learner attribute `_device` not found; conduit_rllib supports ray[rllib] 2.60.0"
    )
    assert isinstance(info.value, ConduitError)


def test_missing_seam_on_fake_rllib_class(monkeypatch):
    class FakeLearnerGroup:  # a release whose LearnerGroup keeps its learner elsewhere
        def __init__(self):
            self.learners = []

        @property
        def is_local(self):
            return True

    monkeypatch.setattr(compat, "LearnerGroup", FakeLearnerGroup)
    seam = next(s for s in compat.SEAMS if s.name == "LearnerGroup._learner")
    with pytest.raises(
        RLlibVersionError, match=r"^ray 2\.61\.0: LearnerGroup attribute `_learner` not found"
    ):
        compat.verify([seam], version="2.61.0")
    with pytest.raises(
        RLlibVersionError, match=r"`_learner` not found; conduit_rllib supports ray\[rllib\] 2\.60\.0"
    ):
        compat.local_learner(FakeLearnerGroup())


def test_missing_name_and_unrunnable_check():
    assert compat._name_check("ray.rllib.core", "NoSuchThing")() == "`ray.rllib.core.NoSuchThing` not found"
    assert "module `ray.rllib.nowhere` not found" in compat._name_check("ray.rllib.nowhere", "X")()

    def broken():
        raise AttributeError("'NoneType' object has no attribute 'update'")

    with pytest.raises(
        RLlibVersionError, match=r"ray 9\.9\.9: LearnerGroup\.update not usable \(AttributeError"
    ):
        compat.verify([Seam("LearnerGroup.update", "test", broken)], version="9.9.9")


def test_runtime_accessors_name_the_seam():
    with pytest.raises(RLlibVersionError, match="Learner property `device` not found"):
        compat.learner_device(object())
    with pytest.raises(RLlibVersionError, match="Algorithm attribute `spaces` not found"):
        compat.module_spaces(object())


def test_other_version_with_every_seam_warns(caplog):
    seam = Seam("present", "test", lambda: None)
    with caplog.at_level(logging.WARNING, logger="conduit_rllib.compat"):
        assert compat.verify([seam], version="2.61.0") == {}
    assert "ray 2.61.0: conduit_rllib is tested with ray[rllib] 2.60.0" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="conduit_rllib.compat"):
        compat.verify([seam], version=compat.TESTED_RAY)
    assert caplog.text == ""


def test_missing_optional_seam_warns_and_falls_back(caplog):
    seam = Seam("fast path", "test", lambda: "SampleBatch has new attributes", fallback="the constructor")
    with caplog.at_level(logging.WARNING, logger="conduit_rllib.compat"):
        assert compat.verify([seam]) == {"fast path": "SampleBatch has new attributes"}
    assert "falls back: the constructor" in caplog.text


def test_iterator_hook_delegates_without_rllib():
    class Base:
        def _create_iterator_if_necessary(self, *, training_data, **kwargs):
            return "rllib"

    class Hooked(compat.LearnerIteratorHook, Base):
        def conduit_minibatches(self, batch):
            return ["mine"] if batch == "prepared" else None

    h = Hooked()
    assert h._create_iterator_if_necessary(
        training_data=SimpleNamespace(batch="prepared", episodes=None)
    ) == ["mine"]
    assert (
        h._create_iterator_if_necessary(training_data=SimpleNamespace(batch="other", episodes=None))
        == "rllib"
    )
    assert (
        h._create_iterator_if_necessary(training_data=SimpleNamespace(batch="prepared", episodes=[1]))
        == "rllib"
    )
