"""Checkpoints of a whole buffer in Conduit's safe format: occupied slots only, incremental, atomic.

``save_checkpoint(conduit_or_buffer, root)`` writes ``root/ckpt-<n>/``: one record file per segment
of slots (only occupied rows), ``state.cdr`` (sampler with its occupied priorities, counters, delivery
generator, versions) and ``manifest.cdr`` (schema, capacity, files). A segment whose slots were not
rewritten since the previous checkpoint (same per-slot generations) is hard-linked from it instead
of being written again. The new directory is written under a temporary name, fsync'd and renamed;
the previous checkpoint is kept, so a crash during a save leaves the last complete one.

Ingestion and sampling go on while the segments are copied: the buffer's lock is held only to take
the slots' generations, and at the end to re-copy the segments written meanwhile and to take the
sampler and counters (:attr:`CheckpointReport.pause_s`).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from conduit.buffer.buffer import ExperienceBuffer
from conduit.errors import CheckpointError
from conduit.persist import atomic
from conduit.persist.format import decode, encode, frame, parse_record

if TYPE_CHECKING:
    from conduit.api import Conduit

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
SEGMENT_BYTES = 8 << 20  # bytes of slots per segment: the unit of incremental saves and of re-copies
PRECOPY_ROUNDS = 3  # unlocked passes over what was written during the previous one
KEEP = 2  # complete checkpoints kept in a root (the newest and the one before)
MANIFEST, STATE = "manifest.cdr", "state.cdr"


class _Incompatible(CheckpointError):
    """An intact checkpoint of another buffer (schema, capacity, sampler): never replaced by an older one."""


@dataclass(frozen=True)
class CheckpointReport:
    """What a save did: where, how much was written or reused, and how long the buffer's lock was held
    (``pause_s``: the longest hold, what a concurrent put or sample may wait; ``locked_s``: all holds)."""

    path: str
    items: int
    inserted: int
    segments_written: int
    segments_reused: int
    bytes_written: int
    pause_s: float
    locked_s: float
    total_s: float


def save_checkpoint(target: Conduit | ExperienceBuffer, root: str | os.PathLike[str]) -> CheckpointReport:
    """Save ``target``'s whole state as a new checkpoint under directory ``root`` (see the module doc)."""
    t0 = time.perf_counter()
    buffer = _buffer(target)
    base = atomic.local_dir(root)
    base.mkdir(parents=True, exist_ok=True)
    previous = _newest_manifest(base)
    n = int(previous[0].name.removeprefix("ckpt-")) + 1 if previous else 1
    final = atomic.inside(base, f"ckpt-{n:06d}")
    atomic.remove_stale(final)
    seg = _segment_slots(buffer)

    holds: list[float] = []  # each time the buffer's lock was held

    def generations() -> torch.Tensor:
        with buffer._cond:  # noqa: SLF001 - a short snapshot of the slots' generations
            t = time.perf_counter()
            gen = buffer.storage.generation.to("cpu", copy=True)
            holds.append(time.perf_counter() - t)
        return gen

    # Copy without the lock, then again what was written meanwhile (up to PRECOPY_ROUNDS times):
    # ``ref`` holds, per slot, the generation the copy (or the previous checkpoint) was taken at.
    ref = generations()
    shapes0 = _shapes(buffer)
    old = previous[1]["segments"] if previous and previous[1]["layout"] == _layout(buffer, seg) else {}
    keys0 = _keys(ref, seg)
    copies = {i: _copy_segment(buffer, ref, i, seg) for i, k in enumerate(keys0) if old.get(str(i)) != k}
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
            stale = range(len(keys0)) if _shapes(buffer) != shapes0 else _changed(gen, ref, seg)
            for i in stale:
                copies[i] = _copy_segment(buffer, gen, i, seg)
            state = {
                "sampler": buffer.sampler.state_dict(first),  # copies (the sum tree's leaves cloned)
                "inserted": buffer.writer.inserted,
                "sampled": buffer.sampled,
                **runtime,
            }
            holds.append(time.perf_counter() - t)
            return gen, state, _layout(buffer, seg)

    gen, state, layout = _snapshot(target, snap)
    state["sampler"] = _sparse(state["sampler"], buffer.capacity)  # occupied slots only, off the lock
    keys = _keys(gen, seg)
    if hasattr(buffer.observer, "flush"):
        buffer.observer.flush()  # a journal then always reaches at least as far as the newest checkpoint
    tmp = atomic.temp_sibling(final)
    tmp.mkdir()
    written = reused = nbytes = 0
    files: dict[str, str] = {}
    for i, key in enumerate(keys):
        name = f"seg-{i:06d}-{key}.cdr"
        files[str(i)] = name
        if i in copies:
            nbytes += atomic.write_file(atomic.inside(tmp, name), _segment_record(i, *copies[i]))
            written += 1
        else:
            assert previous is not None
            _link(atomic.inside(previous[0], previous[1]["files"][str(i)]), atomic.inside(tmp, name))
            reused += 1
    tensors: list[torch.Tensor] = []
    tree = encode(state, tensors)
    nbytes += atomic.write_file(atomic.inside(tmp, STATE), frame({"state": tree}, tensors))
    manifest = {
        "format": FORMAT_VERSION,
        "layout": layout,
        "segments": {str(i): k for i, k in enumerate(keys)},
        "files": files,
        "items": min(int(state["inserted"]), buffer.capacity),
        "inserted": int(state["inserted"]),  # what a journal may prune (see covered_items)
    }
    nbytes += atomic.write_file(atomic.inside(tmp, MANIFEST), frame(manifest, []))
    atomic.publish_dir(tmp, final)
    _prune(base)
    return CheckpointReport(
        str(final),
        manifest["items"],
        manifest["inserted"],
        written,
        reused,
        nbytes,
        max(holds),
        sum(holds),
        time.perf_counter() - t0,
    )


def load_checkpoint(target: Conduit | ExperienceBuffer, root: str | os.PathLike[str]) -> str:
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
    target: Conduit | ExperienceBuffer, root: str | os.PathLike[str]
) -> tuple[str, dict[str, Any]]:
    """``(path, state)`` of the newest intact checkpoint under ``root`` that fits ``target``, without
    loading it (``state`` is what ``target.state_dict()`` returns); see :func:`load_checkpoint`."""
    base = atomic.local_dir(root)
    problems: list[str] = []
    for path in _candidates(base):
        try:
            return str(path), _read(path, _buffer(target))
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


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


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


def _record(path: Path) -> tuple[dict[str, Any], list[torch.Tensor]]:
    if path.is_symlink():
        raise CheckpointError(f"{path.name} is a symbolic link (to {os.readlink(path)}); refusing to read it")
    try:
        data = bytearray(path.read_bytes())
    except OSError as e:
        raise CheckpointError(f"cannot read {path.name}: {e}") from e
    meta, tensors, end = parse_record(data, 0)
    if end != len(data):
        raise CheckpointError(f"{path.name}: {len(data) - end} unexpected bytes after the record")
    return meta, tensors


def _manifest(path: Path) -> dict[str, Any]:
    meta, _ = _record(atomic.inside(path, MANIFEST))
    if meta.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"format {meta.get('format')!r} is not {FORMAT_VERSION} (incompatible)")
    for key in ("layout", "segments", "files", "items"):
        if key not in meta:
            raise CheckpointError(f"manifest lacks {key!r}")
    return meta


def _read(path: Path, buffer: ExperienceBuffer) -> dict[str, Any]:
    """The full state saved in checkpoint ``path`` (every record verified), checked against ``buffer``."""
    manifest = _manifest(path)
    layout = manifest["layout"]
    cols = _columns(buffer)
    want = {k: [str(v.dtype).removeprefix("torch."), list(v.shape[1:])] for k, v in cols.items()}
    if layout["capacity"] != buffer.capacity or layout["columns"] != want:
        raise _Incompatible(
            f"checkpoint {path.name} does not fit this buffer: saved capacity {layout['capacity']} and "
            f"columns {layout['columns']}; this buffer has capacity {buffer.capacity} and columns {want}"
        )
    dense = {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in cols.items()}
    meta_t = torch.zeros((buffer.capacity, 2), dtype=torch.int64)
    for i, name in sorted(manifest["files"].items(), key=lambda kv: int(kv[0])):
        seg_meta, tensors = _record(atomic.inside(path, name))
        if (
            seg_meta.get("segment") != int(i)
            or seg_meta.get("columns") != list(cols)
            or len(tensors) != 2 + len(cols)
        ):
            raise CheckpointError(f"{name}: segment record does not match the manifest")
        rows, meta_rows = tensors[0], tensors[1]
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= buffer.capacity):
            raise CheckpointError(f"{name}: slot index outside [0, {buffer.capacity})")
        try:
            meta_t.index_copy_(0, rows, meta_rows)
            for dst, src in zip(dense.values(), tensors[2:]):
                dst.index_copy_(0, rows, src)
        except (RuntimeError, IndexError) as e:
            raise CheckpointError(f"{name}: rows do not fit the buffer's columns ({e})") from e
    smeta, stensors = _record(atomic.inside(path, STATE))
    state = _dense(decode(smeta.get("state"), stensors))
    if not isinstance(state, dict) or "sampler" not in state:
        raise CheckpointError(f"{path.name}/{STATE}: not a saved buffer state")
    storage = dict(dense)
    storage["generation"], storage["version"] = meta_t[:, 0].clone(), meta_t[:, 1].clone()
    buf = {k: state.pop(k) for k in ("sampler", "inserted", "sampled")}
    buf["storage"] = storage
    try:
        buffer.storage.check_state(storage)
        buffer.sampler.check_state(buf["sampler"])
    except CheckpointError as e:
        raise _Incompatible(f"checkpoint {path.name} does not fit this buffer: {e}") from e
    return {"buffer": buf, **state}


def _dense(state: Any) -> Any:
    if isinstance(state, dict):
        if state.get("$sparse") is True:
            values, index = state["values"], state["index"]
            out = torch.zeros((state["rows"], *values.shape[1:]), dtype=values.dtype)
            return out.index_copy_(0, index, values)
        return {k: _dense(v) for k, v in state.items()}
    return state
