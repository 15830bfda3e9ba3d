"""What a checkpoint keeps when generation runs ahead (``trainer.v1.conduit.max_staleness >= 1``).

At a checkpoint of step ``s`` the prompts drawn for later steps are already in TransferQueue: some
finished, some pending or running (aborted for partial rollout). verl's async trainers save them
with TransferQueue's own checkpoint, which is pickle (the controller's state and every storage
unit); trainer mode ``conduit`` never writes or reads those files. Instead, before verl writes the
step's folder, it writes the train partition's rows that step ``s`` did not train into
``global_step_<s>/conduit_ahead.cdr``: one Conduit record (JSON header + raw tensor bytes,
CRC-checked, no pickle) holding each prompt row's tag (and, for a pending or running prompt, the
prompt fields verl stored at submission) and each finished group's trajectories, fields and tags.

A resume puts those rows back under their own keys (:func:`restore_rows`). A pending or running
prompt whose group finished after the checkpoint, and was journaled, is put back finished when
every token of it came from weights the checkpoint has (version ``<= s``); a group that used newer
weights (lost with the kill) is generated again. verl's ``_reissue_inflight_prompts`` then re-issues
the prompts still pending; the dataloader, restored past every prompt drawn before the checkpoint,
never draws them again. A damaged file is a :class:`CheckpointError`, never a silent loss.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conduit.errors import CheckpointError
from conduit.persist import atomic
from conduit.persist.format import decode, encode, frame
from conduit.persist.journal import Damage, scan
from conduit_verl.checks import group_of

AHEAD_FILE = "conduit_ahead.cdr"
KIND = "conduit_verl.ahead/1"
FINISHED = "finished"
IN_FLIGHT = ("pending", "running")


@dataclass
class AheadRows:
    """The train partition's rows a checkpoint of ``step`` keeps (``samples[i]`` None: tags only)."""

    step: int
    keys: list[str] = field(default_factory=list)
    tags: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any] | None] = field(default_factory=list)

    def prompts(self, statuses: Iterable[str] | None = None) -> list[str]:
        """The prompt uids kept (with one of ``statuses``, if given)."""
        wanted = None if statuses is None else set(statuses)
        return [
            k
            for k, t in zip(self.keys, self.tags, strict=True)
            if t.get("is_prompt", False) and (wanted is None or t.get("status") in wanted)
        ]

    def record(self) -> list[bytes | memoryview]:
        tensors: list[Any] = []
        meta = {
            "kind": KIND,
            "step": self.step,
            "keys": self.keys,
            "tags": self.tags,
            "samples": encode(self.samples, tensors),
        }
        return frame(meta, tensors)

    @classmethod
    def from_record(cls, meta: dict[str, Any], tensors: list[Any]) -> AheadRows:
        if meta.get("kind") != KIND:
            raise CheckpointError(f"{AHEAD_FILE}: not Conduit's ahead rows (kind {meta.get('kind')!r})")
        try:
            rows = cls(
                step=int(meta["step"]),
                keys=[str(k) for k in meta["keys"]],
                tags=list(meta["tags"]),
                samples=decode(meta["samples"], tensors),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{AHEAD_FILE}: malformed ({e})") from e
        if not (
            isinstance(rows.samples, list)
            and len(rows.keys) == len(rows.tags) == len(rows.samples)
            and all(isinstance(t, dict) for t in rows.tags)
            and all(s is None or isinstance(s, dict) for s in rows.samples)
        ):
            raise CheckpointError(f"{AHEAD_FILE}: keys, tags and samples do not line up")
        return rows


def kept_keys(
    listing: Mapping[str, Mapping[str, Any]], trained_keys: Iterable[str]
) -> tuple[list[str], list[str]]:
    """Of the train partition's ``listing`` (key -> tag), what a checkpoint keeps: the prompt rows of
    every group the step did not train, and the trajectory rows of those that finished. Returns
    ``(prompt uids, trajectory keys)``; a partial trajectory of an unfinished group is not kept (verl
    clears it when it re-issues the prompt)."""
    trained = {group_of(k) for k in trained_keys}
    prompts = [k for k, t in listing.items() if t.get("is_prompt", False) and k not in trained]
    finished = {k for k in prompts if listing[k].get("status") == FINISHED}
    trajectories = sorted(
        k for k, t in listing.items() if not t.get("is_prompt", False) and group_of(k) in finished
    )
    return sorted(prompts), trajectories


def write(folder: Path, rows: AheadRows) -> int:
    """Write ``rows`` to ``folder/conduit_ahead.cdr`` (atomically: a kill leaves the old file or the
    new one); returns the bytes written."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / AHEAD_FILE
    tmp = atomic.temp_sibling(path)
    n = atomic.write_file(tmp, rows.record())
    os.replace(tmp, path)
    atomic.fsync_dir(folder)
    return n


def read(folder: Path) -> AheadRows | None:
    """The rows of ``folder/conduit_ahead.cdr`` (None: no such file); ``CheckpointError`` names any damage."""
    path = folder / AHEAD_FILE
    if not path.exists() and not path.is_symlink():
        return None
    entries = list(scan(atomic.read_regular(path), path.name))
    damage = [e for e in entries if isinstance(e, Damage)]
    if damage or len(entries) != 1:
        detail = damage[0].reason if damage else f"{len(entries)} records, expected 1"
        raise CheckpointError(
            f"{path}: damaged ({detail}); the prompts drawn ahead of this checkpoint cannot be restored. "
            "Resume from an earlier checkpoint (trainer.resume_from_path)."
        )
    _, _, meta, tensors = entries[0]  # type: ignore[misc]
    return AheadRows.from_record(meta, tensors)
