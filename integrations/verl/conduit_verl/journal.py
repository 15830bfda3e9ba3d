"""The rollout journal: each finished GRPO group of a step, on disk, so a killed trainer keeps it.

Layout under verl's checkpoint dir (``trainer.default_local_dir``)::

    conduit_journal/step_00000007/<writer>.cdj   one append-only file per agent-loop worker and step

A file is a sequence of Conduit records (``conduit.persist.format``: JSON header + raw tensor
bytes, CRC32-checked, no pickle); one record is one group: its stable prompt identity
(:func:`prompt_identity`: dataset index + prompt hash, never verl's per-draw uid), the step it was
drawn for, and every TransferQueue field and tag of each of its trajectories. A record torn by a
kill (the tail of a file) or a flipped byte fails its checksum: :func:`read_step` skips those bytes
with a warning and keeps every intact record before and after them. Journals of steps already
trained into a checkpoint are pruned (:func:`prune`). Each batch's durability lag goes to
``lag.jsonl`` (:func:`append_lag`), bounded to its last ~:data:`LAG_MAX_BYTES` / 2 bytes of lines.
Pure file logic: no verl, no TransferQueue (``journal_worker.py`` writes, ``resume.py`` restores).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from conduit.errors import CheckpointError
from conduit.persist import atomic
from conduit.persist.format import decode, encode, frame
from conduit.persist.journal import Damage, scan

logger = logging.getLogger(__name__)

JOURNAL_DIR = "conduit_journal"
SUFFIX = ".cdj"
KIND = "conduit_verl.group/1"
LAG_FILE = "lag.jsonl"
LAG_MAX_BYTES = 4 << 20  # past this, lag.jsonl is cut to its newest lines (about half of it)


@dataclass
class JournalGroup:
    """One finished prompt group as journaled.

    Args:
        identity: stable prompt identity (:func:`prompt_identity`).
        step: the training step the prompt was drawn for.
        uid: verl's uid of the draw that generated it (informational: a resumed step has new uids).
        suffixes: each trajectory's TransferQueue key after ``<uid>_`` (``<session>_<turn>``).
        samples: each trajectory's fields, as the agent loop wrote them to TransferQueue.
        tags: each trajectory's TransferQueue tags.
        t_done: wall time the group finished generating.
    """

    identity: str
    step: int
    uid: str
    suffixes: list[str]
    samples: list[dict[str, Any]]
    tags: list[dict[str, Any]]
    t_done: float

    def record(self) -> list[bytes | memoryview]:
        """The group as one Conduit record (buffers to write in order)."""
        tensors: list[torch.Tensor] = []
        meta = {
            "kind": KIND,
            "identity": self.identity,
            "step": self.step,
            "uid": self.uid,
            "suffixes": self.suffixes,
            "tags": self.tags,
            "t_done": self.t_done,
            "samples": encode(self.samples, tensors),
        }
        return frame(meta, tensors)

    @classmethod
    def from_record(cls, meta: dict[str, Any], tensors: list[torch.Tensor]) -> JournalGroup:
        """The group a record holds (``CheckpointError`` if it is not one)."""
        if meta.get("kind") != KIND:
            raise CheckpointError(f"not a journaled group (kind {meta.get('kind')!r})")
        try:
            group = cls(
                identity=str(meta["identity"]),
                step=int(meta["step"]),
                uid=str(meta["uid"]),
                suffixes=[str(s) for s in meta["suffixes"]],
                samples=decode(meta["samples"], tensors),
                tags=list(meta["tags"]),
                t_done=float(meta["t_done"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"malformed journaled group ({e})") from e
        if not all(isinstance(t, dict) for t in group.tags) or not isinstance(group.samples, list):
            raise CheckpointError(f"journaled group {group.identity}: tags or samples of the wrong type")
        if not (len(group.suffixes) == len(group.samples) == len(group.tags) > 0):
            raise CheckpointError(
                f"journaled group {group.identity}: {len(group.suffixes)} keys, {len(group.samples)} "
                f"samples, {len(group.tags)} tags"
            )
        return group


def _plain(x: Any) -> Any:
    """``x`` with tensors, numpy arrays and scalars as plain Python (for a stable JSON form)."""
    if isinstance(x, torch.Tensor | np.ndarray):
        return _plain(x.tolist())
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    return x


def prompt_identity(index: Any, raw_prompt: Any) -> str:
    """A prompt's stable identity across draws and restarts: ``"<dataset index>:<prompt hash>"``.

    >>> prompt_identity(3, [{"role": "user", "content": "1+2="}])[:2]
    '3:'
    """
    body = json.dumps(_plain(raw_prompt), sort_keys=True, separators=(",", ":"), default=str)
    return f"{_plain(index)}:{hashlib.sha256(body.encode()).hexdigest()[:16]}"


def journal_root(checkpoint_dir: str | os.PathLike[str]) -> Path:
    """The journal directory under verl's ``trainer.default_local_dir``."""
    return Path(checkpoint_dir).absolute() / JOURNAL_DIR


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{int(step):08d}"


def journaled_steps(root: Path) -> list[int]:
    """Steps with a journal directory, ascending."""
    if not root.is_dir():
        return []
    steps = []
    for entry in root.iterdir():
        name = entry.name
        if entry.is_dir() and name.startswith("step_") and name[5:].isdigit():
            steps.append(int(name[5:]))
    return sorted(steps)


def prune(root: Path, through_step: int, after_step: int | None = None) -> list[int]:
    """Delete the journals of steps ``<= through_step`` (trained into a checkpoint) and, with
    ``after_step``, of steps ``> after_step`` (drawn after the resumed checkpoint's next step: every
    token of theirs came from weights the kill lost); the steps removed."""
    gone = [
        s for s in journaled_steps(root) if s <= through_step or (after_step is not None and s > after_step)
    ]
    for s in gone:
        shutil.rmtree(step_dir(root, s), ignore_errors=True)
    return gone


def read_step(root: Path, step: int) -> tuple[list[JournalGroup], list[str]]:
    """Every intact group journaled for ``step``, and a line per problem found (a torn or corrupt
    stretch, a record that is not a group, a group of another step). Reading resumes after a bad
    stretch at the next intact record, so one bad record loses only itself."""
    groups: list[JournalGroup] = []
    problems: list[str] = []
    directory = step_dir(root, step)
    if not directory.is_dir():
        return groups, problems
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        for entry in scan(bytearray(path.read_bytes()), path.name):
            if isinstance(entry, Damage):
                problems.append(f"{path.name}: {entry.reason}; skipped bytes {entry.start}..{entry.end}")
                continue
            offset, end, meta, tensors = entry
            try:
                group = JournalGroup.from_record(meta, tensors)
            except CheckpointError as e:
                problems.append(f"{path.name}: {e}; skipped bytes {offset}..{end}")
                continue
            if group.step != step:
                problems.append(f"{path.name}: group {group.identity} of step {group.step} ignored")
                continue
            groups.append(group)
    return groups, problems


class JournalWriter:
    """Appends groups to this writer's file of each step; one write + fsync per batch of groups."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.name = f"{os.getpid()}-{uuid.uuid4().hex[:8]}{SUFFIX}"
        self._files: dict[int, Any] = {}

    def _file(self, step: int) -> Any:
        f = self._files.get(step)
        if f is None:
            for old in [s for s in self._files if s < step]:  # a new step: earlier files are done
                self._files.pop(old).close()
            directory = step_dir(self.root, step)
            directory.mkdir(parents=True, exist_ok=True)
            f = open(directory / self.name, "ab")  # noqa: SIM115 (kept open across batches)
            atomic.fsync_dir(directory)  # the new entry survives a machine crash too
            self._files[step] = f
        return f

    def append(self, groups: list[JournalGroup]) -> int:
        """Write ``groups`` (any steps), then flush and fsync each step's file once; the bytes written."""
        n = 0
        for step in sorted({g.step for g in groups}):
            f = self._file(step)
            for group in groups:
                if group.step == step:
                    for part in group.record():
                        f.write(part)
                        n += len(part) if isinstance(part, bytes) else part.nbytes
            f.flush()
            os.fsync(f.fileno())
        return n

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


def match(
    identities: list[str], groups: list[JournalGroup]
) -> tuple[dict[int, JournalGroup], list[JournalGroup]]:
    """Pair the step's prompts (row ``i`` has ``identities[i]``) with journaled groups.

    Each journaled group serves at most one row and each row at most one group (a prompt drawn
    twice in a step needs two groups). Returns ``({row: group}, journaled groups no row took)``.
    """
    pool: dict[str, list[JournalGroup]] = {}
    for group in groups:
        pool.setdefault(group.identity, []).append(group)
    kept: dict[int, JournalGroup] = {}
    for row, identity in enumerate(identities):
        candidates = pool.get(identity)
        if candidates:
            kept[row] = candidates.pop(0)
    unused = [g for gs in pool.values() for g in gs]
    return kept, unused


def append_lag(root: Path, line: dict[str, Any]) -> None:
    """Append one JSON line to ``root/lag.jsonl``; past :data:`LAG_MAX_BYTES` the file is first cut to
    its newest lines (about half), so it stays bounded. Writers on the node serialise on a lock."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / LAG_FILE, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
        if os.fstat(f.fileno()).st_size > LAG_MAX_BYTES:
            f.seek(-(LAG_MAX_BYTES // 2), os.SEEK_END)
            tail = f.read()
            keep = tail[tail.find(b"\n") + 1 :]  # whole lines only
            f.seek(0)
            f.truncate()
            f.write(keep)
        f.write((json.dumps(line) + "\n").encode())
