"""Puts that wait for the same store go to it together: one call for the puts queued meanwhile.

verl's agent loop puts each trajectory as it finishes, many at once from one process. Sent one by one,
every small put pays a call and the store's per-call bookkeeping, and the store answers them in turn.
:class:`PutBatcher` (one per store and process) sends a put at once while fewer than two calls are in
flight (a lone put waits for nothing); puts that arrive while two are in flight wait, and the next
call carries all of them — as one put when they bring the same fields and disjoint keys, else one
after another in arrival order. Each put's caller is
answered when its data is stored. When a combined put fails, its parts are sent again one by one, so
each caller gets the error of its own put (a bad dtype in one trajectory fails only that one).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np

from conduit_verl.tq_store.columns import Column

#: sends one put to the store: (global indexes, columns by field)
Send = Callable[[np.ndarray, dict[str, Column]], Awaitable[None]]


class PutBatcher:
    """Combines the puts to one store queued while ``max_in_flight`` calls to it are in flight (use from
    one event loop)."""

    def __init__(self, send: Send, max_in_flight: int = 2) -> None:
        self.send = send
        self.max_in_flight = max_in_flight
        self.pending: list[tuple[np.ndarray, dict[str, Column], asyncio.Future]] = []
        self.in_flight = 0

    async def put(self, gis: np.ndarray, columns: dict[str, Column]) -> None:
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self.pending.append((gis, columns, future))
        self._pump()
        await future

    def _pump(self) -> None:
        loop = asyncio.get_running_loop()
        while self.pending and self.in_flight < self.max_in_flight:
            batch, self.pending = self.pending, []
            self.in_flight += 1
            loop.create_task(self._send_batch(batch))

    async def _send_batch(self, batch: list) -> None:
        try:
            for group in _groups(batch):
                await self._send_group(group)
        finally:
            self.in_flight -= 1
            self._pump()

    async def _send_group(self, group: list[tuple[np.ndarray, dict[str, Column], asyncio.Future]]) -> None:
        if len(group) > 1:
            gis = np.concatenate([g for g, _, _ in group])
            columns = {name: Column.cat([c[name] for _, c, _ in group]) for name in group[0][1]}
            try:
                await self.send(gis, columns)
            except Exception:  # noqa: BLE001  (each part is sent again below and gets its own answer)
                pass
            else:
                for _, _, future in group:
                    if not future.done():
                        future.set_result(None)
                return
        for gis, columns, future in group:
            try:
                await self.send(gis, columns)
            except Exception as e:  # noqa: BLE001  (handed to the put's caller)
                if not future.done():
                    future.set_exception(e)
            else:
                if not future.done():
                    future.set_result(None)


def _signature(columns: dict[str, Column]) -> tuple:
    return tuple(sorted((name, c.kind, str(c.dtype), c.rest) for name, c in columns.items()))


def _groups(batch: list) -> list[list]:
    """Consecutive runs of puts with the same fields and disjoint keys (arrival order kept); a put that
    names a key twice goes alone."""
    groups: list[list] = []
    keys = np.empty(0, dtype=np.int64)
    joinable = False
    for item in batch:
        gis = np.asarray(item[0], dtype=np.int64)
        unique = np.unique(gis).size == gis.size
        if (
            groups
            and joinable
            and unique
            and _signature(groups[-1][0][1]) == _signature(item[1])
            and not np.intersect1d(keys, gis).size
        ):
            groups[-1].append(item)
            keys = np.concatenate([keys, gis])
        else:
            groups.append([item])
            keys, joinable = gis, unique
    return groups
