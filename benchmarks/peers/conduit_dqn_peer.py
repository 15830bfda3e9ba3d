"""Conduit doing the RLlib cell's work: a finished episode in, a DQN train batch out.

RLlib's cell (``rllib_peer``) takes one finished ``SingleAgentEpisode`` of ``B`` steps in (insert) and
delivers, per update, a ``MultiAgentBatch`` of torch tensors — obs, new_obs, actions, rewards,
terminateds, truncateds, n_step, weights — plus a priority update (sample). ``ConduitDQNSystem`` does
the same on Conduit's ``ExperienceBuffer``, the way ``conduit_rllib.replay`` does it: insert = the
episode through ``TransitionPacker`` and the n-step operator (n = 1) into the buffer; sample = one
``sample(out=...)`` of the transition columns, the importance weights (ones when uniform) →
``SampleBatch`` → ``MultiAgentBatch`` (+ priority update). Its columns have the names and dtypes of
RLlib's train batch, so the two work records are equal and the ratio is computed; Conduit's
one-column ``obs`` cell against RLlib is refused (unequal work).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

import torch
from harness import ALPHA, BETA, Cell, prefill
from rllib_peer import GAMMA, N_PRIORITY_SETS, DQNCellSystem, _episode

from conduit.build_buffer import build_buffer

MODULE = "default_policy"


def _schema(dim: int) -> Any:
    from conduit import Column, Schema

    return Schema(
        [
            Column("obs", torch.float32, (dim,)),
            Column("new_obs", torch.float32, (dim,)),
            Column("actions", torch.int64),
            Column("rewards", torch.float32),
            Column("terminateds", torch.bool),
            Column("truncateds", torch.bool),
            Column("n_step", torch.int64),
        ]
    )


def _random_transitions(n: int, dim: int) -> Any:
    from conduit import ColumnBatch

    return ColumnBatch(
        {
            "obs": torch.randn(n, dim),
            "new_obs": torch.randn(n, dim),
            "actions": torch.randint(0, 2, (n,)),
            "rewards": torch.randn(n),
            "terminateds": torch.rand(n) < 0.005,
            "truncateds": torch.zeros(n, dtype=torch.bool),
            "n_step": torch.ones(n, dtype=torch.int64),
        }
    )


class ConduitDQNSystem(DQNCellSystem):
    """A full Conduit buffer of DQN transitions under RLlib's train-batch names, on the RLlib cells."""

    name = "conduit_dqn"

    def __init__(self, dims: Iterable[int], batches: Iterable[int]) -> None:
        super().__init__(dims, batches, seed=1)

    def open(self, sampler: str, dim: int, capacity: int) -> None:
        from conduit import BufferConfig

        cfg = BufferConfig(capacity=capacity, sampler=sampler, alpha=ALPHA, beta=BETA)
        self._buf = build_buffer(cfg, _schema(dim))
        prefill(lambda n: self._buf.extend(_random_transitions(n, dim)), capacity)

    def step_fn(self, cell: Cell) -> Callable[[], object]:
        if cell.op == "insert":
            return _insert_fn(self._buf, _episode(cell.batch, cell.dim, self._rng))
        return _sample_fn(self._buf, cell.batch, cell.sampler == "prioritized")


def _insert_fn(buf: Any, template: Any) -> Callable[[], Any]:
    from conduit_rllib.fragments import TransitionPacker
    from conduit_rllib.nstep import nstep_transitions

    from conduit import ColumnBatch

    packer = TransitionPacker(1)

    def step() -> Any:
        template.id_ = uuid.uuid4().hex  # a new episode each call, as in RLlib's cell
        t = nstep_transitions(packer.pack([template]), 1, GAMMA)
        n = t.size
        cols = dict(t.columns)
        cols["truncateds"] = torch.zeros(n, dtype=torch.bool)
        cols["n_step"] = cols["n_step"].to(torch.int64)
        buf.extend(ColumnBatch.trusted(cols, n))
        return template

    return step


def _sample_fn(buf: Any, batch: int, prioritized: bool) -> Callable[[], Any]:
    from conduit_rllib.compat import MultiAgentBatch
    from conduit_rllib.train_batch import to_sample_batch

    prio_sets = [torch.rand(batch) * 2 + 1e-3 for _ in range(N_PRIORITY_SETS)]
    ones = torch.ones(batch, dtype=torch.float32)
    out = [buf.sample(batch).batch]
    k = [0]

    def step() -> Any:
        s = buf.sample(batch, out=out[0])
        out[0] = s.batch
        weights = s.weights if s.weights is not None else ones
        mab = MultiAgentBatch({MODULE: to_sample_batch(s.batch, {"weights": weights})}, env_steps=batch)
        if prioritized:
            buf.update_priorities(s.slots, s.generations, prio_sets[k[0] % N_PRIORITY_SETS])
            k[0] += 1
        return mab

    return step
