"""``placement_ablation.py``'s two workloads, each built on a given placement: a DQN prioritized
replay buffer (RLlib's shape) and verl's GRPO fields in the TransferQueue backend's node store; each
setup returns one iteration to time. And the simulated budgets of the placement benchmarks
(:func:`budgeted`, ``migration.py`` too)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(1, str(HERE.parent / "integrations" / "verl"))

from conduit import Column, Schema  # noqa: E402
from conduit.batch import ColumnBatch  # noqa: E402
from conduit.build_buffer import build_buffer  # noqa: E402
from conduit.config import BufferConfig  # noqa: E402
from conduit.placement import Access, Field  # noqa: E402
from conduit.placer import Traffic, column_fields  # noqa: E402
from conduit.topology import Tier, Topology  # noqa: E402


def budgeted(topology: Topology, **capacity: int) -> Topology:
    """``topology`` with the capacity of each tier kind named (``host=``, ``shm=``: bytes) replaced by a
    simulated budget (a stand-in for GPU memory left after the model)."""
    tiers = tuple(
        Tier(t.name, t.kind, t.node, capacity.get(t.kind, t.capacity_bytes), t.device) for t in topology.tiers
    )
    budgets = ", ".join(f"{k}={v}" for k, v in capacity.items())
    return Topology(tiers, topology.links, f"{topology.source}; simulated budgets {budgets} bytes")


#: how many times verl's stages read each field per step (old log-prob, ref, update for the inputs)
GRPO_READS = {"responses": 3, "input_ids": 3, "attention_mask": 3, "old_log_probs": 1, "ref_log_prob": 1,
              "advantages": 1}  # fmt: skip


GRPO_DTYPES = {"responses": torch.int64, "input_ids": torch.int64, "attention_mask": torch.int64,
               "old_log_probs": torch.float32, "ref_log_prob": torch.float32, "advantages": torch.float32}  # fmt: skip


def dqn_schema(dim: int) -> Schema:
    return Schema(
        [
            Column("obs", torch.float32, (dim,)),
            Column("next_obs", torch.float32, (dim,)),
            Column("action", torch.int64),
            Column("reward", torch.float32),
            Column("done", torch.bool),
        ]
    )


def dqn_iteration(buf: Any, frag: ColumnBatch, device: str) -> Callable[[], None]:
    def step() -> None:
        buf.extend(frag)
        s = buf.sample(256)
        for col in s.batch.columns.values():  # the learner's copy onto its device
            col.to(device, non_blocking=True)  # type: ignore[union-attr]
        if device != "cpu":
            torch.cuda.synchronize()
        buf.update_priorities(s.slots, s.generations, torch.rand(256) + 0.1)

    return step


def learner_device() -> str:
    """Where the DQN learner computes: ``cuda:0`` on a GPU machine, else the host."""
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def dqn_setup(dim: int, capacity: int, tiers: dict[str, str]) -> Callable[[], None]:
    buf = build_buffer(
        BufferConfig(capacity=capacity, tier="host", pins=tiers, sampler="prioritized"), dqn_schema(dim)
    )
    n = 32
    frag = ColumnBatch(
        {
            "obs": torch.randn(n, dim),
            "next_obs": torch.randn(n, dim),
            "action": torch.randint(0, 2, (n,)),
            "reward": torch.randn(n),
            "done": torch.zeros(n, dtype=torch.bool),
        }
    )
    for _ in range(capacity // n):  # fill: steady state, every slot written
        buf.extend(frag)
    return dqn_iteration(buf, frag, learner_device())


def dqn_fields(dim: int, capacity: int, usable: dict[str, str]) -> list[Field]:
    reader = "host" if learner_device() == "cpu" else learner_device()
    return column_fields(dqn_schema(dim), capacity, Traffic(32, 256, readers=(reader,)), usable)


def grpo_fields(tokens: int, samples: int, usable: dict[str, str]) -> list[Field]:
    """A field per verl field: one step's bytes, written once from host, read by a reader mapping shm."""
    out = []
    for name, dtype in GRPO_DTYPES.items():
        nbytes = samples * tokens * torch.empty((), dtype=dtype).element_size()
        out.append(
            Field(name, nbytes, 1, (Access(usable["host"], 1),), (Access(usable["shm"], GRPO_READS[name]),))
        )
    return out


def grpo_setup(tokens: int, samples: int, tiers: dict[str, str]) -> Callable[[], None]:
    from conduit_verl.tq_store.columns import column_of
    from conduit_verl.tq_store.store import NodeStore

    from conduit.buffer.columns import from_wire, to_wire
    from conduit.buffer.keyed_client import as_layout as _layout
    from conduit.buffer.mapped import read_mapped

    store = NodeStore(placement=dict(tiers), default_tier="shm")
    gis = np.arange(samples)
    offsets = torch.arange(0, (samples + 1) * tokens, tokens)
    wires = {}
    for name, dtype in GRPO_DTYPES.items():
        values = torch.randint(0, 1000, (samples * tokens,)).to(dtype)
        nt = torch.nested.nested_tensor_from_jagged(values, offsets)
        wires[name] = to_wire(column_of(name, nt))

    def step() -> None:
        store.put(gis, wires)
        for name, reads in GRPO_READS.items():
            for _ in range(reads):
                entry = store.read_plan(gis, [name], same_node=True)[name]
                if entry[0] == "mapped":
                    _, kind, layout, lengths, rows = entry
                    read_mapped(
                        _layout(layout),
                        torch.from_numpy(rows),
                        None if lengths is None else torch.from_numpy(np.array(lengths, copy=True)),
                    )
                else:
                    from_wire(entry, writable=True)

    return step
