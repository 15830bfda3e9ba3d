"""The cost model: the fit recovers known costs; predictions compose and move the way they must."""

from __future__ import annotations

import dataclasses
import math

import pytest

from conduit.costmodel import (
    CostWindow,
    IterationModel,
    Knobs,
    OperatorCost,
    OverlapCosts,
    Sample,
    Workload,
    calibrate_overlap,
    fit_slowed,
    stream_end,
)
from conduit.errors import ConfigError


def test_fit_recovers_fixed_per_item_and_per_byte_costs() -> None:
    truth = OperatorCost(a=2e-4, b=3e-6, per_byte=1e-9)
    samples = [Sample(1, n, n * s, truth.seconds(n, n * s)) for n in (8, 64, 256) for s in (16, 400)]
    fit = OperatorCost.fit(samples)
    assert (
        fit.a == pytest.approx(2e-4) and fit.b == pytest.approx(3e-6) and fit.per_byte == pytest.approx(1e-9)
    )


def test_fit_with_a_measured_bandwidth_subtracts_the_bytes_and_takes_totals() -> None:
    truth = OperatorCost(a=1e-3, b=5e-6, per_byte=1 / 2e9)
    # per-iteration totals: several calls per sample
    samples = [
        Sample(c, c * n, c * n * 100, truth.seconds(c * n, c * n * 100, calls=c))
        for c, n in ((4, 8), (2, 64))
    ]
    fit = OperatorCost.fit(samples, bandwidth=2e9)
    assert fit.a == pytest.approx(1e-3) and fit.b == pytest.approx(5e-6) and fit.per_byte == 1 / 2e9


def test_fit_keeps_costs_non_negative_and_splits_one_size_evenly() -> None:
    noisy = [Sample(1, n, 0, 0.5 - 0.001 * n) for n in (1, 10, 100)]  # falls with size: no per-item term
    fit = OperatorCost.fit(noisy)
    assert fit.b == 0.0 and fit.a == pytest.approx(sum(s.seconds for s in noisy) / 3)
    one_size = [Sample(1, 4, 0, 0.2), Sample(1, 4, 0, 0.4)]
    fit = OperatorCost.fit(one_size)
    assert fit.a == pytest.approx(0.15) and fit.b == pytest.approx(0.15 / 4)
    assert fit.seconds(4) == pytest.approx(0.3)  # the mean is kept


def test_bad_measurements_raise_naming_the_value() -> None:
    with pytest.raises(ConfigError, match="seconds"):
        Sample(1, 4, 0, math.nan)
    with pytest.raises(ConfigError, match="calls"):
        Sample(0, 4, 0, 1.0)
    with pytest.raises(ConfigError, match="no measurements"):
        OperatorCost.fit([])
    with pytest.raises(ConfigError, match="bandwidth"):
        OperatorCost.fit([Sample(1, 1, 1, 1.0)], bandwidth=0.0)
    with pytest.raises(ConfigError, match="g_del"):
        Knobs(g_del=0)
    with pytest.raises(ConfigError, match="overlap"):
        Knobs(overlap="auto")
    with pytest.raises(ConfigError, match="batches"):
        Workload(0.1, 0.1, 1, 1, 0, 1, 1)


def test_window_keeps_the_latest_samples() -> None:
    window = CostWindow(2)
    window.record(1, 1, 9.0)  # pushed out
    window.record(1, 2, 0.3)
    window.record(1, 4, 0.5)
    assert len(window) == 2
    fit = window.fit()
    assert fit.a == pytest.approx(0.1) and fit.b == pytest.approx(0.1)


WORK = Workload(
    producer_s=0.02, consumer_s=0.03, fragments=8, fragment_items=32, batches=4, batch_size=64, item_bytes=64
)
ING = OperatorCost(a=1e-3, b=2e-6)
DEL = OperatorCost(a=2e-3, b=4e-6)


def _model(**kw: object) -> IterationModel:
    return IterationModel(WORK, ING, DEL, **kw)  # type: ignore[arg-type]


def test_sync_composition_adds_every_term_to_the_compute() -> None:
    p = _model(call_s=1e-5).predict(Knobs("sync", g_del=2))
    ing = 8 * ING.seconds(32)
    dels = 2 * DEL.seconds(128)
    assert p.exposed_s == pytest.approx(ing + dels + 8 * 1e-5)  # a fixed cost per put
    assert p.wall_s == pytest.approx(0.05 + p.exposed_s)
    assert p.staleness.data_lag_puts == 0 and p.staleness.sample_ahead_batches == 1


def test_async_hides_what_fits_under_compute_and_pays_the_interference() -> None:
    hidden = _model().predict(Knobs("async", depth=4, g_ing=4, g_del=1))
    assert hidden.wall_s == pytest.approx(0.05) and hidden.exposed_s == pytest.approx(0.0)
    assert hidden.staleness.data_lag_puts == 16 and hidden.staleness.sample_ahead_batches == 4
    shared = _model(interference=0.5).predict(Knobs("async", depth=4, g_ing=4, g_del=1))
    work = 2 * ING.seconds(128) + 4 * DEL.seconds(64)
    assert shared.exposed_s == pytest.approx(0.5 * work)
    # background slower than the iteration: the slower thread sets the pace
    slow = IterationModel(WORK, OperatorCost(a=0.1, b=0.0), DEL).predict(Knobs("async", g_ing=1))
    assert slow.wall_s == pytest.approx(8 * 0.1)


def test_async_delivery_stalls_when_one_call_outlasts_what_is_ready() -> None:
    heavy = IterationModel(WORK, ING, OperatorCost(a=0.03, b=0.0))  # a call outlasts the 12.5 ms between gets
    shallow = heavy.predict(Knobs("async", depth=1, g_del=1))
    deep = heavy.predict(Knobs("async", depth=8, g_del=4))
    assert shallow.exposed_s > deep.exposed_s
    assert deep.staleness.sample_ahead_batches > shallow.staleness.sample_ahead_batches


def test_predictions_are_monotone_in_costs_and_in_sync_granularity() -> None:
    knobs = [Knobs("sync", g_del=g) for g in (1, 2, 4)] + [Knobs("async", 2, g, 2) for g in (1, 2, 8)]
    for k in knobs:
        base = _model(interference=0.3).predict(k)
        for bigger in (
            dataclasses.replace(_model(interference=0.3), ingest=OperatorCost(2e-3, 2e-6)),
            dataclasses.replace(_model(interference=0.3), deliver=OperatorCost(2e-3, 8e-6)),
            _model(interference=0.6),
        ):
            assert bigger.predict(k).wall_s >= base.wall_s - 1e-12
    # a fixed cost per call: fewer, larger delivery calls are cheaper inline
    sync = [_model().predict(Knobs("sync", g_del=g)).wall_s for g in (1, 2, 4)]
    assert sync[0] > sync[1] > sync[2]


def test_placement_uses_its_measured_bandwidth() -> None:
    model = _model(bandwidths={"host": 1e9, "disk": 1e8})
    host, disk = model.predict(Knobs(placement="host")), model.predict(Knobs(placement="disk"))
    assert disk.wall_s - host.wall_s == pytest.approx(4 * 64 * 64 * (1 / 1e8 - 1 / 1e9))
    with pytest.raises(ConfigError, match="cuda:0"):
        model.predict(Knobs(placement="cuda:0"))


def test_overlap_costs_are_fitted_to_measured_async_iterations() -> None:
    # 16 gets, 3.1 ms apart: a delivery thread woken 1 ms late cannot keep up one batch a call; two
    # batch sizes, so that the work (sigma) moves apart from the calls (w_i, w_d)
    work = dataclasses.replace(WORK, batches=16)
    model = IterationModel(work, ING, DEL)
    big = IterationModel(dataclasses.replace(work, batch_size=256), ING, DEL)
    runs = [
        Knobs("async", depth=4, g_ing=4, g_del=1),
        Knobs("async", depth=2, g_ing=1, g_del=1),
        Knobs("async", depth=8, g_ing=1, g_del=8),
        Knobs("async", depth=8, g_ing=8, g_del=4),
    ]
    costs = OverlapCosts(interference=0.25, wake_ingest_s=3e-4, wake_deliver_s=1e-3, handoff_s=5e-5)
    truth = model.with_overlap(costs)
    assert [truth.predict(k).terms["deliver_calls"] for k in runs] == [16, 16, 8, 8]
    measured = [(m, k, m.with_overlap(costs).predict(k).wall_s) for m in (model, big) for k in runs]
    fitted = calibrate_overlap(measured)
    for name, value in dataclasses.asdict(costs).items():
        assert getattr(fitted, name) == pytest.approx(value), name
    work_s, ing_calls, del_calls = model.background(runs[1])
    assert (ing_calls, del_calls) == (8, 16)
    assert work_s == pytest.approx(8 * ING.seconds(32) + 16 * DEL.seconds(64))
    # one run: the hand-off alone; faster than predicted: no negative costs
    one = calibrate_overlap(measured[:1])
    assert one.interference == one.wake_ingest_s == one.wake_deliver_s == 0.0 and one.handoff_s > 5e-5
    assert calibrate_overlap([(model, runs[0], 0.01)]) == OverlapCosts()
    with pytest.raises(ConfigError, match="async"):
        calibrate_overlap([(model, Knobs("sync"), 0.1)])


def test_ingestion_and_delivery_calls_cost_the_caller_separately() -> None:
    slow_del = OperatorCost(a=0.015, b=0.0)  # outlasts the 12.5 ms between gets: g_del 8 takes 2 a call
    ing_heavy = IterationModel(WORK, ING, slow_del, wake_ingest_s=1e-3)
    del_heavy = IterationModel(WORK, ING, slow_del, wake_deliver_s=1e-3)
    many_ing, many_del = Knobs("async", 8, g_ing=1, g_del=8), Knobs("async", 8, g_ing=8, g_del=1)
    # each thread's calls are charged at their own rate
    assert ing_heavy.predict(many_ing).terms["shared_s"] == pytest.approx(8 * 1e-3)
    assert ing_heavy.predict(many_del).terms["shared_s"] == pytest.approx(1 * 1e-3)
    assert del_heavy.predict(many_ing).terms["shared_s"] == pytest.approx(2 * 1e-3)
    assert del_heavy.predict(many_del).terms["shared_s"] == pytest.approx(4 * 1e-3)
    # a hand-off per get: async pays it on every get, sync (inline) never
    handoff = _model(handoff_s=1e-3)
    assert handoff.predict(many_del).exposed_s == pytest.approx(4 * 1e-3)
    assert handoff.predict(Knobs("sync")).exposed_s == _model().predict(Knobs("sync")).exposed_s


def test_stream_end_replays_the_streaming_schedule() -> None:
    cost = OperatorCost(1.0, 0.1)
    finish = [1.0, 2.0, 3.0, 4.0]
    assert stream_end(finish, 4, cost, 1) == pytest.approx(5.4)
    assert stream_end(finish, 2, cost, 1) == pytest.approx(5.2)


def test_fit_slowed_separates_contention_from_cost() -> None:
    """Light pieces ingested beside generation ran 2x slower; heavy ones after it did not. One line
    through all of them reads the slowdown as cost (no per-item term); the joint fit recovers both."""
    truth = OperatorCost(0.05, 0.001)
    light = [Sample(1, n, 0, 2.0 * truth.seconds(n)) for n in (200, 250, 300, 350)]
    heavy = [Sample(1, n, 0, truth.seconds(n)) for n in (400, 450)]
    samples, slowed = light + heavy, [True] * 4 + [False] * 2
    naive = OperatorCost.fit(samples)
    assert naive.b == 0.0 and naive.a > 0.5  # slope gone, fixed cost inflated 10x
    cost, k = fit_slowed(samples, slowed)
    assert k == pytest.approx(2.0)
    assert cost.a == pytest.approx(0.05) and cost.b == pytest.approx(0.001)
    window = CostWindow(8)
    for s, o in zip(samples, slowed, strict=True):
        window.record(s.calls, s.items, s.seconds, slowed=o)
    assert window.fit_slowed()[1] == pytest.approx(2.0)


def test_fit_slowed_is_the_plain_fit_with_one_kind_and_checks_its_flags() -> None:
    samples = [Sample(1, n, 0, 0.1 + 0.01 * n) for n in (1, 4, 9)]
    for flags in ([False] * 3, [True] * 3):
        cost, k = fit_slowed(samples, flags)
        assert k == 1.0 and cost == OperatorCost.fit(samples)
    with pytest.raises(ConfigError, match="slowed flags"):
        fit_slowed(samples, [True])


def test_stream_end_slows_pieces_while_generation_runs() -> None:
    cost = OperatorCost(0.0, 1.0)
    # generation ends at 4: a piece of 1 group from 1 takes 2 s (ends 3), the next from 3 runs 1 s
    # slowed (half its work) then the other half at full speed: ends 4.5; the last from 4.5: 5.5
    assert stream_end([1.0, 3.0, 4.0], 1, cost, 1, slowdown=2.0) == pytest.approx(5.5)
    assert stream_end([1.0, 3.0, 4.0], 1, cost, 1) == pytest.approx(5.0)
    # one whole-batch piece starts when generation has ended: never slowed
    assert stream_end([1.0, 3.0, 4.0], 3, cost, 1, slowdown=3.0) == pytest.approx(7.0)


def test_fit_keeps_the_per_byte_term_when_every_call_has_the_same_items() -> None:
    """Pieces of four groups each whose token counts vary: items cannot be told from the fixed cost,
    bytes can; the per-item term is left out, not the per-byte one."""
    samples = [Sample(1, 4, m, 0.02 + 0.001 * m) for m in (300.0, 500.0, 900.0)]
    cost = OperatorCost.fit(samples)
    assert (cost.a, cost.b, cost.per_byte) == pytest.approx((0.02, 0.0, 0.001))
    # bytes moving with items: the per-byte term is left out, as before
    moving = [Sample(1, n, 8 * n, 0.1 + 0.01 * n) for n in (1, 4, 9)]
    assert OperatorCost.fit(moving) == OperatorCost(pytest.approx(0.1), pytest.approx(0.01), 0.0)


def test_stream_end_charges_each_piece_per_group_and_per_work() -> None:
    cost = OperatorCost(0.1, 0.05, 0.01)  # per piece, per group, per token
    # g=2 over [1, 2] and [3, 4] with 10 / 100 tokens per group: the first piece ends at 2 + 0.1 +
    # 0.1 + 0.2 = 2.4, the last at 4 + 0.1 + 0.1 + 2.0
    assert stream_end([1.0, 2.0, 3.0, 4.0], 2, cost, 1, [10.0, 10.0, 100.0, 100.0]) == pytest.approx(6.2)
