"""Resume after a kill: the interrupted step's journaled groups go back into TransferQueue as finished.

verl's resume restores the checkpoint of step ``k-1`` (weights, optimizer, dataloader), so the
dataloader redraws step ``k``'s prompts, with fresh uids, and verl generates them all again. Here,
when the trainer submits step ``k``'s prompts (:func:`submit_with_journal`), each prompt is
matched by its stable identity (dataset index + prompt hash, ``journal.prompt_identity``) with
the groups journaled for step ``k``; a matched prompt's trajectories are put back into
TransferQueue under its new uid (every field and tag as the agent loop wrote them) and its
prompt tag set ``finished``, and only the other prompts are sent to generation. Journals of
older steps (already trained into the checkpoint) are pruned; a torn or corrupt record is skipped with
a warning. Each prompt is either restored or generated, never both, never neither.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from conduit_verl.ahead import FINISHED, IN_FLIGHT, AheadRows, kept_keys
from conduit_verl.compat import _TRAINER, Seam, attribute_seam, check_seams, method_seam, tq
from conduit_verl.journal import JournalGroup, journaled_steps, match, prompt_identity, prune, read_step

logger = logging.getLogger(__name__)

#: what the resume needs from verl beyond ``compat.SEAMS`` (checked on import, like those)
RESUME_SEAMS = (
    method_seam("_submit_batch_to_rollout", "batch"),
    method_seam("_save_checkpoint"),
    method_seam("_load_checkpoint"),
    method_seam("step", "metrics", "timing_raw"),
    Seam(
        "trainer method `_save_checkpoint` checkpointing TransferQueue only when `trainer_mode` is not sync",
        _TRAINER,
        "PPOTrainer._save_checkpoint",
        source='if self.trainer_mode != "sync":',
    ),
    Seam(
        "trainer method `_reissue_inflight_prompts` (pending and running prompts re-issued at resume)",
        _TRAINER,
        "PPOTrainer._reissue_inflight_prompts",
        source='tag.get("status") in ("pending", "running")',
    ),
    attribute_seam("_restored_tq_prompt_count"),
    method_seam("prepare_step"),
    Seam(
        "function `list_of_dict_to_tensordict`",
        "verl.utils.tensordict_utils",
        "list_of_dict_to_tensordict",
        ("list_of_dicts",),
    ),
    Seam("TransferQueue function `async_kv_list`", "transfer_queue", "async_kv_list", ("partition_id",)),
    Seam(
        "TransferQueue function `async_kv_batch_get`",
        "transfer_queue",
        "async_kv_batch_get",
        ("keys", "partition_id"),
    ),
)
check_seams(RESUME_SEAMS)


@dataclass
class RestoreReport:
    """What one step's submission took from the journal."""

    step: int
    restored: int = 0  # prompt groups put back as finished (not generated)
    generated: int = 0  # prompt groups sent to generation
    restored_identities: list[str] = field(default_factory=list)
    unused: int = 0  # journaled groups of this step no prompt of the step took
    newer_weights: int = 0  # journaled groups generated with weights newer than the resumed checkpoint's
    problems: list[str] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        return {
            "conduit/journal_restored_groups": float(self.restored),
            "conduit/journal_generated_groups": float(self.generated),
            "conduit/journal_regenerated_newer_weights": float(self.newer_weights),
        }


def batch_identities(batch: Any) -> list[str]:
    """The stable identity of each prompt of a dataloader batch (verl's TensorDict)."""
    n = len(batch)
    index = batch["index"] if "index" in batch.keys() else [None] * n
    raw = batch.get("raw_prompt", None)
    if raw is None:  # identity by dataset index alone
        prompts: list[Any] = [None] * n
    else:
        prompts = raw.tolist() if hasattr(raw, "tolist") else list(raw)
    return [prompt_identity(index[i], prompts[i]) for i in range(n)]


def _restore(groups: dict[int, JournalGroup], uids: list[str], step: int) -> None:
    """Put the matched groups' trajectories back under the rows' new uids; mark the prompts finished."""
    keys: list[str] = []
    samples: list[dict[str, Any]] = []
    tags: list[dict[str, Any]] = []
    for row, group in groups.items():
        uid = uids[row]
        for suffix, sample, tag in zip(group.suffixes, group.samples, group.tags, strict=True):
            keys.append(f"{uid}_{suffix}")
            samples.append({**sample, "uid": uid} if "uid" in sample else dict(sample))
            tags.append(dict(tag))
    _put_rows(keys, tags, samples)  # one put per field set: verl's tensordict takes the first row's keys
    prompt_uids = [uids[row] for row in groups]
    prompt_tags = [{"is_prompt": True, "status": "finished", "global_steps": step} for _ in prompt_uids]
    tq.kv_batch_put(keys=prompt_uids, partition_id="train", tags=prompt_tags)


def prune_on_start(root: Path, step: int, resume_mode: str) -> list[int]:
    """Before the first step of a process: drop the journals of steps before ``step`` (trained into
    the checkpoint it resumed from) and after it (drawn ahead after that step, with weights the kill
    lost: ``max_staleness >= 1``), or every journal when verl does not resume
    (``trainer.resume_mode=disable``: a fresh run must not take an earlier run's groups)."""
    if resume_mode == "disable":
        return prune(root, max([step, *journaled_steps(root)]))
    return prune(root, step - 1, after_step=step)


def usable_at(groups: list[JournalGroup], version: int | None) -> tuple[list[JournalGroup], int]:
    """``groups`` without those any of whose tokens came from weights newer than ``version`` (None:
    keep all), and how many those were."""
    if version is None:
        return groups, 0
    from conduit_verl.staleness import group_versions

    kept = []
    for group in groups:
        keys = [f"{group.uid}_{s}" for s in group.suffixes]
        (versions,) = group_versions(keys, group.tags).values()
        if versions.generated_max <= version:
            kept.append(group)
    return kept, len(groups) - len(kept)


def submit_with_journal(
    root: Path,
    step: int,
    batch: Any,
    generate: Callable[[Any], int],
    channel: Any = None,
    max_version: int | None = None,
) -> RestoreReport:
    """Submit step ``step``'s prompt ``batch``: journaled groups restored, the rest ``generate``-d.

    ``generate`` is verl's ``_submit_batch_to_rollout``; ``channel`` the completion channel
    (told once per restored group, so the streaming wait counts them); ``max_version``, after a
    resume, the version of the checkpoint's weights: a journaled group any of whose tokens came
    from newer weights (lost with the kill) is generated again.
    """
    report = RestoreReport(step)
    journaled, report.problems = read_step(root, step)
    for problem in report.problems:
        logger.warning("conduit journal, step %d: %s", step, problem)
    journaled, report.newer_weights = usable_at(journaled, max_version)
    if not journaled:
        report.generated = generate(batch)
        return report
    kept, unused = match(batch_identities(batch), journaled)
    report.unused = len(unused)
    if unused:
        logger.warning(
            "conduit journal, step %d: %d journaled group(s) match no prompt of the step (ignored): %s",
            step,
            len(unused),
            ", ".join(g.identity for g in unused[:5]),
        )
    if kept:
        _restore(kept, [str(u) for u in batch["uid"]], step)
        report.restored = len(kept)
        report.restored_identities = [g.identity for g in kept.values()]
    rest = [i for i in range(len(batch)) if i not in kept]
    if rest:
        report.generated = generate(batch[torch.tensor(rest)])
    if channel is not None:
        for _ in kept:
            channel.finished.remote("train")
    logger.warning(
        "conduit journal: step %d resumed with %d prompt group(s) restored from the journal, %d generated",
        step,
        report.restored,
        report.generated,
    )
    return report


# -- max_staleness >= 1: the rows a checkpoint keeps of the prompts drawn ahead (``ahead.py``) --------


def snapshot_ahead(step: int, trained_keys: list[str]) -> AheadRows:
    """The train partition's rows step ``step`` did not train, read from TransferQueue: every such
    prompt's tag (with its prompt fields if it is pending or running) and every finished group's
    trajectories."""
    from conduit_verl.journal_worker import split_samples

    listing = (tq.kv_list("train") or {}).get("train", {})
    prompts, trajectories = kept_keys(listing, trained_keys)
    in_flight = [uid for uid in prompts if listing[uid].get("status") in IN_FLIGHT]
    fields: dict[str, dict[str, Any]] = {}
    for keys in (in_flight, trajectories):
        if keys:
            data = tq.kv_batch_get(keys=keys, partition_id="train")
            fields.update(zip(keys, split_samples(data, len(keys)), strict=True))
    rows = AheadRows(step)
    for key in prompts + trajectories:
        rows.keys.append(key)
        rows.tags.append(dict(listing[key]))
        rows.samples.append(fields.get(key))
    return rows


def _put_rows(keys: list[str], tags: list[dict[str, Any]], samples: list[dict[str, Any] | None]) -> None:
    """Put rows back; rows with fields in one put per field set, the others as tags alone."""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    by_fields: dict[tuple[str, ...] | None, list[int]] = {}
    for i, sample in enumerate(samples):
        by_fields.setdefault(None if sample is None else tuple(sorted(sample)), []).append(i)
    for names, rows in by_fields.items():
        ks, ts = [keys[i] for i in rows], [tags[i] for i in rows]
        if names is None:
            tq.kv_batch_put(keys=ks, partition_id="train", tags=ts)
        else:
            fields = list_of_dict_to_tensordict([samples[i] for i in rows])  # type: ignore[misc]
            tq.kv_batch_put(keys=ks, partition_id="train", fields=fields, tags=ts)


def _journaled_by_uid(root: Path | None, uids: set[str], version: int) -> tuple[dict[str, JournalGroup], int]:
    """Journaled groups of the prompts ``uids`` whose every token came from weights ``<= version``;
    and how many journaled ones used newer weights (lost with the kill: generated again)."""
    found: dict[str, JournalGroup] = {}
    newer = 0
    if root is None or not uids:
        return found, newer
    for step in journaled_steps(root):
        groups, problems = read_step(root, step)
        for problem in problems:
            logger.warning("conduit journal, step %d: %s", step, problem)
        mine = [g for g in groups if g.uid in uids and g.uid not in found]
        usable, n_newer = usable_at(mine, version)
        newer += n_newer
        found.update((g.uid, g) for g in usable)
    return found, newer


@dataclass
class AheadReport:
    """What a resume put back of the prompts drawn ahead of its checkpoint."""

    prompts: int = 0  # prompt groups put back (every status)
    finished: int = 0  # of which finished (at the checkpoint, or journaled after it)
    from_journal: int = 0  # of those, finished after the checkpoint (journaled)
    newer_weights: int = 0  # journaled, but generated with weights newer than the checkpoint's

    def metrics(self) -> dict[str, float]:
        return {
            "conduit/ahead_restored_groups": float(self.prompts),
            "conduit/ahead_finished_groups": float(self.finished),
            "conduit/ahead_journal_groups": float(self.from_journal),
            "conduit/ahead_regenerated_newer_weights": float(self.newer_weights),
        }


def restore_ahead(rows: AheadRows, journal: Path | None, version: int) -> AheadReport:
    """Put the checkpoint's ``rows`` back into TransferQueue; pending or running prompts whose group
    was journaled after the checkpoint (all of it from weights ``<= version``) are put back finished
    with the journaled trajectories. What stays pending, verl re-issues."""
    in_flight = set(rows.prompts(IN_FLIGHT))
    journaled, newer = _journaled_by_uid(journal, in_flight, version)
    keys, tags, samples = list(rows.keys), [dict(t) for t in rows.tags], list(rows.samples)
    for i, key in enumerate(keys):
        if key in journaled:
            tags[i]["status"] = FINISHED
    for uid, group in journaled.items():
        keys.extend(f"{uid}_{suffix}" for suffix in group.suffixes)
        tags.extend(dict(t) for t in group.tags)
        samples.extend(dict(s) for s in group.samples)
    _put_rows(keys, tags, samples)
    finished = len(rows.prompts([FINISHED])) + len(journaled)
    return AheadReport(len(rows.prompts()), finished, len(journaled), newer)
