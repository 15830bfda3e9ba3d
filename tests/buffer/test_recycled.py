"""HostPool: memory comes back only when the last view is gone, and is reused."""

from __future__ import annotations

import gc
import threading

import torch

from conduit.buffer.recycled import MIN_POOLED_BYTES, HostPool, size_class


def test_size_classes_waste_at_most_an_eighth():
    for n in (9, 100, 4097, MIN_POOLED_BYTES, 10**6 + 1, 3 * 2**30 + 7):
        c = size_class(n)
        assert n <= c <= n * 1.125 + 8


def test_a_block_returns_only_after_every_view_is_freed_and_is_then_reused():
    pool = HostPool()
    t = pool.empty((1000, 100), torch.float32)
    t.fill_(2.0)
    view = t[3]
    nested = torch.nested.nested_tensor_from_jagged(t.view(-1), torch.tensor([0, 40, 100_000]))
    del t
    gc.collect()
    assert pool.free_bytes == 0
    del nested
    gc.collect()
    assert pool.free_bytes == 0  # `view` still uses the block
    assert float(view.sum()) == 200.0
    del view
    gc.collect()
    assert pool.free_bytes == size_class(400_000)
    again = pool.empty((100_000,), torch.float32)
    assert pool.stats()["hits"] == 1 and pool.free_bytes == 0
    assert float(again.sum()) == 200_000.0  # the same pages (uninitialised memory, as torch.empty)


def test_small_requests_and_the_free_cap_bypass_the_pool():
    pool = HostPool(max_free_bytes=MIN_POOLED_BYTES * 2)
    small = pool.empty((8,), torch.int64)
    assert pool.stats()["misses"] == 0
    big = [pool.empty((MIN_POOLED_BYTES,), torch.uint8) for _ in range(3)]
    del big, small
    gc.collect()
    assert pool.free_bytes <= MIN_POOLED_BYTES * 2


def test_threads_taking_and_dropping_at_once_never_share_a_block():
    pool = HostPool()
    errors: list[str] = []

    def work(k: int) -> None:
        for i in range(200):
            t = pool.empty((MIN_POOLED_BYTES // 8,), torch.int64)
            t.fill_(k * 1000 + i)
            if int(t.min()) != int(t.max()):
                errors.append(f"thread {k}: block shared")
            del t

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert pool.stats()["hits"] > 0
