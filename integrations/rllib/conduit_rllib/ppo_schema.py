"""PPO's column schemas: inferred from the first packed fragment batch, checked against the action space.

Discrete and continuous (``Box``) actions take the same path: the action column's dtype and per-step
shape come from the module's action space (``spaces.column_spec``: ``float32`` ``(k,)`` for a
``Box(k)``, ``int64`` ``()`` for ``Discrete``), ``action_logp`` is one ``float32`` per step (PPO's
ratio needs the log-probability of the whole action) and ``action_dist_inputs`` a ``float32`` vector
per step (a diagonal Gaussian's means and log-stds, or the logits). Floating columns the sampler
writes are checked for NaN/inf on every put (one reduction per column and batch): a diverged policy's
NaN actions raise ``NonFiniteError`` naming the column instead of reaching the loss.
"""

from __future__ import annotations

from typing import Any

import torch

from conduit import Column, ColumnBatch, Schema
from conduit_rllib.errors import ActionFormatError
from conduit_rllib.spaces import column_spec

#: columns the sampler writes whose NaN/inf is refused at put (when they are floating point)
CHECKED = ("actions", "action_logp", "action_dist_inputs", "rewards")


def check_action_columns(sample: ColumnBatch, action_space: Any, module: str) -> None:
    """Raise :class:`ActionFormatError` unless ``sample``'s action columns fit ``action_space`` and PPO.

    ``action_space`` ``None`` (unknown) checks only the log-probability and distribution inputs.
    """
    acts, logp, dist = (_dense(sample, n, module) for n in ("actions", "action_logp", "action_dist_inputs"))
    if action_space is not None:
        dtype, shape = column_spec(action_space, f"the action space of module {module!r}")
        got = tuple(acts.shape[1:])
        if acts.dtype != dtype or got != shape:
            raise ActionFormatError(
                f"module {module!r}: column 'actions' holds {acts.dtype} of per-step shape {got}, but its "
                f"action space {action_space!r} needs {dtype} of shape {shape}; the env runner's actions "
                "must have the action space's shape (check the module-to-env connectors)"
            )
    if logp.dim() != 1:
        raise ActionFormatError(
            f"module {module!r}: column 'action_logp' has per-step shape {tuple(logp.shape[1:])}; PPO needs "
            "one log-probability per step (the whole action's, summed over action dimensions)"
        )
    if not dist.is_floating_point() or dist.dim() != 2:
        raise ActionFormatError(
            f"module {module!r}: column 'action_dist_inputs' holds {dist.dtype} of per-step shape "
            f"{tuple(dist.shape[1:])}; PPO needs a float vector per step (logits, or a Gaussian's means "
            "and log-stds)"
        )


def _dense(sample: ColumnBatch, name: str, module: str) -> torch.Tensor:
    t = sample[name]
    if not isinstance(t, torch.Tensor):
        raise ActionFormatError(
            f"module {module!r}: column {name!r} is ragged; PPO stores one fixed-shape row per step"
        )
    return t


def ppo_schemas(sample: ColumnBatch, action_space: Any = None, module: str = "") -> tuple[Schema, Schema]:
    """(put schema, stored schema) from the first packed fragment batch of ``module``.

    Raises:
        ActionFormatError: the action columns do not fit ``action_space`` or PPO's loss.
    """
    check_action_columns(sample, action_space, module)

    def col(name: str, checked: bool = False) -> Column:
        t = _dense(sample, name, module)
        return Column(name, t.dtype, tuple(t.shape[1:]), check_finite=checked and t.is_floating_point())

    put = Schema([col(n, n in CHECKED) for n in sample.columns])
    stored = Schema(
        [
            col("obs"),
            col("actions"),
            col("action_logp"),
            col("action_dist_inputs"),
            Column("advantages", torch.float32),
            Column("value_targets", torch.float32),
        ]
    )
    return put, stored
