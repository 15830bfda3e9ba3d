"""Tests of conduit.metrics: exposed accounting, iteration reset, logger keys and the trace export."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from conduit.metrics import Metrics


def _load(m: Metrics, tmp_path: Path) -> list[dict]:
    path = tmp_path / "trace.json"
    m.export_trace(path)
    doc = json.loads(path.read_text())
    assert doc["displayTimeUnit"] == "ms"
    return doc["traceEvents"]


def test_add_time_exposed_and_background() -> None:
    m = Metrics()
    m.add_time("get", 0.5, exposed=True)
    m.add_time("get", 0.25, exposed=True)
    m.add_time("ingest", 0.125)
    it = m.end_iteration()
    assert it["exposed_s"] == pytest.approx(0.75)
    assert it["op/get_s"] == pytest.approx(0.75)
    assert it["op/get_calls"] == 2.0
    assert it["op/ingest_s"] == pytest.approx(0.125)
    assert it["op/ingest_calls"] == 1.0


def test_nested_exposed_spans_count_only_the_outermost() -> None:
    m = Metrics()
    with m.span("sample", exposed=True):
        time.sleep(0.01)
        with m.span("collate", exposed=True):
            time.sleep(0.01)
            with m.span("h2d", exposed=True):
                time.sleep(0.005)
        m.add_time("external", 1.0, exposed=True)  # inside an exposed span: not counted again
    it = m.end_iteration()
    # exposed is exactly the outer span, not outer + inner + external
    assert it["exposed_s"] == it["op/sample_s"]
    assert it["op/sample_s"] >= 0.025
    assert it["op/collate_s"] >= 0.015
    assert it["op/h2d_s"] >= 0.005
    assert it["op/external_s"] == pytest.approx(1.0)
    assert it["exposed_s"] < it["op/sample_s"] + it["op/collate_s"]


def test_background_span_inside_exposed_and_exposed_inside_background() -> None:
    m = Metrics()
    with m.span("get", exposed=True):
        with m.span("decode"):
            time.sleep(0.002)
    with m.span("worker"):
        with m.span("put", exposed=True):
            time.sleep(0.002)
    it = m.end_iteration()
    assert it["exposed_s"] == pytest.approx(it["op/get_s"] + it["op/put_s"])
    assert it["op/worker_s"] >= it["op/put_s"]


def test_exception_inside_span_is_recorded_and_depth_unwinds() -> None:
    m = Metrics()
    with pytest.raises(RuntimeError):
        with m.span("get", exposed=True):
            raise RuntimeError("boom")
    m.add_time("put", 0.5, exposed=True)  # the failed span must not leave the thread "inside"
    it = m.end_iteration()
    assert it["op/get_calls"] == 1.0
    assert it["exposed_s"] == pytest.approx(it["op/get_s"] + 0.5)


def test_two_threads_overlap_op_time_sums_exposed_only_exposed(tmp_path: Path) -> None:
    m = Metrics()
    barrier = threading.Barrier(2)

    def learner() -> None:
        barrier.wait()
        with m.span("get", exposed=True):
            time.sleep(0.05)

    def ingest() -> None:
        barrier.wait()
        with m.span("ingest"):
            time.sleep(0.05)

    threads = [
        threading.Thread(target=learner, name="learner"),
        threading.Thread(target=ingest, name="ingest-worker"),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    it = m.end_iteration()
    assert it["op/get_s"] >= 0.05 and it["op/ingest_s"] >= 0.05
    assert it["exposed_s"] == it["op/get_s"]
    events = _load(m, tmp_path)
    xs = {e["name"]: e for e in events if e["ph"] == "X"}
    get, ing = xs["get"], xs["ingest"]
    assert get["tid"] != ing["tid"]
    assert get["ts"] < ing["ts"] + ing["dur"] and ing["ts"] < get["ts"] + get["dur"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    assert names[get["tid"]] == "learner" and names[ing["tid"]] == "ingest-worker"


def test_exposed_depth_is_per_thread() -> None:
    """Two threads blocked at the same time both count: nesting is judged within a thread only."""
    m = Metrics()
    barrier = threading.Barrier(2)

    def blocked(name: str) -> None:
        barrier.wait()
        with m.span(name, exposed=True):
            time.sleep(0.03)

    threads = [threading.Thread(target=blocked, args=(n,)) for n in ("get", "put")]
    with m.span("outer", exposed=True):  # the main thread is blocked too while it waits
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    it = m.end_iteration()
    assert it["exposed_s"] == pytest.approx(it["op/get_s"] + it["op/put_s"] + it["op/outer_s"])
    assert it["exposed_s"] >= 0.09


def test_end_iteration_resets_but_totals_keep() -> None:
    m = Metrics()
    m.add_time("get", 0.5, exposed=True)
    m.add_bytes("host->cuda:0", 100)
    m.incr("inserted", 3)
    m.set_gauge("depth", 4)
    first = m.end_iteration()
    assert first["exposed_s"] == pytest.approx(0.5)
    second = m.end_iteration()
    assert second["exposed_s"] == 0.0
    # additive keys stay present (zero) so logger columns are stable; gauges only when sampled
    assert second["op/get_s"] == 0.0 and second["op/get_calls"] == 0.0
    assert second["bytes/host->cuda:0"] == 0.0
    assert second["count/inserted"] == 0.0
    assert "queue/depth_max" not in second
    m.add_time("get", 0.25, exposed=True)
    m.add_bytes("host->cuda:0", 50)
    m.set_gauge("depth", 2)
    tot = m.totals()
    assert tot["exposed_s"] == pytest.approx(0.75)
    assert tot["op/get_s"] == pytest.approx(0.75)
    assert tot["op/get_calls"] == 2.0
    assert tot["bytes/host->cuda:0"] == 150.0
    assert tot["count/inserted"] == 3.0
    assert tot["queue/depth_max"] == 4.0 and tot["queue/depth_last"] == 2.0
    assert m.end_iteration()["op/get_s"] == pytest.approx(0.25)  # totals() did not reset anything
    assert m.totals()["op/get_s"] == pytest.approx(0.75)


def test_iteration_wall_time() -> None:
    m = Metrics()
    time.sleep(0.02)
    a = m.end_iteration()["iteration_wall_s"]
    time.sleep(0.01)
    b = m.end_iteration()["iteration_wall_s"]
    assert 0.02 <= a < 5.0
    assert 0.01 <= b < 5.0
    assert m.totals()["iteration_wall_s"] >= a + b


def test_bytes_gauges_counters_keys() -> None:
    m = Metrics()
    m.add_bytes("host->cuda:0", 1024)
    m.add_bytes("host->cuda:0", 1024)
    m.add_bytes("cuda:0->host", 7)
    for v in (3, 9, 5):
        m.set_gauge("ingest", v)
    m.incr("inserted")
    m.incr("inserted", 4)
    m.incr("stale_evicted", 2)
    it = m.end_iteration()
    assert it["bytes/host->cuda:0"] == 2048.0
    assert it["bytes/cuda:0->host"] == 7.0
    assert it["queue/ingest_max"] == 9.0
    assert it["queue/ingest_last"] == 5.0
    assert it["count/inserted"] == 5.0
    assert it["count/stale_evicted"] == 2.0
    assert it["count/trace_events_dropped"] == 0.0
    assert set(it) == {
        "exposed_s",
        "iteration_wall_s",
        "bytes/host->cuda:0",
        "bytes/cuda:0->host",
        "queue/ingest_max",
        "queue/ingest_last",
        "count/inserted",
        "count/stale_evicted",
        "count/trace_events_dropped",
    }
    assert all(isinstance(v, float) for v in it.values())


def test_invalid_arguments() -> None:
    m = Metrics()
    with pytest.raises(ValueError):
        m.add_time("get", -1.0)
    with pytest.raises(ValueError):
        m.add_bytes("host->cuda:0", -1)
    with pytest.raises(ValueError):
        Metrics(max_trace_events=-1)


def test_export_trace_matches_recorded_spans(tmp_path: Path) -> None:
    m = Metrics()
    with m.span("sample", exposed=True):
        time.sleep(0.005)
        with m.span("collate"):
            time.sleep(0.005)
    m.set_gauge("delivery", 2)
    it = m.end_iteration()
    events = _load(m, tmp_path)
    xs = {e["name"]: e for e in events if e["ph"] == "X"}
    assert set(xs) == {"sample", "collate"}
    sample, collate = xs["sample"], xs["collate"]
    assert sample["cat"] == "exposed" and collate["cat"] == "background"
    # dur in microseconds equals the accumulated op time
    assert sample["dur"] == pytest.approx(it["op/sample_s"] * 1e6, abs=1e-3)
    assert collate["dur"] == pytest.approx(it["op/collate_s"] * 1e6, abs=1e-3)
    # nesting is visible: the inner span lies inside the outer one
    assert sample["ts"] <= collate["ts"]
    assert collate["ts"] + collate["dur"] <= sample["ts"] + sample["dur"] + 1e-3
    # ts is relative to construction and within the iteration
    assert 0 <= sample["ts"] <= it["iteration_wall_s"] * 1e6
    for e in xs.values():
        assert e["pid"] == os.getpid() and e["tid"] == threading.get_ident()
    meta = [e for e in events if e["ph"] == "M"]
    assert meta == [
        {
            "name": "thread_name",
            "ph": "M",
            "pid": os.getpid(),
            "tid": threading.get_ident(),
            "args": {"name": threading.current_thread().name},
        }
    ]
    counters = [e for e in events if e["ph"] == "C"]
    assert len(counters) == 1 and counters[0]["args"] == {"delivery": 2}
    assert counters[0]["ts"] >= sample["ts"] + sample["dur"]


def test_trace_cap_drops_and_counts(tmp_path: Path) -> None:
    m = Metrics(max_trace_events=3)
    for _ in range(5):
        with m.span("get", exposed=True):
            pass
    m.set_gauge("depth", 1)
    it = m.end_iteration()
    assert it["op/get_calls"] == 5.0  # accounting is never capped
    assert it["count/trace_events_dropped"] == 3.0
    with m.span("get"):
        pass
    assert m.end_iteration()["count/trace_events_dropped"] == 1.0
    assert m.totals()["count/trace_events_dropped"] == 4.0
    events = _load(m, tmp_path)
    assert len([e for e in events if e["ph"] in ("X", "C")]) == 3


def test_trace_off_records_no_events(tmp_path: Path) -> None:
    m = Metrics(trace=False)
    with m.span("get", exposed=True):
        pass
    m.set_gauge("depth", 1)
    it = m.end_iteration()
    assert it["op/get_calls"] == 1.0 and it["count/trace_events_dropped"] == 0.0
    assert _load(m, tmp_path) == []


def test_concurrent_spans_lose_no_updates() -> None:
    m = Metrics(max_trace_events=1000)
    n, k = 4, 2000

    def work() -> None:
        for _ in range(k):
            with m.span("op", exposed=True):
                pass
            m.incr("items")

    threads = [threading.Thread(target=work) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    it = m.end_iteration()
    assert it["op/op_calls"] == n * k
    assert it["count/items"] == n * k
    assert it["count/trace_events_dropped"] == n * k - 1000
    assert it["exposed_s"] == pytest.approx(it["op/op_s"])


def test_span_overhead_is_small() -> None:
    """A loose guard (the docstring holds the measured number); fails only on a gross regression."""
    m = Metrics()
    n = 20_000
    t0 = time.perf_counter_ns()
    for _ in range(n):
        with m.span("op", exposed=True):
            pass
    per_us = (time.perf_counter_ns() - t0) / n / 1e3
    assert per_us < 25.0
