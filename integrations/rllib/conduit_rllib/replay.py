"""DQN's replay path on Conduit: one Conduit per module, fed with episode chunks, read as train batches."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch

from conduit import (
    BufferConfig,
    Column,
    ColumnBatch,
    Conduit,
    Delivery,
    Metrics,
    Operator,
    SchedulerConfig,
    Schema,
)
from conduit.costmodel import OperatorCost
from conduit_rllib.common import FRAMES, ModuleConduits
from conduit_rllib.dqn_tuning import DQNTuning, probe_costs
from conduit_rllib.errors import FrameFormatError
from conduit_rllib.fragments import TransitionPacker, by_module
from conduit_rllib.frame_packer import FramePacker, frame_capacity, frame_ingest_operator
from conduit_rllib.frames import frame_stack_operator
from conduit_rllib.nstep import nstep_operator
from conduit_rllib.settings import ConduitSettings
from conduit_rllib.train_batch import LearnerInput, learner_input, to_sample_batch


def _transition_columns(obs_dtype: torch.dtype, obs_shape: tuple[int, ...], next_obs: str) -> list[Column]:
    """The columns both schemas share: observation, next observation (named ``next_obs``), action,
    reward, end of episode."""
    return [
        Column("obs", obs_dtype, obs_shape),
        Column(next_obs, obs_dtype, obs_shape),
        Column("actions", torch.int64),
        Column("rewards", torch.float32),
        Column("terminateds", torch.bool),
    ]


def step_schema(obs_dtype: torch.dtype, obs_shape: tuple[int, ...]) -> Schema:
    """What ``put`` takes: flat step rows (see ``TransitionPacker``)."""
    columns = _transition_columns(obs_dtype, obs_shape, "next_obs")
    return Schema([*columns, Column("seg_end", torch.int64), Column("emit", torch.bool)])


def transition_schema(obs_dtype: torch.dtype, obs_shape: tuple[int, ...]) -> Schema:
    """What the buffer stores: DQN's train-batch columns under RLlib's names."""
    return Schema([*_transition_columns(obs_dtype, obs_shape, "new_obs"), Column("n_step", torch.float32)])


ROW_BOOKKEEPING = 32  # bytes per transition beside its row: generation, version, priority tree


class ConduitReplay(ModuleConduits):
    """Replaces RLlib's episode replay buffer, sampling and learner connector for DQN.

    Under ``overlap="auto"`` it starts on the tuner's probe settings and moves its buffers to new
    Conduits (``reconfigure``) when the tuner switches (``dqn_tuning.py``, driven by ``end_step``).

    Args:
        buffer: capacity, sampler, alpha, beta.
        n_step, gamma: DQN's n-step target settings, applied once per transition at ingestion.
        frame_stack: RLlib's ``FrameStacking(num_frames=...)`` learner piece, if the config has one: each
            frame is then stored once (``frames.py``) and stacks are built at delivery. Under async
            overlap a fragment's frames are encoded and appended on the ingestion worker, before the
            rows that reference them (``frame_packer.py``); ``add`` only hands them over.
        settings, device, num_learners, seed: as :class:`~conduit_rllib.common.ModuleConduits`.
    """

    def __init__(
        self,
        settings: ConduitSettings,
        buffer: BufferConfig,
        n_step: int,
        gamma: float,
        device: torch.device | str,
        num_learners: int,
        seed: int | None,
        frame_stack: int | None = None,
    ) -> None:
        super().__init__(settings, device, num_learners, seed)
        self.frame_stack = frame_stack
        self.buffer_config = dataclasses.replace(buffer, pins=settings.pins) if settings.pins else buffer
        if settings.memory_budget is not None or settings.disk_path is not None:
            self.buffer_config = dataclasses.replace(
                self.buffer_config, memory_budget=settings.memory_budget, disk_path=settings.disk_path
            )
        self.n_step, self.gamma = n_step, gamma
        self.packers: dict[str, TransitionPacker] = {}  # FramePacker under frame_stack
        self.obs_specs: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
        self._ones: dict[tuple[str, int], torch.Tensor] = {}
        self.tuning = DQNTuning(settings) if settings.overlap == "auto" else None
        if self.tuning is not None:
            self.settings = self.tuning.probe
        self.stage_steps = self.settings.stage_steps_for("dqn")
        self._last_put: dict[str, ColumnBatch] = {}
        self._prios: dict[str, list[tuple[Delivery, np.ndarray]]] = {}
        self._prio_calls = 0
        self._version = 0
        self._ready = False

    # -- ingestion -------------------------------------------------------------------------------

    def _conduit(self, mid: str, obs_dtype: torch.dtype, obs_shape: tuple[int, ...]) -> Conduit:
        c = self.conduits.get(mid)
        if c is None:
            self.obs_specs[mid] = (obs_dtype, obs_shape)
            c = Conduit(
                step_schema(obs_dtype, obs_shape),
                self.buffer_config,
                self.settings.scheduler(algo="dqn"),
                ingest=[*self._frame_ops(mid), nstep_operator(self.n_step, self.gamma)],
                deliver=self._deliver_ops(mid),
                device=self.device,
                ranks=self.ranks,
                stored_schema=transition_schema(obs_dtype, obs_shape),
                seed=None if self.seed is None else self.seed + len(self.conduits),
                metrics=self.metrics,
            )
            self.conduits[mid] = c
        return c

    def _new_packer(self) -> TransitionPacker:
        if self.frame_stack is None:
            return TransitionPacker(self.n_step)
        cfg = self.buffer_config
        capacity = frame_capacity(cfg.capacity, self.n_step, self.frame_stack)
        budget = cfg.memory_budget
        if budget is not None:  # the transition rows (frame references) first, the frames get the rest
            rows = transition_schema(torch.int64, (self.frame_stack,)).nbytes_per_item + ROW_BOOKKEEPING
            budget = max(0, budget - rows * cfg.capacity)
        return FramePacker(
            self.n_step,
            self.frame_stack,
            capacity,
            memory_budget=budget,
            disk_path=cfg.disk_path,
            deferred=self._frames_deferred(),
        )

    def _frames_deferred(self) -> bool:
        """Whether frames are encoded and appended on the ingestion worker (async overlap) rather than
        while ``add`` stages them (sync: each transition sampleable in the step that collected it)."""
        return self.settings.scheduler(algo="dqn").overlap == "async"

    def _frame_ops(self, mid: str) -> list[Operator]:
        """The frame store's ingestion operator (frame stacking), else none: the frames ``add`` queued are
        stored before the rows that reference them go on (``frame_packer.frame_ingest_operator``)."""
        packer = self.packers.get(mid)
        return [frame_ingest_operator(mid, packer)] if isinstance(packer, FramePacker) else []

    def _deliver_ops(self, mid: str) -> list[Operator]:
        """Frame stacking (frame-once storage: ``obs`` / ``new_obs`` are frame references), else none."""
        packer = self.packers.get(mid)
        if not isinstance(packer, FramePacker):
            return []
        assert packer.store is not None  # built with the first chunk, before the first put
        return [frame_stack_operator(packer.store)]

    def add(self, episodes: list[Any], version: int) -> int:
        """Stage every module's steps from ``episodes``; put them once ``stage_steps`` are staged.

        Sync mode puts on every call (``stage_steps`` 1), so a transition can be sampled in the
        training step that collected it, as in RLlib. Returns the env steps seen.
        """
        with self.metrics.span("rllib/add", exposed=True):
            steps = 0
            for mid, chunks in by_module(episodes).items():
                packer = self.packers.get(mid)
                if packer is None:
                    packer = self.packers[mid] = self._new_packer()
                steps += packer.stage(chunks)
                if packer.staged >= self.stage_steps:
                    self._put(mid, packer, version)
            self._version = version
            return steps

    def _put(self, mid: str, packer: TransitionPacker, version: int) -> None:
        batch = packer.pack()
        if batch is not None:
            if bool(batch["emit"].any()):  # the calibration probe's rows (auto): some transitions in them
                self._last_put[mid] = batch
            obs = batch["obs"]
            self._conduit(mid, obs.dtype, tuple(obs.shape[1:])).put(batch, version=version)

    def flush(self) -> None:
        """Put everything staged and send every queued priority update."""
        for mid, packer in sorted(self.packers.items()):
            if packer.staged:
                self._put(mid, packer, self._version)
        self._send_priorities()

    def settle(self) -> None:
        """:meth:`flush`, then wait until everything put is in the buffers and every frame handed out is in
        its frame store (async: a deferred add's frames of steps still held back for n-step have no put
        yet; they are stored here, on the calling thread, once the ingestion worker is idle).

        Raises:
            FrameFormatError: frames the codec refused (their rows are refused too, when put).
        """
        self.flush()
        for c in self.conduits.values():
            c.flush()
        for mid, packer in sorted(self.packers.items()):
            if isinstance(packer, FramePacker):
                refused = packer.store_pending()
                if refused is not None:
                    raise FrameFormatError(f"module {mid!r}: frames could not be stored: {refused}")

    # -- delivery --------------------------------------------------------------------------------

    def ready(self) -> bool:
        """Whether every module has at least one stored transition (async: after a flush)."""
        if self._ready:
            return True
        self.flush()
        if not self.conduits:
            return False
        for c in self.conduits.values():
            c.flush()
        self._ready = all(c.buffer.inserted > 0 for c in self.conduits.values())
        return self._ready

    def sample(self, batch_size: int) -> LearnerInput:
        """One train batch of ``batch_size`` transitions per module, already on the learner device."""
        with self.metrics.span("rllib/sample", exposed=True):
            ranks = self.ranks
            per_rank: list[dict[str, Any]] = [{} for _ in range(ranks)]
            deliveries = {}
            for mid, c in self.conduits.items():
                if not c.buffer.inserted and not self._fill(mid, c):
                    continue  # a module whose first transitions are still held back for n-step
                d = c.get(batch_size)
                deliveries[mid] = d
                for r, part in enumerate(d.parts):  # each rank's part carries its own weights
                    weights = part.weights if part.weights is not None else self._ones_for(mid, part.size)
                    per_rank[r][mid] = to_sample_batch(part.batch, {"weights": weights})
            kwargs = learner_input(per_rank, batch_size, remote=self.num_learners > 0)
            return LearnerInput(kwargs, deliveries)

    def _fill(self, mid: str, c: Conduit) -> bool:
        """Put ``mid``'s staged steps and wait for them (a module that appeared after the first batch)."""
        packer = self.packers.get(mid)
        if packer is not None and packer.staged:
            self._put(mid, packer, self._version)
        c.flush()
        return c.buffer.inserted > 0

    def _ones_for(self, mid: str, n: int) -> torch.Tensor:
        key = (mid, n)
        if key not in self._ones:
            self._ones[key] = torch.ones(n, dtype=torch.float32, device=self.device)
        return self._ones[key]

    def update_priorities(self, batch: LearnerInput, td_errors: dict[str, np.ndarray]) -> None:
        """Priorities ``|td|`` go back to the items of the batch they were computed on.

        Sync: applied now. Async: queued and sent every ``stage_steps`` updates as one update.
        """
        if self.buffer_config.sampler != "prioritized":
            return
        with self.metrics.span("rllib/update_priorities", exposed=True):
            for mid, d in batch.deliveries.items():
                td = td_errors.get(mid)
                if td is not None:
                    self._prios.setdefault(mid, []).append((d, td))
            self._prio_calls += 1
            if self._prio_calls >= self.stage_steps:
                self._send_priorities()

    def _send_priorities(self) -> None:
        self._prio_calls = 0
        for mid, pending in self._prios.items():
            if not pending:
                continue
            slots = torch.cat([d.slots for d, _ in pending])
            gens = torch.cat([d.generations for d, _ in pending])
            prio = torch.from_numpy(
                np.concatenate([np.asarray(t, np.float32).reshape(-1) for _, t in pending])
            )
            pending.clear()
            self.conduits[mid].update_priorities_at(slots, gens, prio)

    # -- auto-tuning (overlap="auto") -------------------------------------------------------------

    def end_step(
        self, producer_s: float, consumer_s: float, env_steps: int, updates: int, batch_size: int
    ) -> None:
        """A learning step ended (seconds sampling and learning); under ``auto``, maybe switch knobs."""
        if self.tuning is None or not self._last_put:
            return
        mid = sorted(self._last_put)[0]

        def calibrate() -> tuple[OperatorCost, OperatorCost, int, int]:
            rows = self._last_put[mid]
            ingest, deliver = probe_costs(lambda g: self._scratch(mid, g), rows, batch_size)
            return ingest, deliver, batch_size, round(rows.nbytes / rows.size)

        chosen = self.tuning.end_step(producer_s, consumer_s, env_steps, updates, calibrate)
        if chosen is not None and chosen != self.settings:
            t0 = time.perf_counter()
            self.reconfigure(chosen)
            self.tuning.switched(time.perf_counter() - t0)

    def _scratch(self, mid: str, g_del: int) -> Conduit:
        """A throw-away sync Conduit shaped like ``mid``'s, for the calibration probe."""
        dtype, shape = self.obs_specs[mid]
        return Conduit(
            step_schema(dtype, shape),
            dataclasses.replace(self.buffer_config, capacity=4096, capacity_bytes=None, journal=None),
            SchedulerConfig("sync", depth=max(2, g_del), g_del=g_del),
            ingest=[nstep_operator(self.n_step, self.gamma)],
            deliver=self._deliver_ops(mid),
            device=self.device,
            ranks=self.ranks,
            stored_schema=transition_schema(dtype, shape),
            metrics=Metrics(trace=False),
        )

    def reconfigure(self, settings: ConduitSettings) -> None:
        """Run on under ``settings``: every module's buffer moves to new Conduits through ``state_dict``."""
        state = self.state_dict()
        self.close()
        self.conduits = {}
        self.settings, self.stage_steps = settings, settings.stage_steps_for("dqn")
        self.load_state_dict(state)  # the packers kept take the new settings' frame ingestion

    # -- bookkeeping -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        self.settle()
        return {
            "obs_specs": dict(self.obs_specs),
            "conduits": {mid: c.state_dict() for mid, c in self.conduits.items()},
            "packers": {mid: p.state_dict() for mid, p in self.packers.items()},
        }

    def disk_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(state, buffers)`` for an on-disk checkpoint (``save_tree``): ``state`` without the buffers'
        contents, and each buffer to checkpoint by name: the Conduits by module id, the frame stores as
        ``FRAMES + module id`` (incremental: ``frames_linked``)."""
        self.settle()
        packers: dict[str, Any] = {}
        buffers: dict[str, Any] = dict(self.conduits)
        for mid, p in self.packers.items():
            if isinstance(p, FramePacker):
                packers[mid] = p.state_dict(frames=False)
                if p.store is not None:
                    buffers[FRAMES + mid] = p.store.buffer
            else:
                packers[mid] = p.state_dict()
        state = {"obs_specs": dict(self.obs_specs), "conduits": {}, "packers": packers}
        return state, buffers

    def buffer_named(self, name: str) -> Any:
        """The buffer :meth:`disk_state` saved under ``name`` (built by :meth:`load_state_dict` first)."""
        if name.startswith(FRAMES):
            packer = self.packers[name.removeprefix(FRAMES)]
            assert isinstance(packer, FramePacker) and packer.store is not None
            return packer.store.buffer
        return self.conduits[name]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        conduits = state["conduits"]
        saved = set(conduits)  # names only: an on-disk mapping reads a buffer when it is asked for
        for mid, ps in state["packers"].items():  # first: a Conduit's delivery reads its packer's frames
            packer = self.packers.setdefault(mid, self._new_packer())
            packer.load_state_dict(ps)
            if isinstance(packer, FramePacker):
                packer.deferred = self._frames_deferred()
            if isinstance(packer, FramePacker) and packer.store is not None and FRAMES + mid in saved:
                packer.store.load_state_dict(conduits[FRAMES + mid]["buffer"])  # saved apart (disk_state)
        for mid, (dtype, shape) in state["obs_specs"].items():
            self._conduit(mid, dtype, shape).load_state_dict(conduits[mid])
