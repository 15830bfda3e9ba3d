"""Every bad input named in the core issue raises its own ConduitError and leaves the buffer unchanged."""

import pytest
import torch

import conduit
from conduit import (
    BufferConfig,
    CapacityError,
    ClosedError,
    Column,
    ColumnBatch,
    Conduit,
    ConfigError,
    DeviceUnavailableError,
    DTypeError,
    ExperienceBuffer,
    InsufficientDataError,
    Ragged,
    RaggedLengthError,
    RateLimit,
    SchedulerConfig,
    Schema,
    SchemaError,
    ShapeError,
)
from conduit.build_buffer import build_buffer

SCHEMA = Schema(
    [
        Column("obs", torch.float32, (4,)),
        Column("reward", torch.float32),
        Column("tok", torch.int64, ragged=True, max_len=5),
    ]
)


def good(n: int = 3) -> ColumnBatch:
    return ColumnBatch(
        {
            "obs": torch.ones(n, 4),
            "reward": torch.ones(n),
            "tok": Ragged.from_lengths(torch.arange(2 * n), torch.full((n,), 2)),
        }
    )


@pytest.fixture
def buf() -> ExperienceBuffer:
    b = build_buffer(BufferConfig(capacity=16, rate_limit=RateLimit(mode="error")), SCHEMA)
    b.extend(good())
    return b


def assert_unchanged(b: ExperienceBuffer) -> None:
    assert b.inserted == 3 and len(b) == 3
    assert torch.equal(b.storage.data["obs"][:3], torch.ones(3, 4))
    assert b.storage.data["obs"][3:].abs().sum() == 0


def test_missing_column(buf):
    bad = good().select(["obs", "reward"])
    with pytest.raises(SchemaError, match=r"missing columns \['tok'\]"):
        buf.extend(bad)
    assert_unchanged(buf)


def test_extra_column(buf):
    with pytest.raises(SchemaError, match=r"extra columns \['bonus'\]"):
        buf.extend(good().with_columns(bonus=torch.zeros(3)))
    assert_unchanged(buf)


def test_wrong_dtype(buf):
    with pytest.raises(DTypeError, match="'reward'.*float32.*float64"):
        buf.extend(good().with_columns(reward=torch.ones(3, dtype=torch.float64)))
    assert_unchanged(buf)


def test_wrong_shape(buf):
    with pytest.raises(ShapeError, match=r"'obs'.*\(4,\).*\(5,\)"):
        buf.extend(good().with_columns(obs=torch.ones(3, 5)))
    assert_unchanged(buf)


def test_item_count_mismatch():
    with pytest.raises(ShapeError, match="disagree"):
        ColumnBatch({"obs": torch.ones(3, 4), "reward": torch.ones(2)})


def test_ragged_item_too_long(buf):
    tok = Ragged.from_lengths(torch.arange(9), torch.tensor([1, 6, 2]))
    with pytest.raises(RaggedLengthError, match="length 6 > max_len 5"):
        buf.extend(good().with_columns(tok=tok))
    assert_unchanged(buf)


def test_item_larger_than_tier_capacity():
    with pytest.raises(CapacityError, match="one item needs"):
        build_buffer(BufferConfig(capacity=4, capacity_bytes=32), SCHEMA)


def test_write_larger_than_capacity(buf):
    with pytest.raises(CapacityError, match="exceeds the buffer capacity"):
        buf.extend(good(17))
    assert_unchanged(buf)


def test_sampling_more_than_available_in_error_mode():
    b = build_buffer(BufferConfig(capacity=16, sampler="fifo", rate_limit=RateLimit(mode="error")), SCHEMA)
    b.extend(good())
    with pytest.raises(InsufficientDataError, match="requested 5 items but only 3"):
        b.sample(5)
    assert len(b) == 3  # nothing consumed
    assert b.sample(3).batch.size == 3


def test_min_size_in_error_mode():
    b = build_buffer(BufferConfig(capacity=16, rate_limit=RateLimit(min_size=10, mode="error")), SCHEMA)
    b.extend(good())
    with pytest.raises(InsufficientDataError, match="min_size=10"):
        b.sample(1)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"capacty": 10}, r"unknown BufferConfig key\(s\) \['capacty'\]"),
        ({"capacity": 0}, "capacity must be an int >= 1"),
        ({"tier": "gpu"}, "unknown tier 'gpu'"),
        ({"sampler": "lifo"}, "sampler must be one of"),
        ({"rate_limit": {"mode": "wait"}}, "rate_limit.mode"),
        ({"rate_limit": {"min_sz": 1}}, r"unknown RateLimit key\(s\) \['min_sz'\]"),
        ({"alpha": -1}, "alpha must be a finite number >= 0"),
    ],
)
def test_bad_buffer_config(data, match):
    with pytest.raises(ConfigError, match=match):
        BufferConfig.from_dict(data)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"overlap": "maybe"}, "overlap must be one of"),
        ({"depth": 0}, r"depth must be an int in \[1, 1024\]"),
        ({"g_ing": 0}, "g_ing"),
        ({"g_del": 10_000}, "g_del"),
        ({"granularity": 2}, "unknown SchedulerConfig key"),
    ],
)
def test_bad_scheduler_config(data, match):
    with pytest.raises(ConfigError, match=match):
        SchedulerConfig.from_dict(data)


@pytest.mark.parametrize("overlap", ["sync", "async"])
def test_use_after_close(overlap):
    c = Conduit(SCHEMA, BufferConfig(capacity=16), SchedulerConfig(overlap=overlap))
    c.put(good())
    c.close()
    with pytest.raises(ClosedError):
        c.put(good())
    with pytest.raises(ClosedError):
        c.get(1)
    with pytest.raises(ClosedError):
        c.buffer.sample(1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
@pytest.mark.parametrize("tier", ["cuda", "cuda:0", "pinned"])
def test_cuda_tier_without_cuda(tier):
    with pytest.raises(DeviceUnavailableError, match="needs CUDA"):
        build_buffer(BufferConfig(capacity=4, tier=tier), SCHEMA)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_delivery_without_cuda():
    with pytest.raises(DeviceUnavailableError):
        Conduit(SCHEMA, device="cuda")


def test_every_error_is_a_conduit_error():
    names = [n for n in conduit.__all__ if n.endswith("Error")]
    assert len(names) >= 10
    for n in names:
        assert issubclass(getattr(conduit, n), conduit.ConduitError)
