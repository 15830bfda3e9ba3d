"""Checks the ``conduit`` trainer mode runs on its inputs; each failure is a ``VerlIntegrationError``."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from typing import Any

from conduit_verl.errors import (
    GroupSizeError,
    PluginNotInstalledError,
    ResponseTooLongError,
    VocabMismatchError,
)

ENTRY_POINT_GROUP = "verl.plugins"
INSTALL_HINT = (
    'install it with `pip install -e ".[verl]"` from the Conduit checkout (this registers the '
    '`verl.plugins` entry point `conduit = "conduit_verl.plugin"`, which every verl process imports), '
    "or set VERL_USE_EXTERNAL_MODULES=conduit_verl.plugin in the environment of every Ray worker"
)


def group_of(key: str) -> str:
    """The prompt uid of a TransferQueue sample key ``{uid}_{session}_{index}``."""
    return key.split("_")[0]


def check_groups(keys: Sequence[str], tags: Sequence[Mapping[str, Any]], n: int) -> list[list[int]]:
    """Row indices of each GRPO group (padding rows skipped); every group must have ``n`` rows."""
    rows: dict[str, list[int]] = {}
    for i, (key, tag) in enumerate(zip(keys, tags, strict=True)):
        if not tag.get("is_padding", False):
            rows.setdefault(group_of(key), []).append(i)
    bad = {uid: len(r) for uid, r in rows.items() if len(r) != n}
    if bad:
        raise GroupSizeError(
            f"rollout groups must have rollout.n={n} responses; got {bad} (uid: responses). "
            "A GRPO group must land whole: check the agent loop (failed sessions) or rollout.n."
        )
    return list(rows.values())


def check_response_lengths(keys: Sequence[str], tags: Iterable[Mapping[str, Any]], max_len: int) -> None:
    """Every non-padding sample's ``response_len`` tag is at most ``max_len``."""
    for key, tag in zip(keys, tags, strict=True):
        length = tag.get("response_len")
        if length is not None and not tag.get("is_padding", False) and int(length) > max_len:
            raise ResponseTooLongError(
                f"sample {key!r} has a response of {length} tokens, longer than "
                f"data.max_response_length={max_len}; cap the rollout's max_tokens or raise the limit"
            )


def check_model_tokenizer(model_path: str, tokenizer: Any) -> None:
    """The tokenizer's ids (``len(tokenizer)``) must fit the embedding table of the HF model at ``model_path``."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    vocab = getattr(config, "vocab_size", None) or getattr(
        getattr(config, "text_config", None), "vocab_size", None
    )
    if vocab is not None and len(tokenizer) > int(vocab):
        raise VocabMismatchError(
            f"tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {int(vocab)} ({model_path}): "
            f"ids >= {int(vocab)} would index past the embedding table; use the tokenizer that belongs to the model"
        )


def piece_unit(
    batch_size: int, n: int, micro: dict[str, int | None], piece_groups: int | str, dp: int = 1
) -> int:
    """The fewest groups a streamed piece may hold: every piece is split over ``dp`` data-parallel
    ranks and each rank's share into whole inference micro-batches (verl asserts it in the worker,
    far from the cause), so pieces are whole multiples of this unit; the step's batch and a fixed
    ``piece_groups`` must be too (else ConfigError)."""
    from conduit.errors import ConfigError

    rows = row_unit(micro, dp)
    unit = rows // math.gcd(rows, n)  # the fewest groups whose n * unit responses are whole row units
    where = ", ".join(f"{k}={v}" for k, v in micro.items() if v) + f"; {dp} data-parallel rank(s)"
    if batch_size % unit:
        raise ConfigError(
            f"data.train_batch_size={batch_size} prompts cannot be streamed in pieces that split into whole "
            f"micro-batches ({where}; rollout.n={n}: pieces need multiples of {unit} groups); "
            "set the micro-batch sizes to divisors of rollout.n or use dynamic batch size"
        )
    if isinstance(piece_groups, int) and piece_groups % unit:
        raise ConfigError(
            f"trainer.v1.conduit.piece_groups={piece_groups} gives pieces of {piece_groups * n} samples, "
            "not whole micro-batches "
            f"({where}); use a multiple of {unit} groups, 'auto', or micro-batch sizes that divide rollout.n={n}"
        )
    return unit


def plugin_installed() -> bool:
    """Whether an installed distribution declares ``conduit_verl.plugin`` as a ``verl.plugins`` entry point."""
    return any(ep.value.startswith("conduit_verl") for ep in metadata.entry_points(group=ENTRY_POINT_GROUP))


def require_plugin(trainer_mode: str) -> None:
    """Raise :class:`PluginNotInstalledError` if ``trainer_mode`` is ``conduit`` and the plugin is missing."""
    if trainer_mode == "conduit" and not plugin_installed():
        raise PluginNotInstalledError(
            "trainer.v1.trainer_mode=conduit needs Conduit's verl plugin in every verl process, and it "
            f"is not installed: {INSTALL_HINT}. (Without it verl itself says only "
            "\"Unknown trainer 'conduit'\".)"
        )


def explain_unknown_trainer(exc: BaseException) -> BaseException:
    """Turn verl's ``ValueError("Unknown trainer 'conduit' ...")`` into a PluginNotInstalledError."""
    if isinstance(exc, ValueError) and "Unknown trainer 'conduit'" in str(exc):
        err = PluginNotInstalledError(f"{exc} — Conduit's verl plugin was not loaded: {INSTALL_HINT}")
        err.__cause__ = exc
        return err
    return exc


def row_unit(micro: dict[str, int | None], dp: int = 1) -> int:
    """The fewest responses an ingestion call may take when it is not whole groups (early rows,
    ``early_rows.py``): whole inference micro-batches on every data-parallel rank."""
    unit = 1
    for size in micro.values():
        if size:
            unit = math.lcm(unit, dp * size)
    return unit
