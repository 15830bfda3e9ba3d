"""Random operation sequences against a small reference model of the buffer (hypothesis stateful).

Consume-once (FIFO): every item put comes out exactly once, in order; a refused call (bad size, a
version going backwards, NaN, no room, not enough data) changes nothing. Off-policy (ring): a
sample returns only items still held, and every overwritten item is counted.
"""

import collections
import math

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from conduit import (
    BufferConfig,
    CapacityError,
    Column,
    ColumnBatch,
    ConfigError,
    InsufficientDataError,
    RateLimit,
    Schema,
    ShapeError,
    VersionError,
)
from conduit.build_buffer import build_buffer
from conduit.errors import NonFiniteError

CAPACITY = 8
SCHEMA = Schema([Column("id", torch.int64), Column("reward", torch.float32, check_finite=True)])
SETTINGS = settings(max_examples=40, stateful_step_count=25, deadline=None)


def items(first: int, n: int, bad_reward: bool = False) -> ColumnBatch:
    ids = torch.arange(first, first + n)
    reward = ids.float()
    if bad_reward and n:
        reward[-1] = math.nan
    return ColumnBatch({"id": ids, "reward": reward})


class ConsumeOnce(RuleBasedStateMachine):
    """``BufferConfig(sampler="fifo")`` in error mode against a deque of ids."""

    def __init__(self) -> None:
        super().__init__()
        cfg = BufferConfig(capacity=CAPACITY, sampler="fifo", rate_limit=RateLimit(min_size=0, mode="error"))
        self.buffer = build_buffer(cfg, SCHEMA)
        self.queue: collections.deque[int] = collections.deque()
        self.next_id = 0
        self.version: int | None = None  # the last version written (none yet: any is accepted)
        self.put_in: list[int] = []
        self.taken_out: list[int] = []

    @rule(n=st.integers(0, CAPACITY + 2), step=st.integers(-1, 2), bad=st.booleans())
    def put(self, n: int, step: int, bad: bool) -> None:
        version = (self.version or 0) + step
        expected: type[Exception] | None = None
        if n == 0:
            expected = ShapeError
        elif bad:
            expected = NonFiniteError
        elif n > CAPACITY:
            expected = CapacityError
        elif self.version is not None and version < self.version:
            expected = VersionError
        elif n > CAPACITY - len(self.queue):
            expected = InsufficientDataError
        try:
            self.buffer.extend(items(self.next_id, n, bad), version=version)
        except Exception as e:  # noqa: BLE001 — compared with the model's expectation
            assert expected is not None and isinstance(e, expected), (expected, e)
            return
        assert expected is None, f"expected {expected.__name__}"
        ids = list(range(self.next_id, self.next_id + n))
        self.queue.extend(ids)
        self.put_in += ids
        self.next_id += n
        self.version = version

    @rule(n=st.integers(-1, CAPACITY + 1))
    def sample(self, n: int) -> None:
        try:
            got = self.buffer.sample(n).batch["id"].tolist()
        except ConfigError:
            assert n < 1
            return
        except CapacityError:  # more than a consume-once buffer can ever hold: refused at once
            assert n > CAPACITY
            return
        except InsufficientDataError:
            assert n > len(self.queue)
            return
        want = [self.queue.popleft() for _ in range(n)]
        assert got == want
        self.taken_out += got

    @invariant()
    def counts_match(self) -> None:
        assert len(self.buffer) == len(self.queue)
        assert self.buffer.inserted == len(self.put_in)
        assert self.buffer.sampled == len(self.taken_out)

    def teardown(self) -> None:
        rest = len(self.queue)
        if rest:
            self.taken_out += self.buffer.sample(rest).batch["id"].tolist()
        assert self.taken_out == self.put_in  # every item once, in order: nothing lost or duplicated
        assert sum(self.taken_out) == sum(self.put_in)
        self.buffer.close()


class Ring(RuleBasedStateMachine):
    """Off-policy uniform replay: the newest ``CAPACITY`` items are held, older ones counted as overwritten."""

    def __init__(self) -> None:
        super().__init__()
        self.buffer = build_buffer(
            BufferConfig(capacity=CAPACITY, rate_limit=RateLimit(mode="error")), SCHEMA, seed=0
        )
        self.next_id = 0

    @rule(n=st.integers(1, CAPACITY))
    def put(self, n: int) -> None:
        self.buffer.extend(items(self.next_id, n))
        self.next_id += n

    @precondition(lambda self: self.next_id > 0)
    @rule(n=st.integers(1, 2 * CAPACITY))
    def sample(self, n: int) -> None:
        got = self.buffer.sample(n).batch["id"]
        assert bool((got >= max(0, self.next_id - CAPACITY)).all()) and bool((got < self.next_id).all())

    @invariant()
    def overwritten_are_counted(self) -> None:
        assert len(self.buffer) == min(self.next_id, CAPACITY)
        counted = self.buffer.metrics.totals().get("count/overwritten", 0)
        assert counted == max(0, self.next_id - CAPACITY)


TestConsumeOnce = ConsumeOnce.TestCase
TestConsumeOnce.settings = SETTINGS
TestRing = Ring.TestCase
TestRing.settings = SETTINGS
