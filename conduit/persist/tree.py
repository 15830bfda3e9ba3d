"""A framework's experience state on disk: its conduits as Conduit checkpoints, the rest as one safe record.

``save_tree(state, conduits, directory)`` writes ``directory/buffers/<name>/`` (a checkpoint root per
conduit, incremental against ``previous``) and ``directory/state.cdr`` (everything else in ``state``,
without its ``"conduits"`` entry). ``load_tree`` returns ``state`` with ``"conduits"`` as a lazy mapping
that reads each conduit's checkpoint when the framework asks for it — by then it has built the conduit.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from conduit.api import Conduit
from conduit.buffer.buffer import ExperienceBuffer
from conduit.errors import CheckpointError
from conduit.persist import atomic
from conduit.persist.checkpoint import read_checkpoint, save_checkpoint
from conduit.persist.format import decode, encode, frame, parse_record

BUFFERS, STATE = "buffers", "state.cdr"


def save_tree(
    state: dict[str, Any],
    conduits: Mapping[str, Conduit | ExperienceBuffer],
    directory: Path,
    previous: Path | None = None,
    linked: Collection[str] = (),
) -> None:
    """Write ``state`` (its ``"conduits"`` entry replaced by ``conduits``' checkpoints) to the new ``directory``.

    The buffers named in ``linked`` hard-link every segment unchanged since ``previous``
    (``save_checkpoint(..., independent=False)``): large stores whose saves write only what changed.

    A save that fails removes ``directory`` and raises :class:`CheckpointError` naming the cause (a symbolic
    link in ``previous`` is refused, never followed)."""
    directory.mkdir(parents=True)
    try:
        rest = {k: v for k, v in state.items() if k != "conduits"}
        names = sorted(conduits) if "conduits" in state else []
        for name in names:
            root = atomic.inside(directory / BUFFERS, str(name))
            old = previous / BUFFERS / str(name) if previous is not None else None
            if old is not None and old.is_dir():
                atomic.link_tree(old, root)  # unchanged segments are reused, the previous checkpoint kept
            save_checkpoint(conduits[name], root, independent=name not in linked)
        tensors: list[Any] = []
        tree = encode({"rest": rest, "conduits": names}, tensors)
        atomic.write_file(atomic.inside(directory, STATE), frame({"tree": tree}, tensors))
    except BaseException as e:
        shutil.rmtree(directory, ignore_errors=True)
        if isinstance(e, OSError):
            raise CheckpointError(f"saving {directory} failed: {e}") from e
        raise


def load_tree(directory: Path, conduit: Callable[[str], Conduit | ExperienceBuffer]) -> dict[str, Any]:
    """The state :func:`save_tree` wrote; ``conduit(name)`` gives the conduit a saved buffer is read for.
    Raises :class:`CheckpointError` naming the file and the problem for a damaged or crafted one."""
    path = atomic.inside(directory, STATE)
    data = atomic.read_regular(path)
    meta, tensors, _ = parse_record(data, 0)
    tree = decode(meta.get("tree") if isinstance(meta, dict) else None, tensors)
    names = tree.get("conduits") if isinstance(tree, dict) else None
    if (
        not isinstance(tree, dict)
        or not isinstance(tree.get("rest"), dict)
        or not isinstance(names, list | None)
    ):
        raise CheckpointError(f"{path}: not a saved experience state")
    if not all(isinstance(n, str) for n in names or []):
        raise CheckpointError(f"{path}: conduit names {str(names)[:80]} are not strings")
    state = dict(tree["rest"])
    if names:
        state["conduits"] = _Lazy(directory / BUFFERS, list(names), conduit)
    return state


class _Lazy(Mapping[str, Any]):
    def __init__(
        self, root: Path, names: list[str], conduit: Callable[[str], Conduit | ExperienceBuffer]
    ) -> None:
        self.root, self.names, self.conduit = root, names, conduit

    def __getitem__(self, name: str) -> Any:
        if name not in self.names:
            raise KeyError(name)
        return read_checkpoint(self.conduit(name), atomic.inside(self.root, str(name)))[1]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


__all__ = ["load_tree", "save_tree"]
