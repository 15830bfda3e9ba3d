"""The caller's side of keyed stores served in other processes (:mod:`conduit.buffer.keyed_service`).

:class:`KeyedClient` spreads a batch's keys over ``N`` stores (key mod ``N``) and makes their calls through
``call(i, method, *args)``, which the integration supplies (a data port, an actor framework, its own
error handling). A write of at least ``direct_min_bytes`` to a store on the caller's node goes in place:
a write plan, :func:`~conduit.buffer.mapped.write_mapped`, a commit (a plan refused as stale is made
again, at most ``plan_tries`` times); smaller writes travel as data, combined with the writes queued
behind calls in flight (:class:`Coalescer`). A read from the caller's node gathers straight from the
mapped columns (:func:`~conduit.buffer.mapped.read_mapped`), from elsewhere as data; the parts of a read
answered by several stores are merged in one copy (:meth:`~conduit.buffer.columns.Column.merge`).
Large mapped copies run on the copy threads (:func:`~conduit.buffer.mapped.run_copies`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

import numpy as np
import torch

from conduit.buffer.columns import Column, from_wire, to_wire
from conduit.buffer.mapped import Layout, StaleLayoutError, read_mapped, run_copies, write_mapped

P = TypeVar("P")
#: ``call(i, method, *args)``: store ``i``'s answer to one of :data:`~conduit.buffer.keyed_service.METHODS`
Call = Callable[..., Awaitable[Any]]
#: a mapped copy of at least this many bytes in all (a read counts 8 per token) runs on the copy threads
PARALLEL_COPY_MIN_BYTES = 4 << 20
#: a same-node write of fewer payload bytes travels as data (one call) instead of going in place (two
#: calls, plan and commit)
DIRECT_PUT_MIN_BYTES = 1 << 20
PLAN_TRIES = 3  # write plans tried (each refused as stale) before a write travels as data


class Coalescer(Generic[P]):
    """Calls to one storage that queue while ``max_in_flight`` are in flight go together (use from one
    event loop): the next call carries all of them, as one :func:`join`-ed call where consecutive ones
    have the same ``signature`` and disjoint keys, else one after another in arrival order. A lone call
    waits for nothing. Each caller is answered when its call is done; when a joined call fails, its
    parts are sent again one by one, so each caller gets the error of its own (one bad item in a joined
    call fails only its own caller).

    ``send(keys, payload)`` makes one call; ``join(payloads)`` one payload of several (keys in order)."""

    def __init__(self, send: Callable[[np.ndarray, P], Awaitable[None]], join: Callable[[list[P]], P],
                 signature: Callable[[P], Hashable], max_in_flight: int = 2) -> None:  # fmt: skip
        self.send, self.join, self.signature, self.max_in_flight = send, join, signature, max_in_flight
        self.pending: list[tuple[np.ndarray, P, asyncio.Future]] = []
        self.in_flight = 0

    async def put(self, keys: np.ndarray, payload: P) -> None:
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self.pending.append((keys, payload, future))
        self._pump()
        await future

    def _pump(self) -> None:
        loop = asyncio.get_running_loop()
        while self.pending and self.in_flight < self.max_in_flight:
            batch, self.pending = self.pending, []
            self.in_flight += 1
            loop.create_task(self._send_batch(batch))

    async def _send_batch(self, batch: list[tuple[np.ndarray, P, asyncio.Future]]) -> None:
        try:
            for group in self._groups(batch):
                await self._send_group(group)
        finally:
            self.in_flight -= 1
            self._pump()

    async def _send_group(self, group: list[tuple[np.ndarray, P, asyncio.Future]]) -> None:
        if len(group) > 1:
            try:
                await self.send(np.concatenate([k for k, _, _ in group]), self.join([p for _, p, _ in group]))
            except Exception:  # noqa: BLE001  (each part is sent again below and gets its own answer)
                pass
            else:
                for _, _, future in group:
                    if not future.done():
                        future.set_result(None)
                return
        for keys, payload, future in group:
            try:
                await self.send(keys, payload)
            except Exception as e:  # noqa: BLE001  (handed to the call's caller)
                if not future.done():
                    future.set_exception(e)
            else:
                if not future.done():
                    future.set_result(None)

    def _groups(self, batch: list[tuple[np.ndarray, P, asyncio.Future]]) -> list[list]:
        """Consecutive runs of calls with one signature and disjoint keys (arrival order kept); a call
        that names a key twice goes alone."""
        groups: list[list] = []
        seen = np.empty(0, dtype=np.int64)
        joinable = False
        for item in batch:
            keys = np.asarray(item[0], dtype=np.int64)
            unique = np.unique(keys).size == keys.size
            if (
                groups
                and joinable
                and unique
                and self.signature(groups[-1][0][1]) == self.signature(item[1])
                and not np.intersect1d(seen, keys).size
            ):
                groups[-1].append(item)
                seen = np.concatenate([seen, keys])
            else:
                groups.append([item])
                seen, joinable = keys, unique
        return groups


def put_batcher(send: Callable[[np.ndarray, dict[str, Column]], Awaitable[None]]) -> Coalescer:
    """Writes to one store that queue behind calls in flight, sent together (:class:`Coalescer`): writes
    that bring the same columns of the same kinds, dtypes and shapes are joined column by column."""

    def join(parts: list[dict[str, Column]]) -> dict[str, Column]:
        return {name: Column.cat([p[name] for p in parts]) for name in parts[0]}

    def signature(columns: dict[str, Column]) -> tuple:
        return tuple(sorted((name, c.kind, str(c.dtype), c.rest) for name, c in columns.items()))

    return Coalescer(send, join, signature)


def as_layout(layout: Any) -> Layout:
    """A :class:`~conduit.buffer.mapped.Layout` as it came (or from its fields' tuple)."""
    return layout if isinstance(layout, Layout) else Layout(*layout)


class KeyedClient:
    """One process's calls to the keyed stores on ``nodes`` (store ``i`` on ``nodes[i]``; this process on
    ``node``), made through ``call`` (see the module docstring). Use from one event loop."""

    def __init__(self, call: Call, nodes: Sequence[str], node: str,
                 direct_min_bytes: int = DIRECT_PUT_MIN_BYTES) -> None:  # fmt: skip
        self.call, self.nodes, self.node, self.direct_min_bytes = call, list(nodes), node, direct_min_bytes
        self._batchers: dict[int, Coalescer] = {}

    def routes(self, keys: torch.Tensor) -> list[tuple[int, torch.Tensor | None]]:
        """``(store, positions of its keys)`` per store holding some of ``keys`` (None: all of them)."""
        n = len(self.nodes)
        if n == 1:
            return [(0, None)]
        owner = keys % n
        return [(i, pos) for i in range(n) if (pos := torch.nonzero(owner == i).flatten()).numel()]

    async def put(self, keys: torch.Tensor, columns: dict[str, Column]) -> None:
        """Store (or overwrite) ``columns`` for ``keys`` (distinct, int64), each store its part."""
        calls = []
        for i, pos in self.routes(keys):
            part = columns if pos is None else {f: c.select(pos) for f, c in columns.items()}
            calls.append(self._put(i, keys if pos is None else keys[pos], part))
        await asyncio.gather(*calls)

    async def _put(self, i: int, keys: torch.Tensor, columns: dict[str, Column]) -> None:
        """One store's part of a write: in place through a write plan where the store is on this node."""
        gis = keys.numpy()
        nbytes = sum(c.nbytes for c in columns.values())
        if self.nodes[i] == self.node and nbytes >= self.direct_min_bytes:
            specs = {f: c.plan_spec() for f, c in columns.items()}
            for _ in range(PLAN_TRIES):
                plan_id, entries = await self.call(i, "write_plan", gis, specs, True)
                if not entries:
                    break
                try:
                    lengths = await _write_planned(entries, columns)
                except StaleLayoutError:  # the column grew into a new file since the plan
                    await self.call(i, "abandon", plan_id)
                    continue
                rest = {f: to_wire(c) for f, c in columns.items() if f not in entries}
                if await self.call(i, "commit", plan_id, gis, lengths, rest):
                    return
        if nbytes < self.direct_min_bytes:  # small: combined with the writes queued meanwhile
            await self._batcher(i).put(gis, columns)
        else:
            await self._send_put(i, gis, columns)

    async def _send_put(self, i: int, gis: np.ndarray, columns: dict[str, Column]) -> None:
        await self.call(i, "put", gis, {f: to_wire(c) for f, c in columns.items()})

    def _batcher(self, i: int) -> Coalescer:
        batcher = self._batchers.get(i)
        if batcher is None:
            batcher = self._batchers[i] = put_batcher(lambda gis, cols: self._send_put(i, gis, cols))
        return batcher

    async def get(self, keys: torch.Tensor, names: list[str]) -> dict[str, Column]:
        """The columns ``names`` of ``keys`` (int64), in the order of ``keys``."""
        routes = self.routes(keys)
        parts = await asyncio.gather(
            *(self._read(i, keys if pos is None else keys[pos], names, len(routes) == 1) for i, pos in routes)
        )
        if len(parts) == 1:
            return parts[0]
        positions: list[torch.Tensor] = [pos for _, pos in routes]  # type: ignore[misc]
        return {f: Column.merge([p[f] for p in parts], positions, len(keys)) for f in names}

    async def _read(self, i: int, keys: torch.Tensor, names: list[str], own: bool) -> dict[str, Column]:
        """One store's part of a read. ``own``: the columns are returned as they are, so arrays from a
        data port (read-only) are copied; parts merged afterwards are read in place. Mapped columns are
        gathered on the copy threads when the read is large (the copies release the GIL: two columns
        copy at once, and the event loop is not blocked meanwhile)."""
        gis = keys.numpy()
        plan = await self.call(i, "read_plan", gis, names, self.nodes[i] == self.node)
        out: dict[str, Column] = {}
        mapped: dict[str, tuple] = {}
        for name, entry in plan.items():
            if entry[0] != "mapped":
                out[name] = from_wire(entry, writable=own)
                continue
            _, kind, layout, lengths, rows = entry
            lens = None if lengths is None else torch.from_numpy(np.array(lengths, copy=True))
            mapped[name] = (as_layout(layout), torch.from_numpy(np.array(rows, copy=True)), lens, kind)
        nbytes = sum(int(e[2].sum()) * 8 for e in mapped.values() if e[2] is not None)
        jobs = [functools.partial(_read_column, *e) for e in mapped.values()]
        results = await run_copies(jobs, nbytes, PARALLEL_COPY_MIN_BYTES)
        retry = [name for name, col in zip(mapped, results) if col is None]
        out.update({name: col for name, col in zip(mapped, results) if col is not None})
        if retry:  # those columns grew into new files since the plan
            wires = await self.call(i, "get", gis, retry)
            out.update({n: from_wire(w, writable=own) for n, w in wires.items()})
        return out

    async def clear(self, keys: torch.Tensor) -> None:
        """Forget every column of ``keys``."""
        await asyncio.gather(
            *(
                self.call(i, "clear", (keys if pos is None else keys[pos]).numpy())
                for i, pos in self.routes(keys)
            )
        )


async def _write_planned(
    entries: dict[str, tuple], columns: dict[str, Column]
) -> dict[str, np.ndarray | None]:
    """Each planned column's rows scattered into the store's mapped file (one copy; large writes one
    column per copy thread); the lengths to commit."""
    jobs = {
        name: functools.partial(
            write_mapped,
            as_layout(layout),
            torch.from_numpy(np.array(rows, copy=True)),
            columns[name].data,  # type: ignore[arg-type]  # planned columns are tensors
        )
        for name, (layout, rows) in entries.items()
    }
    nbytes = sum(columns[name].nbytes for name in jobs)
    results = await run_copies(list(jobs.values()), nbytes, PARALLEL_COPY_MIN_BYTES)
    return {name: None if r is None else r.numpy() for name, r in zip(jobs, results)}


def _read_column(
    layout: Layout, rows: torch.Tensor, lengths: torch.Tensor | None, kind: str
) -> Column | None:
    """A mapped column's gather; None if its file was replaced since the plan (the caller asks again)."""
    try:
        return Column(kind, read_mapped(layout, rows, lengths))
    except StaleLayoutError:
        return None
