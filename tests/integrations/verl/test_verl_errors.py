"""The verl integration's errors: each a ConduitError that says what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("verl")

from conduit_verl import checks  # noqa: E402
from conduit_verl.errors import (  # noqa: E402
    GroupSizeError,
    PluginNotInstalledError,
    ResponseTooLongError,
    VerlIntegrationError,
    VocabMismatchError,
)

from conduit.errors import ConduitError, ConfigError  # noqa: E402


def test_family() -> None:
    for cls in (GroupSizeError, PluginNotInstalledError, ResponseTooLongError, VocabMismatchError):
        assert issubclass(cls, VerlIntegrationError) and issubclass(cls, ConduitError)
    assert issubclass(ConfigError, ValueError)


def test_plugin_missing_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checks, "plugin_installed", lambda: False)
    with pytest.raises(PluginNotInstalledError, match=r'pip install -e "\.\[verl\]"'):
        checks.require_plugin("conduit")
    checks.require_plugin("sync")  # other modes do not need the plugin


def test_plugin_installed_here() -> None:
    assert checks.plugin_installed()


def test_verl_unknown_trainer_error_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    import conduit_verl.trainer  # noqa: F401
    from verl.trainer.ppo.v1 import trainer_base

    monkeypatch.delitem(trainer_base.TRAINER_REGISTRY, "conduit")
    with pytest.raises(ValueError) as info:
        trainer_base.get_trainer_cls("conduit")
    err = checks.explain_unknown_trainer(info.value)
    assert isinstance(err, PluginNotInstalledError)
    assert "verl.plugins" in str(err) and "Unknown trainer 'conduit'" in str(err)
    other = ValueError("something else")
    assert checks.explain_unknown_trainer(other) is other


def test_group_smaller_than_n() -> None:
    keys = ["u1_0_0", "u1_1_0", "u2_0_0", "u2_1_0", "u2_2_0"]
    tags = [{} for _ in keys]
    with pytest.raises(GroupSizeError, match=r"rollout\.n=3.*'u1': 2"):
        checks.check_groups(keys, tags, n=3)
    assert checks.check_groups(keys[2:], tags[2:], n=3) == [[0, 1, 2]]
    # padding rows do not count
    padded = [*tags[2:], {"is_padding": True}]
    assert checks.check_groups([*keys[2:], "pad_0_0"], padded, n=3) == [[0, 1, 2]]


def test_response_too_long() -> None:
    with pytest.raises(ResponseTooLongError, match=r"17 tokens.*max_response_length=16"):
        checks.check_response_lengths(["a_0_0", "a_1_0"], [{"response_len": 16}, {"response_len": 17}], 16)
    checks.check_response_lengths(["a_0_0"], [{"response_len": 16}], 16)


def test_vocab_mismatch(tmp_path: Path) -> None:
    build_tokenizer = pytest.importorskip("conduit_verl_cpu.tokenizer").build_tokenizer
    from transformers import Qwen2Config

    tokenizer = build_tokenizer()
    Qwen2Config(vocab_size=len(tokenizer) - 5, hidden_size=8, num_attention_heads=1).save_pretrained(tmp_path)
    with pytest.raises(VocabMismatchError, match=r"vocab_size is"):
        checks.check_model_tokenizer(str(tmp_path), tokenizer)
    Qwen2Config(vocab_size=len(tokenizer), hidden_size=8, num_attention_heads=1).save_pretrained(tmp_path)
    checks.check_model_tokenizer(str(tmp_path), tokenizer)


@pytest.mark.parametrize(
    "knobs",
    [{"overlap": "maybe"}, {"g_del": -1}, {"piece_groups": 1.5}, {"depth": 1}, {"poll_interval_s": 0}],
)
def test_knobs_out_of_range_are_config_errors(knobs: dict) -> None:
    from conduit_verl.config import ConduitTrainerConfig
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"trainer": {"v1": {"trainer_mode": "conduit", "conduit": knobs}}})
    with pytest.raises(ConfigError):
        ConduitTrainerConfig.from_verl(cfg)
