"""A deterministic arithmetic task ("12+7=" → "19") written as verl ``RLHFDataset`` parquet files."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

DATA_SOURCE = "conduit_arith"


def make_rows(n: int, seed: int, split: str, max_operand: int = 20) -> list[dict[str, Any]]:
    """``n`` distinct addition problems with operands in ``[0, max_operand)``, reproducible from
    ``seed``. Distinct: a prompt text twice in one step's batch would make its two GRPO groups
    take the rollout's per-request seeds (``hf_server.request_seed``) in arrival order, and two runs
    with the same seed could then train on differently grouped responses."""
    from conduit.errors import ConfigError

    if not 0 <= n <= max_operand * max_operand:
        raise ConfigError(f"arithmetic data: {n} distinct problems asked, {max_operand**2} exist")
    rng = random.Random(seed)
    rows = []
    for i, pair in enumerate(rng.sample(range(max_operand * max_operand), n)):
        a, b = divmod(pair, max_operand)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"index": i, "split": split},
            }
        )
    return rows


def write_dataset(
    out_dir: str | Path, seed: int = 0, n_train: int = 256, n_val: int = 16
) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` under ``out_dir``; return their paths."""
    import pandas as pd

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, val = out / "train.parquet", out / "val.parquet"
    pd.DataFrame(make_rows(n_train, seed, "train")).to_parquet(train)
    pd.DataFrame(make_rows(n_val, seed + 1, "test")).to_parquet(val)
    return train, val
