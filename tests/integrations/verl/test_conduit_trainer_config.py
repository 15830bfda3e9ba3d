"""The ``conduit`` trainer mode: registration and ``trainer.v1.conduit.*`` validation."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")

from conduit_verl.config import ConduitTrainerConfig  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from conduit.errors import ConfigError  # noqa: E402


def _cfg(knobs: dict | None):
    v1: dict = {"trainer_mode": "conduit"}
    if knobs is not None:
        v1["conduit"] = knobs
    cfg = OmegaConf.create({"trainer": {"v1": v1}})
    OmegaConf.set_struct(cfg, True)
    return cfg


def test_registered_as_sync_subclass() -> None:
    import conduit_verl.trainer  # noqa: F401
    from verl.trainer.ppo.v1 import PPOTrainerSync, get_trainer_cls

    cls = get_trainer_cls("conduit")
    assert issubclass(cls, PPOTrainerSync)


def test_defaults_and_values() -> None:
    from conduit_verl.trainer import ConduitTrainerConfig

    assert ConduitTrainerConfig.from_verl(_cfg(None)) == ConduitTrainerConfig()
    got = ConduitTrainerConfig.from_verl(
        _cfg({"piece_groups": 2, "overlap": "async", "poll_interval_s": 0.1})
    )
    assert (got.piece_groups, got.overlap, got.poll_interval_s) == (2, "async", 0.1)


@pytest.mark.parametrize("value", [2, 0, "auto"])
def test_the_old_g_ing_key_fails_and_names_piece_groups(value: object) -> None:
    """verl's ``g_ing`` (prompt groups per piece) was renamed ``piece_groups``: the core's ``g_ing``
    counts rollout fragments per operator call. The old key is never silently ignored."""
    from conduit_verl.trainer import ConduitTrainerConfig

    with pytest.raises(ConfigError, match=r"g_ing was renamed trainer\.v1\.conduit\.piece_groups"):
        ConduitTrainerConfig.from_verl(_cfg({"g_ing": value}))
    with pytest.raises(ConfigError, match="piece_groups"):  # with overlap=sync too: the rename is named first
        ConduitTrainerConfig.from_verl(_cfg({"overlap": "sync", "g_ing": value}))


@pytest.mark.parametrize("key", ["bogus", "depth"])  # depth: a reserved knob, removed
def test_unknown_key_is_named(key: str) -> None:
    from conduit_verl.trainer import ConduitTrainerConfig

    with pytest.raises(ConfigError, match=rf"Unknown key trainer\.v1\.conduit\.{key}"):
        ConduitTrainerConfig.from_verl(_cfg({key: 1}))


@pytest.mark.parametrize("knobs", [{"overlap": "maybe"}, {"g_del": -1}, {"poll_interval_s": 0}])
def test_bad_values(knobs: dict) -> None:
    from conduit_verl.trainer import ConduitTrainerConfig

    with pytest.raises(ValueError):
        ConduitTrainerConfig.from_verl(_cfg(knobs))  # ConfigError is a ValueError


@pytest.mark.parametrize("key", ["piece_groups", "g_del"])
def test_a_knob_that_does_not_apply_with_overlap_sync_raises(key: str) -> None:
    from conduit_verl.trainer import ConduitTrainerConfig

    with pytest.raises(ConfigError, match=f"{key} does not apply with overlap=sync"):
        ConduitTrainerConfig.from_verl(_cfg({"overlap": "sync", key: 2}))
    assert (
        ConduitTrainerConfig.from_verl(_cfg({"overlap": "sync", "poll_interval_s": 0.5})).poll_interval_s
        == 0.5
    )


def test_rollout_hardware_is_validated_and_refused_with_overlap_sync() -> None:
    from conduit_verl.trainer import ConduitTrainerConfig

    assert ConduitTrainerConfig.from_verl(_cfg(None)).rollout_hardware == "shared"
    got = ConduitTrainerConfig.from_verl(_cfg({"rollout_hardware": "separate"}))
    assert got.rollout_hardware == "separate"
    for bad in ("gpu", "", None, 1):
        with pytest.raises(ConfigError, match="rollout_hardware must be 'shared'"):
            ConduitTrainerConfig.from_verl(_cfg({"rollout_hardware": bad}))
    with pytest.raises(ConfigError, match="rollout_hardware does not apply with overlap=sync"):
        ConduitTrainerConfig.from_verl(_cfg({"overlap": "sync", "rollout_hardware": "separate"}))


def test_a_separate_rollout_has_its_own_tuner_signature(tmp_path) -> None:
    from conduit_verl.trainer import _piece_tuning

    config = OmegaConf.create({"algorithm": {"adv_estimator": "grpo"}})
    shared = _piece_tuning(config, str(tmp_path), groups=16, n=8)
    separate = _piece_tuning(config, str(tmp_path), groups=16, n=8, separate=True)
    assert shared.workload is not None and separate.workload is not None
    assert shared.workload.algorithm == "verl/grpo/n8"  # the key of decisions cached before the knob existed
    assert separate.workload.algorithm == "verl/grpo/n8/separate"


@pytest.mark.parametrize("bad", ["", 5, ["a"]])
def test_tuner_cache_knob_is_validated(bad: object) -> None:
    with pytest.raises(ConfigError, match="tuner_cache"):
        ConduitTrainerConfig(tuner_cache=bad)  # type: ignore[arg-type]
    assert ConduitTrainerConfig(tuner_cache="/tmp/x").tuner_cache == "/tmp/x"
