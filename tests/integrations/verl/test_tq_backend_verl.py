"""verl 0.9.1 on Conduit's TransferQueue storage backend (``transfer_queue.backend.storage_backend=Conduit``).

One real GRPO iteration of the CPU harness in the ``conduit`` trainer mode (≈50-60 s on an idle 2-core
machine, most of it Ray/verl start-up): it trains, and verl's experience went through Conduit's storage
actors (their counters, recorded when verl closes TransferQueue, are in the run's ``summary.json``).
The slow ``test_equivalence.py`` checks that the values are the same as on verl's SimpleStorage.

The run is slow; the default suite checks its parts fast: the backend registers with TransferQueue
(``test_plugins.py``) and resolves in verl's config (``test_megatron_compose.py``), verl's fields go
through TQ's client into the storage actor and same-node readers map them
(``test_tq_store_ray.py``), a field placed on the host tier is read by copy and the actor reports each
field's tier (``test_tq_direct_put_ray.py``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")
pytest.importorskip("conduit_verl_cpu")  # the CPU harness: pip install --no-deps -e tools/verl_cpu

from conduit_verl.tq_store.columns import field_of  # noqa: E402
from conduit_verl_cpu.metrics import read_metrics  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from verl_cpu_run import run_harness  # noqa: E402

from conduit import Ragged  # noqa: E402
from conduit.buffer.columns import JAGGED, Column  # noqa: E402


def test_jagged_field_pads_to_longest_row() -> None:
    """verl pads what TQ returns (``TensorDict.to_padded_tensor``) and masks it with a padded
    ``response_mask``: the width must be the longest row, as with TQ's own ``as_nested_tensor``,
    not the batch's token count (what a nested tensor without its max length pads to)."""
    lengths = [5, 16, 3, 1]
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    mine = field_of(Column(JAGGED, Ragged(torch.arange(int(offsets[-1])), offsets)))
    tq_own = torch.nested.as_nested_tensor([torch.arange(n) for n in lengths], layout=torch.jagged)
    padded = TensorDict({"mine": mine, "tq": tq_own}, batch_size=[4]).to_padded_tensor()
    assert padded["mine"].shape == padded["tq"].shape == (4, 16)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(300)
def test_conduit_mode_on_conduit_backend(tmp_path: Path) -> None:
    work = tmp_path / "run"
    # the default backend in conduit mode; one field on a non-mapped tier (read by copy)
    args = ("--trainer-mode", "conduit", "--steps", "1", "--tq-placement", "old_log_probs=host")
    proc, tail = run_harness(work, *args, timeout=280)

    rows = read_metrics(work / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1], tail
    assert math.isfinite(rows[0]["actor/pg_loss"]) and rows[0]["actor/grad_norm"] > 0, rows

    summary = json.loads((work / "summary.json").read_text())
    assert summary["tq_backend"] == summary["tq_backend_ran"] == "Conduit", summary
    store = summary["tq_store"]
    assert store["bytes_put"] > 0 and store["puts"] > 0, store
    assert store["bytes_get_mapped"] > 0, store  # same-node readers mapped the shm fields
    assert store["bytes_get_copied"] > 0, store  # old_log_probs lives on the host tier: copied out
    (node,) = summary["tq_store_nodes"]  # one node: one storage actor
    assert node["fields"]["old_log_probs"]["tier"] == "host", node["fields"]
    assert node["fields"]["responses"]["tier"] == "shm", node["fields"]
    assert "TransferQueue storage backend Conduit" in proc.stdout, tail
