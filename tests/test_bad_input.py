"""Bad input the core's other error tests leave out (issue 12): each raises a named ConduitError and
leaves the buffer as it was — size, contents and counters.

``test_core_errors.py`` and ``test_core_defects.py`` cover schema mismatches, dtype and shape, ragged
lengths, oversize writes, bad sizes at ``get``, bad priority shapes and the basic config errors.
"""

import math

import pytest
import torch
from omegaconf import OmegaConf

from conduit import (
    BufferConfig,
    ClosedError,
    Column,
    ColumnBatch,
    Conduit,
    ConfigError,
    ExperienceBuffer,
    Operator,
    PriorityError,
    Ragged,
    RateLimit,
    SchedulerConfig,
    Schema,
    ShapeError,
    VersionError,
)
from conduit.build_buffer import build_buffer
from conduit.errors import NonFiniteError

MODES = ["sync", "async"]
SCHEMA = Schema(
    [
        Column("id", torch.int64),
        Column("reward", torch.float32, check_finite=True),
        Column("adv", torch.float32, ragged=True, max_len=4, check_finite=True),
    ]
)


def batch(
    start: int, n: int, reward: torch.Tensor | None = None, adv: torch.Tensor | None = None
) -> ColumnBatch:
    ids = torch.arange(start, start + n)
    return ColumnBatch(
        {
            "id": ids,
            "reward": ids.float() if reward is None else reward,
            "adv": Ragged.from_lengths(torch.ones(2 * n) if adv is None else adv, torch.full((n,), 2)),
        }
    )


def snapshot(b: ExperienceBuffer) -> tuple:
    state = b.state_dict()
    counters = {k: v for k, v in b.metrics.end_iteration().items() if k.startswith("count/") and v}
    return len(b), b.inserted, b.sampled, {k: v.clone() for k, v in state["storage"].items()}, counters


def assert_same(before: tuple, b: ExperienceBuffer) -> None:
    after = snapshot(b)
    assert before[:3] == after[:3]
    assert before[3].keys() == after[3].keys()
    for key, value in before[3].items():
        assert torch.equal(value, after[3][key]), key
    assert not after[4], f"counters moved: {after[4]}"  # end_iteration reset them at the snapshot


@pytest.fixture
def buf() -> ExperienceBuffer:
    b = build_buffer(
        BufferConfig(capacity=16, sampler="fifo", rate_limit=RateLimit(min_size=0, mode="error")), SCHEMA
    )
    b.extend(batch(0, 3))
    return b


# -- the carrier -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("columns", "match"),
    [
        ({"id": [1, 2]}, "'id' must be a torch.Tensor or a conduit.Ragged, got list"),
        ({"id": torch.tensor(1)}, "'id' is a 0-d tensor"),
        ({"adv": Ragged(torch.ones(2), [0, 2])}, "'adv': Ragged offsets must be"),
    ],
)
def test_a_column_that_is_not_a_column_raises_shape_error(columns, match):
    with pytest.raises(ShapeError, match=match):
        ColumnBatch(columns)


@pytest.mark.parametrize("overlap", MODES)
def test_an_empty_batch_is_refused_at_put_and_at_the_buffer(overlap, buf):
    before = snapshot(buf)
    with pytest.raises(ShapeError, match="empty batch"):
        buf.extend(batch(0, 0))
    assert_same(before, buf)
    with Conduit(SCHEMA, BufferConfig(capacity=16), SchedulerConfig(overlap=overlap)) as c:
        with pytest.raises(ShapeError, match="empty batch"):
            c.put(batch(0, 0))
        c.flush()
        assert c.buffer.inserted == 0


# -- NaN / inf in checked columns --------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_reward_is_rejected_by_default(buf, bad):
    before = snapshot(buf)
    reward = torch.tensor([1.0, bad, 2.0])
    with pytest.raises(NonFiniteError, match=r"checked column\(s\) \{'reward': 1\}"):
        buf.extend(batch(3, 3, reward=reward))
    assert_same(before, buf)


def test_nonfinite_token_advantage_is_rejected(buf):
    before = snapshot(buf)
    adv = torch.ones(6)
    adv[[1, 4]] = math.nan
    with pytest.raises(NonFiniteError, match=r"\{'adv': 2\}"):
        buf.extend(batch(3, 3, adv=adv))
    assert_same(before, buf)


@pytest.mark.parametrize("overlap", MODES)
def test_nonfinite_is_refused_at_put_before_anything_is_queued(overlap):
    with Conduit(SCHEMA, BufferConfig(capacity=16), SchedulerConfig(overlap=overlap)) as c:
        c.put(batch(0, 2))
        with pytest.raises(NonFiniteError):
            c.put(batch(2, 2, reward=torch.tensor([math.inf, 0.0])))
        c.flush()
        assert c.buffer.inserted == 2
        assert c.get(2).batch["reward"].isfinite().all()


def test_nonfinite_advantage_from_an_ingestion_operator_never_reaches_the_buffer():
    def bad_advantage(b: ColumnBatch) -> ColumnBatch:
        adv = b["adv"]
        assert isinstance(adv, Ragged)
        return b.with_columns(adv=Ragged(adv.values / 0.0 * 0.0, adv.offsets))  # 0/0 = NaN

    c = Conduit(SCHEMA, BufferConfig(capacity=16), ingest=[Operator("adv", bad_advantage)])
    with pytest.raises(NonFiniteError, match="'adv'"):
        c.put(batch(0, 2))
    assert c.buffer.inserted == 0 and len(c.buffer) == 0
    c.close()


@pytest.mark.parametrize("overlap", MODES)
def test_nonfinite_count_policy_stores_and_counts(overlap):
    cfg = BufferConfig(capacity=16, sampler="fifo", nonfinite="count", rate_limit=RateLimit(min_size=0))
    with Conduit(SCHEMA, cfg, SchedulerConfig(overlap=overlap)) as c:
        adv = torch.ones(4)
        adv[0] = math.inf
        c.put(batch(0, 2, reward=torch.tensor([math.nan, 1.0]), adv=adv))
        c.flush()
        got = c.get(2).batch
        assert got["id"].tolist() == [0, 1] and got["reward"].isnan().tolist() == [True, False]
        assert c.end_iteration()["count/nonfinite_values"] == 2  # counted once, when stored


def test_check_finite_needs_a_float_column():
    with pytest.raises(ConfigError, match="check_finite applies to floating dtypes"):
        Column("id", torch.int64, check_finite=True)


# -- priorities --------------------------------------------------------------------------------


def prioritized(**kw) -> tuple[ExperienceBuffer, object]:
    schema = Schema([Column("id", torch.int64)])
    b = build_buffer(BufferConfig(capacity=8, sampler="prioritized", **kw), schema, seed=0)
    b.extend(ColumnBatch({"id": torch.arange(8)}))
    s = b.sample(4)
    b.update_priorities(s.slots, s.generations, torch.tensor([1.0, 2.0, 3.0, 4.0]))
    return b, s


def sampler_state(b: ExperienceBuffer) -> list:
    """The sampler's saved state, flattened (compared whole: independent of how it stores priorities)."""

    def flat(x: object) -> list:
        if isinstance(x, dict):
            return [(k, v) for key in sorted(x) for k, v in flat(x[key])]
        return [("", x.clone() if isinstance(x, torch.Tensor) else x)]

    return flat(b.sampler.state_dict())


def same_state(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for (_, x), (_, y) in zip(a, b)
    )


@pytest.mark.parametrize("priority", [-1.0, -1e-9])
def test_negative_priorities_are_refused(priority):
    b, s = prioritized()
    before = sampler_state(b)
    with pytest.raises(PriorityError, match="priorities must be >= 0"):
        b.update_priorities(s.slots, s.generations, torch.tensor([1.0, priority, 1.0, 1.0]))
    assert same_state(before, sampler_state(b))


def test_zero_priorities_are_allowed_and_every_item_stays_drawable():
    b, _ = prioritized()
    s = b.sample(8)
    b.update_priorities(s.slots, s.generations, torch.zeros(8))
    again = b.sample(64)
    assert again.weights is not None and bool(torch.isfinite(again.weights).all())


def test_nonfinite_priorities_count_policy_skips_and_counts_them():
    b, s = prioritized(nonfinite="count")
    twin, _ = prioritized(nonfinite="count")
    b.metrics.end_iteration()
    applied = b.update_priorities(s.slots, s.generations, torch.tensor([math.nan, 5.0, math.inf, 5.0]))
    twin.update_priorities(s.slots[[1, 3]], s.generations[[1, 3]], torch.tensor([5.0, 5.0]))
    assert applied == 2
    assert same_state(sampler_state(b), sampler_state(twin))  # as if only the finite ones were sent
    counts = b.metrics.end_iteration()
    assert counts["count/nonfinite_priorities"] == 2
    assert "count/priority_updates_skipped" not in counts


def test_priority_slots_that_are_not_tensors_raise_shape_error():
    b, s = prioritized()
    with pytest.raises(ShapeError, match="slots must be a tensor, got list"):
        b.update_priorities([0, 1], s.generations[:2], torch.ones(2))  # type: ignore[arg-type]


# -- versions, sizes, close --------------------------------------------------------------------


def test_a_version_going_backwards_is_refused_by_the_buffer_itself(buf):
    buf.extend(batch(3, 1), version=5)
    before = snapshot(buf)
    with pytest.raises(VersionError, match=r"backwards \(5 -> 4\)"):
        buf.extend(batch(4, 1), version=4)
    with pytest.raises(VersionError, match="must be an int"):
        buf.extend(batch(4, 1), version="6")  # type: ignore[arg-type]
    assert_same(before, buf)
    buf.extend(batch(4, 1), version=5)  # the same version again is fine


@pytest.mark.parametrize("size", [0, -1, 1.0, None])
def test_bad_sample_sizes_at_the_buffer(buf, size):
    before = snapshot(buf)
    with pytest.raises(ConfigError, match="batch size must be an int >= 1"):
        buf.sample(size)
    assert_same(before, buf)


@pytest.mark.parametrize("num_epochs", [0, -2])
def test_get_epochs_with_no_epochs(num_epochs):
    with Conduit(SCHEMA, BufferConfig(capacity=16)) as c:
        c.put(batch(0, 4))
        with pytest.raises(ConfigError, match="batch size must be an int >= 1"):
            c.get_epochs(4, num_epochs=num_epochs)


@pytest.mark.parametrize("overlap", MODES)
def test_every_call_after_close_raises_closed_error(overlap):
    cfg = BufferConfig(capacity=16, sampler="prioritized")
    c = Conduit(SCHEMA, cfg, SchedulerConfig(overlap=overlap))
    c.put(batch(0, 4))
    d = c.get(2)
    state = c.state_dict()
    c.close()
    calls = {
        "put": lambda: c.put(batch(4, 1)),
        "flush": c.flush,
        "get": lambda: c.get(1),
        "get_epochs": lambda: c.get_epochs(2, num_epochs=1),
        "update_priorities": lambda: c.update_priorities(d, torch.ones(2)),
        "state_dict": c.state_dict,
        "load_state_dict": lambda: c.load_state_dict(state),
        "buffer.extend": lambda: c.buffer.extend(batch(4, 1)),
        "buffer.sample": lambda: c.buffer.sample(1),
        "buffer.update_priorities": lambda: c.buffer.update_priorities(d.slots, d.generations, torch.ones(2)),
    }
    for name, call in calls.items():
        with pytest.raises(ClosedError):
            call()
        assert c.buffer.inserted == 4, name
    c.close()  # a second close is a no-op


# -- configs: Python and hydra -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (
            lambda: BufferConfig.on_policy(8, journal_dir="/tmp/x"),
            r"unknown BufferConfig key\(s\) \['journal_dir'\]",
        ),
        (lambda: BufferConfig.prioritized_replay(8, alpa=0.5), r"unknown BufferConfig key\(s\) \['alpa'\]"),
        (lambda: BufferConfig.uniform_replay(8, sampler="fifo"), r"this preset sets \['sampler'\] itself"),
        (lambda: BufferConfig.on_policy(8, group_size="4"), "group_size must be an int"),
        (lambda: BufferConfig.from_dict([("capacity", 8)]), "from_dict takes a dict, got list"),
        (lambda: BufferConfig(nonfinite="ignore"), r"nonfinite must be one of \('reject', 'count'\)"),
        (lambda: RateLimit(timeout_s=math.inf), "timeout_s must be a finite number > 0"),
        (lambda: RateLimit(timeout_s="10"), "timeout_s must be a finite number > 0"),
        (lambda: Column("obs", torch.float32, "4"), "shape must be a tuple of ints"),
        (lambda: Column("obs", torch.float32, (2.5,)), "shape must be a tuple of ints"),
        (lambda: Column("tok", torch.int64, ragged=True, max_len=8.0), "needs an int max_len"),
        (lambda: Column("tok", torch.int64, ragged=1, max_len=8), "ragged must be a bool"),
        (lambda: Schema(Column("obs", torch.float32)), "iterable of Column"),
        (lambda: SchedulerConfig.from_dict({"depth": "2"}), "depth must be an int"),
    ],
)
def test_bad_python_configs_raise_config_error(build, match):
    with pytest.raises(ConfigError, match=match):
        build()


@pytest.mark.parametrize(
    ("yaml", "match"),
    [
        ("capacity: 8\nrate_limit: {mode: wait}", "rate_limit.mode must be one of"),
        ("capacity: 8\nrate_limit: {min_sz: 1}", r"unknown RateLimit key\(s\) \['min_sz'\]"),
        ("capacity: '8'", "capacity must be an int"),
        ("capasity: 8", r"unknown BufferConfig key\(s\) \['capasity'\]"),
        ("nonfinite: drop", "nonfinite must be one of"),
    ],
)
def test_bad_hydra_configs_raise_config_error(yaml, match):
    with pytest.raises(ConfigError, match=match):
        BufferConfig.from_dict(OmegaConf.create(yaml))


def test_a_hydra_config_builds_the_same_buffer_config():
    cfg = OmegaConf.create(
        "capacity: 8\nsampler: fifo\nnonfinite: count\nrate_limit: {min_size: 0, mode: error}"
    )
    assert BufferConfig.from_dict(cfg) == BufferConfig(
        capacity=8, sampler="fifo", nonfinite="count", rate_limit=RateLimit(min_size=0, mode="error")
    )
