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

from conduit_verl.compat import Seam, check_seams, tq
from conduit_verl.journal import JournalGroup, journaled_steps, match, prompt_identity, prune, read_step

logger = logging.getLogger(__name__)

_TRAINER = "verl.trainer.ppo.v1.trainer_base"

#: what the resume needs from verl beyond ``compat.SEAMS`` (checked on import, like those)
RESUME_SEAMS = (
    Seam(
        "trainer method `_submit_batch_to_rollout`",
        _TRAINER,
        "PPOTrainer._submit_batch_to_rollout",
        ("batch",),
    ),
    Seam("trainer method `_save_checkpoint`", _TRAINER, "PPOTrainer._save_checkpoint"),
    Seam("trainer method `prepare_step`", _TRAINER, "PPOTrainer.prepare_step"),
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
    problems: list[str] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        return {
            "conduit/journal_restored_groups": float(self.restored),
            "conduit/journal_generated_groups": float(self.generated),
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
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    keys: list[str] = []
    samples: list[dict[str, Any]] = []
    tags: list[dict[str, Any]] = []
    for row, group in groups.items():
        uid = uids[row]
        for suffix, sample, tag in zip(group.suffixes, group.samples, group.tags, strict=True):
            keys.append(f"{uid}_{suffix}")
            samples.append({**sample, "uid": uid} if "uid" in sample else dict(sample))
            tags.append(dict(tag))
    tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(samples), tags=tags)
    prompt_uids = [uids[row] for row in groups]
    prompt_tags = [{"is_prompt": True, "status": "finished", "global_steps": step} for _ in prompt_uids]
    tq.kv_batch_put(keys=prompt_uids, partition_id="train", tags=prompt_tags)


def prune_on_start(root: Path, step: int, resume_mode: str) -> list[int]:
    """Before the first step of a process: drop the journals of steps before ``step`` (trained into
    the checkpoint it resumed from), or every journal when verl does not resume
    (``trainer.resume_mode=disable``: a fresh run must not take an earlier run's groups)."""
    if resume_mode == "disable":
        return prune(root, max([step, *journaled_steps(root)]))
    return prune(root, step - 1)


def submit_with_journal(
    root: Path, step: int, batch: Any, generate: Callable[[Any], int], channel: Any = None
) -> RestoreReport:
    """Submit step ``step``'s prompt ``batch``: journaled groups restored, the rest ``generate``-d.

    ``generate`` is verl's ``_submit_batch_to_rollout``; ``channel`` the completion channel
    (told once per restored group, so the streaming wait counts them).
    """
    report = RestoreReport(step)
    journaled, report.problems = read_step(root, step)
    for problem in report.problems:
        logger.warning("conduit journal, step %d: %s", step, problem)
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
