"""Per-step sample dump (``CONDUIT_VERL_DUMP=<file>``): prompt, response and advantages of every sample.

Used by the equivalence test to compare trainer modes sample by sample. It wraps verl's
``PPOTrainer._compute_metrics`` (which every mode calls with the step's full batch) and appends one
JSON line per step: ``{"step", "samples": [{"prompt", "response", "adv", "old_log_prob"}, ...]}``
(with a critic, PPO, also ``"values"`` and ``"returns"``).
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

DUMP_ENV = "CONDUIT_VERL_DUMP"
FIELDS = ["prompts", "responses", "advantages", "old_log_probs"]
#: Dump name → TransferQueue field, for the float columns.
FLOATS = {"adv": "advantages", "old_log_prob": "old_log_probs"}
CRITIC_FLOATS = {"values": "values", "returns": "returns"}


def _rows(batch: Any, critic: bool = False) -> list[dict[str, Any]]:
    import transfer_queue as tq

    floats = {**FLOATS, **(CRITIC_FLOATS if critic else {})}
    fields = ["prompts", "responses", *floats.values()]
    keep = [i for i, tag in enumerate(batch.tags) if not tag.get("is_padding", False)]
    keys = [batch.keys[i] for i in keep]
    data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=fields)
    cols = {name: data[name].unbind(0) for name in fields}
    return [
        {
            "prompt": cols["prompts"][i].tolist(),
            "response": cols["responses"][i].tolist(),
            **{k: [round(float(x), 7) for x in cols[f][i].tolist()] for k, f in floats.items()},
        }
        for i in range(len(keys))
    ]


def install() -> None:
    """Wrap ``PPOTrainer._compute_metrics`` to append the dump (no-op without the env var)."""
    path = os.environ.get(DUMP_ENV)
    if not path:
        return
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    original = PPOTrainer._compute_metrics
    if getattr(original, "_conduit_patched", False):
        return

    @functools.wraps(original)
    def _compute_metrics(
        self: Any, batch: Any, metrics: Any, timing_raw: Any, global_steps: Any, epoch: Any
    ) -> Any:
        rows = sorted(
            _rows(batch, bool(getattr(self, "use_critic", False))), key=lambda r: (r["prompt"], r["response"])
        )
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": int(global_steps), "samples": rows}) + "\n")
        return original(self, batch, metrics, timing_raw, global_steps, epoch)

    _compute_metrics._conduit_patched = True  # type: ignore[attr-defined]
    PPOTrainer._compute_metrics = _compute_metrics  # type: ignore[method-assign]
