"""Checkpoints of a whole buffer in Conduit's safe format: occupied slots only, incremental, atomic.

``save_checkpoint(conduit_or_buffer, root)`` writes ``root/ckpt-<n>/``: one record file per segment
of slots (only occupied rows), ``state.cdr`` (sampler with its occupied priorities, counters, delivery
generator, versions) and ``manifest.cdr`` (schema, capacity, files). A segment whose slots were not
rewritten since the previous checkpoint (same per-slot generations) is taken from it instead of
being copied from the buffer, once its checksum, slots and generations are verified (a segment that
fails is copied from the buffer again). Generations are insert counts, so equal ones say nothing of
whose data a segment holds: only a checkpoint of the buffer's own lineage (``buffer.lineage``, saved
in the manifest) is reused, or one of the lineage its last loaded state came from, for generations up
to that state's insert count (``buffer.parent``). A root holding another buffer's checkpoint gets
every segment written anew (refusing it would break a fresh run that saves where an earlier one did).
A reused segment is hard-linked only while another kept checkpoint holds that segment in a file of
its own, and copied otherwise, so no single damaged file reaches every kept checkpoint. The new
directory is written under a temporary name, fsync'd and renamed; the previous checkpoints are kept,
so a crash during a save leaves the last complete one, and a save that fails (a full disk) removes
what it wrote and raises :class:`CheckpointError`.

Loading verifies everything (every record's checksum, sizes against the file and the schema before
anything is allocated, slots, generations, sampler and counters) before the target is touched.

Ingestion and sampling go on while the segments are copied: the buffer's lock is held only to take
the slots' generations, and at the end to re-copy the segments written meanwhile and to take the
sampler and counters (:attr:`CheckpointReport.pause_s`).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import stat
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

from conduit.buffer.buffer import ExperienceBuffer, is_lineage
from conduit.errors import CheckpointError
from conduit.persist import atomic
from conduit.persist.format import FRAME_BYTES, MAX_HEADER, decode, encode, frame, parse_record

_T = TypeVar("_T")


class Runtime(Protocol):
    """What a checkpoint saves and restores beside a buffer (``conduit.Conduit`` is one): the runtime is
    passed in as a part, so persistence never imports it."""

    @property
    def buffer(self) -> ExperienceBuffer: ...

    @property
    def shuffle_generator(self) -> torch.Generator: ...

    def snapshot(self, fn: Callable[[int | None, dict[str, object]], _T]) -> _T: ...

    def load_state_dict(self, state: dict[str, object]) -> None: ...


log = logging.getLogger(__name__)

FORMAT_VERSION = 1
SEGMENT_BYTES = 8 << 20  # bytes of slots per segment: the unit of incremental saves and of re-copies
PRECOPY_ROUNDS = 3  # unlocked passes over what was written during the previous one
KEEP = 3  # complete checkpoints kept in a root (hard links never make one file hold a segment of all)
MANIFEST, STATE = "manifest.cdr", "state.cdr"
_ERRORS = (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError, OverflowError, RecursionError,
           MemoryError)  # fmt: skip  # what malformed saved data can make parsing raise


class _Incompatible(CheckpointError):
    """An intact checkpoint of another buffer (schema, capacity, sampler): never replaced by an older one."""


@dataclass(frozen=True)
class CheckpointReport:
    """What a save did: where, how much was written or reused, and how long the buffer's lock was held
    (``pause_s``: the longest hold, what a concurrent put or sample may wait; ``locked_s``: all holds)."""

    path: str
    items: int
    inserted: int
    segments_written: int  # copied from the buffer
    segments_reused: int  # taken from the previous checkpoint (verified): hard-linked or copied
    segments_linked: int  # of those, hard-linked
    bytes_written: int
    pause_s: float
    locked_s: float
    total_s: float


def save_checkpoint(
    target: Runtime | ExperienceBuffer, root: str | os.PathLike[str], independent: bool = True
) -> CheckpointReport:
    """Save ``target``'s whole state as a new checkpoint under directory ``root`` (see the module doc).

    ``independent=False`` hard-links every unchanged segment (where links are possible), so a save
    writes only the segments written since the previous one, for buffers too large to copy again (a
    frame store); a damaged segment file then reaches every kept checkpoint that shares it.

    Raises :class:`CheckpointError` naming the cause when the save fails (no space, a file size limit, a
    segment of the previous checkpoint that is a symbolic link); nothing of it is left behind."""
    t0 = time.perf_counter()
    buffer = _buffer(target)
    base = atomic.local_dir(root)
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(f"cannot create checkpoint directory {base}: {e}") from e
    previous = _newest_manifest(base)
    n = int(previous[0].name.removeprefix("ckpt-")) + 1 if previous else 1
    final = atomic.inside(base, f"ckpt-{n:06d}")
    atomic.remove_stale(final)
    seg = _segment_slots(buffer)

    holds: list[float] = []  # each time the buffer's lock was held
    history: list[tuple[str, tuple[str, int] | None]] = []  # the buffer's (lineage, parent) at the start

    def generations() -> torch.Tensor:
        with buffer._cond:  # noqa: SLF001 - a short snapshot of the slots' generations
            t = time.perf_counter()
            gen = buffer.storage.generation.to("cpu", copy=True)
            history.append((buffer.lineage, buffer.parent))
            holds.append(time.perf_counter() - t)
        return gen

    # Copy without the lock, then again what was written meanwhile (up to PRECOPY_ROUNDS times):
    # ``ref`` holds, per slot, the generation the copy (or the previous checkpoint) was taken at.
    ref = generations()
    shapes0 = _shapes(buffer)
    keys0 = _keys(ref, seg)
    lineage0 = history[0][0]
    reuse = _verified(previous, buffer, ref, seg, keys0, history[0]) if previous else {}
    copies = {i: _copy_segment(buffer, ref, i, seg) for i in range(len(keys0)) if i not in reuse}
    for _ in range(PRECOPY_ROUNDS):
        now = generations()
        stale = _changed(now, ref, seg)
        if not stale:
            break
        for i in stale:
            copies[i] = _copy_segment(buffer, now, i, seg)
            ref[i * seg : (i + 1) * seg] = now[i * seg : (i + 1) * seg]

    def snap(first: int | None, runtime: dict[str, Any]) -> tuple[Any, ...]:
        with buffer._cond:  # noqa: SLF001 - the final, consistent part: only what changed since
            t = time.perf_counter()
            gen = buffer.storage.generation.to("cpu", copy=True)
            moved = _shapes(buffer) != shapes0 or buffer.lineage != lineage0  # migrated, or a state loaded
            stale = range(len(keys0)) if moved else _changed(gen, ref, seg)
            for i in stale:
                copies[i] = _copy_segment(buffer, gen, i, seg)
            state = {
                "sampler": buffer.sampler.state_dict(first),  # copies (the sum tree's leaves cloned)
                "inserted": buffer.writer.inserted,
                "sampled": buffer.sampled,
                **runtime,
            }
            holds.append(time.perf_counter() - t)
            return gen, state, _layout(buffer, seg), buffer.lineage

    gen, state, layout, lineage = _snapshot(target, snap)
    state["sampler"] = _sparse(state["sampler"], buffer.capacity)  # occupied slots only, off the lock
    keys = _keys(gen, seg)
    if hasattr(buffer.observer, "flush"):
        buffer.observer.flush()  # a journal then always reaches at least as far as the newest checkpoint
    others = _other_kept(base, final)
    limit = _segment_limit(buffer, seg)
    tmp = atomic.temp_sibling(final)
    written = reused = linked = nbytes = 0
    files: dict[str, str] = {}
    try:
        tmp.mkdir()
        for i, key in enumerate(keys):
            name = f"seg-{i:06d}-{key}.cdr"
            files[str(i)] = name
            dst = atomic.inside(tmp, name)
            if i in copies:
                nbytes += atomic.write_file(dst, _segment_record(i, *copies[i]))
                written += 1
                continue
            src = reuse[i]
            reused += 1
            if (not independent or _independent(src, i, others)) and _link(src, dst):
                linked += 1
            else:
                nbytes += _copy_verified(src, dst, limit)
        tensors: list[torch.Tensor] = []
        tree = encode(state, tensors)
        nbytes += atomic.write_file(atomic.inside(tmp, STATE), frame({"state": tree}, tensors))
        manifest = {
            "format": FORMAT_VERSION,
            "lineage": lineage,  # whose writes the segments hold: what a later save may reuse
            "layout": layout,
            "segments": {str(i): k for i, k in enumerate(keys)},
            "files": files,
            "items": min(int(state["inserted"]), buffer.capacity),
            "inserted": int(state["inserted"]),  # what a journal may prune (see covered_items)
        }
        nbytes += atomic.write_file(atomic.inside(tmp, MANIFEST), frame(manifest, []))
        atomic.publish_dir(tmp, final)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed save leaves nothing (its space is free again)
        if isinstance(e, OSError):
            raise CheckpointError(f"saving checkpoint {final} failed: {e}") from e
        raise
    _prune(base)
    return CheckpointReport(
        path=str(final),
        items=manifest["items"],
        inserted=manifest["inserted"],
        segments_written=written,
        segments_reused=reused,
        segments_linked=linked,
        bytes_written=nbytes,
        pause_s=max(holds),
        locked_s=sum(holds),
        total_s=time.perf_counter() - t0,
    )


def load_checkpoint(target: Runtime | ExperienceBuffer, root: str | os.PathLike[str]) -> str:
    """Restore the newest intact checkpoint under ``root`` into ``target``; returns its path.

    A torn or corrupt checkpoint is skipped with a warning naming the problem, and the one before it is
    used. Raises :class:`CheckpointError` (``target`` unchanged) when none is intact or the saved
    schema, capacity or sampler do not fit ``target``.
    """
    path, state = read_checkpoint(target, root)
    if isinstance(target, ExperienceBuffer):
        target.load_state_dict(state["buffer"])
    else:
        target.load_state_dict(state)
    return path


def read_checkpoint(
    target: Runtime | ExperienceBuffer, root: str | os.PathLike[str]
) -> tuple[str, dict[str, Any]]:
    """``(path, state)`` of the newest intact checkpoint under ``root`` that fits ``target``, without
    loading it (``state`` is what ``target.state_dict()`` returns); see :func:`load_checkpoint`."""
    base = atomic.local_dir(root)
    problems: list[str] = []
    for path in _candidates(base):
        try:
            return str(path), _read(path, target)
        except _Incompatible:
            raise
        except CheckpointError as e:
            log.warning("checkpoint %s is unusable (%s); trying the previous one", path, e)
            problems.append(f"{path.name}: {e}")
    detail = "; ".join(problems) if problems else "no checkpoint found"
    raise CheckpointError(f"no intact checkpoint under {base}: {detail}")


def covered_items(root: str | os.PathLike[str]) -> int:
    """The insert count every checkpoint kept under ``root`` holds (the oldest one's; 0 if none or an
    older format): journal records up to it are in whichever checkpoint a load may fall back to."""
    counts = []
    for path in _candidates(atomic.local_dir(root))[:KEEP]:
        try:
            counts.append(int(_manifest(path).get("inserted", 0)))
        except CheckpointError:
            continue  # unreadable: a load cannot fall back to it
    return min(counts, default=0)


# -- saving --------------------------------------------------------------------------------------


def _buffer(target: Any) -> ExperienceBuffer:
    buffer = target if isinstance(target, ExperienceBuffer) else getattr(target, "buffer", None)
    if not isinstance(buffer, ExperienceBuffer):
        raise CheckpointError(f"expected a Conduit or an ExperienceBuffer, got {type(target).__name__}")
    return buffer


def _snapshot(target: Any, fn: Any) -> Any:
    if isinstance(target, ExperienceBuffer):
        return fn(None, {})
    return target.snapshot(fn)


def _segment_slots(buffer: ExperienceBuffer) -> int:
    per_item = max(1, buffer.storage.nbytes // buffer.capacity)  # type: ignore[attr-defined]
    return max(1, SEGMENT_BYTES // per_item)


def _columns(buffer: ExperienceBuffer) -> dict[str, torch.Tensor]:
    storage: Any = buffer.storage
    out = {f"data/{k}": v for k, v in storage.data.items()}
    out.update({f"lengths/{k}": v for k, v in storage.lengths.items()})
    return out


def _shapes(buffer: ExperienceBuffer) -> list[Any]:
    return [(k, tuple(v.shape), id(v)) for k, v in _columns(buffer).items()]


def _layout(buffer: ExperienceBuffer, seg: int) -> dict[str, Any]:
    cols = {k: [str(v.dtype).removeprefix("torch."), list(v.shape[1:])] for k, v in _columns(buffer).items()}
    return {"capacity": buffer.capacity, "segment_slots": seg, "columns": cols}


def _keys(gen: torch.Tensor, seg: int) -> list[str]:
    raw = memoryview(gen.numpy().view("uint8"))  # type: ignore[arg-type]
    step = seg * 8
    return [f"{zlib.crc32(raw[i : i + step]):08x}" for i in range(0, raw.nbytes, step)]


def _changed(gen: torch.Tensor, ref: torch.Tensor, seg: int) -> list[int]:
    """Segments in which some slot's generation differs between ``gen`` and ``ref`` (vectorised)."""
    diff = gen != ref
    pad = (-diff.numel()) % seg
    if pad:
        diff = torch.cat([diff, diff.new_zeros(pad)])
    return torch.nonzero(diff.view(-1, seg).any(1)).flatten().tolist()


def _copy_segment(
    buffer: ExperienceBuffer, gen: torch.Tensor, i: int, seg: int
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    lo = i * seg
    hi = min(lo + seg, buffer.capacity)
    rows = torch.nonzero(gen[lo:hi] > 0).flatten() + lo
    storage: Any = buffer.storage
    full = rows.numel() == hi - lo
    # on disk as [rows, (generation, version)]; the storage keeps them as two rows of [capacity]
    meta = (
        storage.meta[:, lo:hi].t().contiguous().cpu()
        if full
        else storage.meta.index_select(1, rows.to(storage.meta.device)).t().contiguous().cpu()
    )
    cols = {}
    for name, t in _columns(buffer).items():
        cols[name] = t[lo:hi].to("cpu", copy=True) if full else t.index_select(0, rows.to(t.device)).cpu()
    return rows, meta, cols


def _segment_record(
    i: int, rows: torch.Tensor, meta: torch.Tensor, cols: dict[str, torch.Tensor]
) -> list[bytes | memoryview]:
    return frame({"segment": i, "columns": list(cols)}, [rows, meta, *cols.values()])


def _sparse(state: Any, capacity: int) -> Any:
    """``state`` with each ``[capacity, ...]`` tensor reduced to its non-zero rows (occupied slots)."""
    if isinstance(state, dict):
        return {k: _sparse(v, capacity) for k, v in state.items()}
    if isinstance(state, torch.Tensor) and state.dim() >= 1 and state.shape[0] == capacity:
        t = state.cpu()
        nz = torch.nonzero(t.reshape(capacity, -1).ne(0).any(1)).flatten()
        return {"$sparse": True, "index": nz, "values": t.index_select(0, nz), "rows": capacity}
    return state


def _segment_limit(buffer: ExperienceBuffer, seg: int) -> int:
    """The most bytes a segment file of ``seg`` slots of ``buffer`` can take (a larger one is refused unread)."""
    row = sum(math.prod(t.shape[1:]) * t.element_size() for t in _columns(buffer).values())
    return FRAME_BYTES + MAX_HEADER + seg * (row + 3 * 8)  # + the slot index, generation and version


def _verified(
    previous: tuple[Path, dict[str, Any]],
    buffer: ExperienceBuffer,
    ref: torch.Tensor,
    seg: int,
    keys: list[str],
    history: tuple[str, tuple[str, int] | None],
) -> dict[int, Path]:
    """The previous checkpoint's segment files that hold exactly what the buffer holds now (same lineage,
    layout, checksum, slots and generations verified): reused instead of copied from the buffer. One that
    fails is logged and copied from the buffer again; one that is a symbolic link refuses the save.

    ``history`` is the buffer's ``(lineage, parent)``: a checkpoint of its own lineage may give any
    segment, one of its parent's only segments whose generations are all up to the parent's insert count
    (what the loaded state held), one of any other lineage (or none: an older format) nothing."""
    path, manifest = previous
    lineage, parent = history
    saved = manifest.get("lineage")
    upto: int | None = None  # the highest generation a reused segment may hold (None: any)
    if saved != lineage:
        if parent is None or saved != parent[0]:
            log.info("checkpoint %s holds another buffer's writes: every segment is written", path)
            return {}
        upto = parent[1]
    if manifest["layout"] != _layout(buffer, seg):
        return {}
    cols, limit, out = _columns(buffer), _segment_limit(buffer, seg), {}
    for i, key in enumerate(keys):
        if manifest["segments"].get(str(i)) != key:
            continue
        src = atomic.inside(path, manifest["files"][str(i)])
        if src.is_symlink():
            raise CheckpointError(f"refusing to reuse {src}: a symbolic link (to {os.readlink(src)})")
        try:
            meta, tensors = _record(src, limit)
            rows, meta_rows = _check_segment(src.name, meta, tensors, i, seg, cols, buffer.capacity)[:2]
            lo = i * seg
            want = torch.nonzero(ref[lo : lo + seg] > 0).flatten() + lo
            if not (torch.equal(rows, want) and torch.equal(meta_rows[:, 0], ref.index_select(0, want))):
                raise CheckpointError(f"{src.name}: its slots or generations are not the buffer's")
            if upto is not None and rows.numel() and int(meta_rows[:, 0].max()) > upto:
                continue  # written by the parent after the state this buffer loaded: not this history
        except CheckpointError as e:
            log.warning("not reusing %s (%s): copying its slots from the buffer again", src, e)
            continue
        out[i] = src
    return out


def _other_kept(base: Path, final: Path) -> list[dict[str, Any]]:
    """The manifests of the checkpoints a save of ``final`` keeps beside it (unreadable ones left out)."""
    out = []
    for path in [p for p in _candidates(base) if p != final][: KEEP - 1]:
        try:
            out.append({"path": path, **_manifest(path)})
        except CheckpointError:
            continue
    return out


def _independent(src: Path, i: int, others: list[dict[str, Any]]) -> bool:
    """Whether another kept checkpoint holds segment ``i`` in a file of its own (not ``src``): then
    hard-linking ``src`` cannot let one damaged file make every kept checkpoint unloadable."""
    ino = os.lstat(src).st_ino
    for other in others:
        name = other["files"].get(str(i))
        try:
            st = os.lstat(atomic.inside(other["path"], name)) if isinstance(name, str) else None
        except (OSError, CheckpointError):
            continue
        if st is not None and stat.S_ISREG(st.st_mode) and st.st_ino != ino:
            return True
    return False


def _link(src: Path, dst: Path) -> bool:
    """Hard-link ``src`` (never a symbolic link's target) as ``dst``; False where links are not possible."""
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        return False
    return True


def _copy_verified(src: Path, dst: Path, limit: int) -> int:
    """Copy the record file ``src`` to ``dst`` if its checksum still holds; returns the bytes written."""
    data = atomic.read_regular(src, limit)
    if parse_record(data, 0)[2] != len(data):
        raise CheckpointError(f"{src}: unexpected bytes after the record")
    return atomic.write_file(dst, [memoryview(data)])


def _prune(base: Path) -> None:
    for p in _candidates(base)[KEEP:]:
        shutil.rmtree(p, ignore_errors=True)


# -- loading -------------------------------------------------------------------------------------


def _candidates(base: Path) -> list[Path]:
    if not base.is_dir():
        return []
    names = [p for p in base.iterdir() if p.name.startswith("ckpt-") and p.name[5:].isdigit()]
    for p in names:
        if p.is_symlink():  # it may lead outside the root: never read, replaced or removed through it
            raise CheckpointError(f"refusing checkpoint {p}: a symbolic link (to {os.readlink(p)})")
    names = [p for p in names if p.is_dir()]
    return sorted(names, key=lambda p: int(p.name[5:]), reverse=True)


def _newest_manifest(base: Path) -> tuple[Path, dict[str, Any]] | None:
    for path in _candidates(base):
        try:
            return path, _manifest(path)
        except CheckpointError:
            continue
    return None


def _record(path: Path, limit: int) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """The one record of file ``path`` (at most ``limit`` bytes, not a symbolic link), checksum verified."""
    data = atomic.read_regular(path, limit)
    meta, tensors, end = parse_record(data, 0)
    if end != len(data):
        raise CheckpointError(f"{path.name}: {len(data) - end} unexpected bytes after the record")
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path.name}: the record's metadata is a {type(meta).__name__}, not a dict")
    return meta, tensors


def _is_count(value: Any, least: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and least <= value <= 1 << 62


def _manifest(path: Path) -> dict[str, Any]:
    """The manifest of checkpoint ``path``, its structure checked (layout, one file per segment)."""
    meta, _ = _record(atomic.inside(path, MANIFEST), FRAME_BYTES + MAX_HEADER)
    if meta.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"format {str(meta.get('format'))[:40]!r} is not {FORMAT_VERSION} (incompatible)"
        )
    for key in ("layout", "segments", "files", "items"):
        if key not in meta:
            raise CheckpointError(f"manifest lacks {key!r}")
    layout, segments, files = meta["layout"], meta["segments"], meta["files"]
    if not (
        isinstance(layout, dict)
        and _is_count(layout.get("capacity"), 1)
        and _is_count(layout.get("segment_slots"), 1)
        and isinstance(layout.get("columns"), dict)
    ):
        raise CheckpointError(f"manifest of {path.name}: malformed layout {str(layout)[:120]}")
    count = -(-layout["capacity"] // layout["segment_slots"])
    for what, names in (("segments", segments), ("files", files)):
        if (
            not isinstance(names, dict)
            or len(names) != count
            or not all(isinstance(names.get(str(i)), str) for i in range(count))
        ):
            raise CheckpointError(
                f"manifest of {path.name}: {what} is not one name for each of {count} segments"
            )
    if meta.get("lineage") is not None and not is_lineage(meta["lineage"]):
        raise CheckpointError(f"manifest of {path.name}: lineage {str(meta['lineage'])[:40]!r} is malformed")
    if not _is_count(meta["items"]) or not _is_count(meta.get("inserted", 0)):
        raise CheckpointError(
            f"manifest of {path.name}: item counts {meta['items']!r}, {meta.get('inserted')!r}"
        )
    return meta


def _check_segment(
    name: str,
    meta: dict[str, Any],
    tensors: list[torch.Tensor],
    i: int,
    seg: int,
    cols: dict[str, torch.Tensor],
    capacity: int,
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """``(rows, [rows, (generation, version)], columns)`` of segment record ``i``, each checked against the
    buffer's columns ``cols`` (dtype, shape) and the segment's slot range."""
    if meta.get("segment") != i or meta.get("columns") != list(cols) or len(tensors) != 2 + len(cols):
        raise CheckpointError(f"{name}: segment record does not match the manifest")
    rows, meta_rows, data = tensors[0], tensors[1], tensors[2:]
    lo, hi, n = i * seg, min((i + 1) * seg, capacity), tensors[0].numel()
    if rows.dtype != torch.int64 or rows.dim() != 1:
        raise CheckpointError(f"{name}: slot index is {rows.dtype} of shape {tuple(rows.shape)}")
    if n and (int(rows[0]) < lo or int(rows[-1]) >= hi or not bool((rows[1:] > rows[:-1]).all())):
        raise CheckpointError(f"{name}: slot indices are not increasing inside [{lo}, {hi})")
    if meta_rows.dtype != torch.int64 or tuple(meta_rows.shape) != (n, 2):
        raise CheckpointError(
            f"{name}: generations and versions are {meta_rows.dtype} {tuple(meta_rows.shape)}"
        )
    for (key, col), t in zip(cols.items(), data):
        if t.dtype != col.dtype or tuple(t.shape) != (n, *col.shape[1:]):
            raise CheckpointError(
                f"{name}: {key} is {t.dtype} {tuple(t.shape)}, not {col.dtype} {(n, *col.shape[1:])}"
            )
    return rows, meta_rows, data


def _read(path: Path, target: Runtime | ExperienceBuffer) -> dict[str, Any]:
    """The full state saved in checkpoint ``path``, every part verified and checked against ``target``
    (nothing of ``target`` changes). Raises :class:`CheckpointError` naming the file and the problem."""
    try:
        return _read_checked(path, target)
    except CheckpointError:
        raise
    except _ERRORS as e:
        raise CheckpointError(f"checkpoint {path.name} is malformed ({type(e).__name__}: {e})") from e


def _read_checked(path: Path, target: Runtime | ExperienceBuffer) -> dict[str, Any]:
    buffer = _buffer(target)
    manifest = _manifest(path)
    layout = manifest["layout"]
    cols = _columns(buffer)
    want = {k: [str(v.dtype).removeprefix("torch."), list(v.shape[1:])] for k, v in cols.items()}
    if layout["capacity"] != buffer.capacity or layout["columns"] != want:
        raise _Incompatible(
            f"checkpoint {path.name} does not fit this buffer: saved capacity {layout['capacity']} and "
            f"columns {str(layout['columns'])[:200]}; this buffer has capacity {buffer.capacity} and columns {want}"
        )
    cap, seg = buffer.capacity, layout["segment_slots"]
    # the state first: small, and its counts say what the segments must hold
    smeta, stensors = _record(atomic.inside(path, STATE), FRAME_BYTES + MAX_HEADER + 64 * cap)
    state = decode(smeta.get("state"), stensors)
    if not isinstance(state, dict) or not {"sampler", "inserted", "sampled"} <= set(state):
        raise CheckpointError(f"{path.name}/{STATE}: not a saved buffer state")
    kind = getattr(buffer.sampler, "kind", None)
    saved = state["sampler"].get("kind") if isinstance(state["sampler"], dict) else None
    if kind is not None and saved != kind:
        raise _Incompatible(f"checkpoint {path.name} does not fit this buffer: the saved sampler is "
                            f"{str(saved)[:40]!r}; this buffer's sampler is {kind!r}")  # fmt: skip
    if "inserted" in manifest and manifest["inserted"] != state["inserted"]:
        raise CheckpointError(f"{path.name}: manifest and state disagree on the insert count")
    sampler = _dense(state.pop("sampler"), cap)
    if not isinstance(target, ExperienceBuffer):
        _check_runtime(path, state, target)
    limit = _segment_limit(buffer, seg)
    dense = {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in cols.items()}  # the schema's size
    meta_t = torch.zeros((cap, 2), dtype=torch.int64)
    for i in range(len(manifest["files"])):
        name = manifest["files"][str(i)]
        seg_meta, tensors = _record(atomic.inside(path, name), limit)
        rows, meta_rows, data = _check_segment(name, seg_meta, tensors, i, seg, cols, cap)
        meta_t.index_copy_(0, rows, meta_rows)
        for dst, src in zip(dense.values(), data):
            dst.index_copy_(0, rows, src)
    storage = dict(dense)
    storage["generation"], storage["version"] = meta_t[:, 0].clone(), meta_t[:, 1].clone()
    buf = {
        "storage": storage,
        "sampler": sampler,
        "inserted": state.pop("inserted"),
        "sampled": state.pop("sampled"),
        "lineage": manifest.get("lineage"),  # the loading buffer's parent: what its next save may reuse
    }
    try:
        buffer.check_state(buf)
    except CheckpointError as e:
        raise CheckpointError(f"checkpoint {path.name}: {e}") from e
    return {"buffer": buf, **state}


def _check_runtime(path: Path, state: dict[str, Any], target: Runtime) -> None:
    """Raise unless the runtime's saved part (delivery generator, versions) can be restored into ``target``."""
    delivery, versions = state.get("delivery"), state.get("versions")
    gen = delivery.get("generator") if isinstance(delivery, dict) else None
    if gen is not None:
        try:
            torch.Generator(device=target.shuffle_generator.device).set_state(gen)
        except (RuntimeError, TypeError, ValueError) as e:
            raise CheckpointError(
                f"checkpoint {path.name}: the saved delivery generator is unusable ({e})"
            ) from e
    if versions is not None and not (
        isinstance(versions, dict)
        and all(versions.get(k) is None or _is_count(versions.get(k)) for k in ("put", "get"))
    ):
        raise CheckpointError(
            f"checkpoint {path.name}: saved policy versions {str(versions)[:80]} are not counts"
        )


def _dense(state: Any, capacity: int) -> Any:
    """``state`` with each vector :func:`_sparse` reduced expanded to ``capacity`` rows again (checked first)."""
    if not isinstance(state, dict):
        return state
    if state.get("$sparse") is not True:
        return {k: _dense(v, capacity) for k, v in state.items()}
    values, index = state.get("values"), state.get("index")
    if (
        state.get("rows") != capacity
        or not isinstance(values, torch.Tensor)
        or not isinstance(index, torch.Tensor)
        or values.dim() != 1
        or index.dtype != torch.int64
        or tuple(index.shape) != tuple(values.shape)
        or (index.numel() and not (0 <= int(index.min()) and int(index.max()) < capacity))
    ):
        raise CheckpointError(f"a saved sparse vector does not fit capacity {capacity}: {str(state)[:120]}")
    return torch.zeros(capacity, dtype=values.dtype).index_copy_(0, index, values)
