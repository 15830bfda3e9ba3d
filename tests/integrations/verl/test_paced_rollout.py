"""The paced rollout's server model and pacer (``conduit_verl_cpu.pace``), on a fake clock.

Fast unit tests of our own logic: the continuous-batching schedule against hand-computed times,
the length distribution, and that ``Pacer`` releases concurrent requests in the modelled order and
at the modelled (scaled) times, including a request that arrives while others are running.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Awaitable, Callable

import numpy as np
import pytest

pytest.importorskip("conduit_verl_cpu")  # the CPU harness: pip install --no-deps -e tools/verl_cpu

from conduit_verl_cpu.pace import PaceModel, Pacer  # noqa: E402

from conduit.errors import ConfigError  # noqa: E402

#: easy numbers: step 1 s + 0.5 s per active sequence, prefill 0.1 s per prompt token
SIMPLE = PaceModel(step_s=1.0, seq_s=0.5, prefill_s_per_token=0.1)


class FakeClock:
    """Virtual time: ``sleep`` parks the caller; ``run`` advances to the next wake-up when every
    task is parked, so the result does not depend on the machine's speed."""

    def __init__(self) -> None:
        self.now = 0.0
        self._timers: list[tuple[float, int, asyncio.Future]] = []
        self._seq = itertools.count()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (self.now + seconds, next(self._seq), fut))
        await fut

    async def run(self, starts: list[tuple[float, Callable[[], Awaitable[float]]]]) -> list[float]:
        """Start each coroutine factory at its virtual time; return each one's result."""

        async def later(at: float, make: Callable[[], Awaitable[float]]) -> float:
            await self.sleep(at)
            return await make()

        tasks = [asyncio.ensure_future(later(at, make)) for at, make in starts]
        while not all(t.done() for t in tasks):
            for _ in range(10):  # let every runnable task reach its next sleep
                await asyncio.sleep(0)
            if self._timers:
                at, _, fut = heapq.heappop(self._timers)
                self.now = max(self.now, at)
                fut.set_result(None)
        return [t.result() for t in tasks]


def test_finish_times_by_hand() -> None:
    """Two requests arrive at 0 (prompts 10 and 20 tokens: prefill 3 s), lengths 1, 3 and 2."""
    arrivals = np.array([0.0, 0.0, 0.0])
    prompts = np.array([10, 20, 0])
    got = SIMPLE.finish_times(arrivals, prompts, np.array([1, 3, 2]))
    # prefill 3 s gives every first token: length 1 is done at 3. Then 2 active: steps of 2 s
    # (t=5: length 2 done), then 1 active: 1.5 s (t=6.5: length 3 done)
    assert got == pytest.approx([3.0, 6.5, 5.0])


def test_late_arrival_joins_at_a_step_boundary_and_slows_the_batch() -> None:
    got = SIMPLE.finish_times(np.array([0.0, 2.5]), np.array([0, 10]), np.array([4, 1]))
    # request 0: steps of 1.5 s end at 1.5, 3.0; request 1 joins at 3.0 (prefill 1 s, its only
    # token: done at 4.0); request 0's last step: 4.0 -> 5.5
    assert got == pytest.approx([5.5, 4.0])
    alone = SIMPLE.finish_times(np.array([0.0]), np.array([0]), np.array([4]))
    assert alone == pytest.approx([4.5])  # without the late one: 3 steps of 1.5 s


def test_lengths_follow_median_and_tail() -> None:
    """Over many prompts the marginal median and p99 are as set; a prompt's responses share part of
    their length (prompt_share), so groups differ more than single responses within them."""
    model = PaceModel(median_len=64, tail=4.0, max_len=10_000)
    lengths = np.array([[model.draw_length(1000 * p + k, p) for k in range(8)] for p in range(500)])
    assert np.median(lengths) == pytest.approx(64, rel=0.08)
    assert np.quantile(lengths, 0.99) == pytest.approx(256, rel=0.2)
    within = np.log(lengths).std(axis=1).mean()
    independent = PaceModel(median_len=64, tail=4.0, max_len=10_000, prompt_share=0.0)
    alone = np.array([[independent.draw_length(1000 * p + k, p) for k in range(8)] for p in range(500)])
    assert within < 0.8 * np.log(alone).std(axis=1).mean()
    assert model.draw_length(7, 3) == model.draw_length(7, 3)  # fixed by the seeds
    flat = PaceModel(median_len=64, tail=1.0)
    assert {flat.draw_length(s, 0) for s in range(50)} == {64}
    capped = PaceModel(median_len=64, tail=8.0, max_len=100)
    assert max(capped.draw_length(s, s) for s in range(2000)) == 100


@pytest.mark.parametrize(
    "bad",
    [{"tail": 0.5}, {"median_len": 0}, {"time_scale": -1.0}, {"step_s": float("nan")}, {"prompt_share": 2}],
)
def test_bad_settings_are_named(bad: dict) -> None:
    with pytest.raises(ConfigError, match="paced rollout"):
        PaceModel(**bad)


def test_pacer_releases_in_modelled_order_and_times() -> None:
    """Requests of a burst, plus one arriving later, released at scale × the modelled times."""
    scale = 0.5
    model = PaceModel(step_s=1.0, seq_s=0.5, prefill_s_per_token=0.1, time_scale=scale)
    clock = FakeClock()
    pacer = Pacer(model, clock=clock, sleep=clock.sleep)
    # (arrival in clock seconds, prompt tokens, response length)
    reqs = [(0.0, 10, 6), (0.0, 10, 2), (0.0, 0, 4), (1.2, 10, 1)]
    order: list[int] = []

    def request(i: int, prompt: int, length: int) -> Callable[[], Awaitable[float]]:
        async def go() -> float:
            ticket = pacer.arrive(prompt, length)
            released = await pacer.release(ticket)
            order.append(i)
            return released

        return go

    released = asyncio.run(clock.run([(at, request(i, p, n)) for i, (at, p, n) in enumerate(reqs)]))
    want = model.finish_times(
        np.array([at / scale for at, _, _ in reqs]),
        np.array([p for _, p, _ in reqs]),
        np.array([n for _, _, n in reqs]),
    )
    assert released == pytest.approx(list(scale * want))
    assert order == sorted(range(len(reqs)), key=lambda i: want[i])
    # the late request slowed the burst: request 0 finishes later than without it
    burst_only = model.finish_times(np.zeros(3), np.array([10, 10, 0]), np.array([6, 2, 4]))
    assert want[0] > burst_only[0]


def test_pacer_starts_a_new_period_when_idle() -> None:
    """After every request is released and the model is idle, the next arrival is a new origin."""
    model = PaceModel(step_s=1.0, seq_s=0.0, prefill_s_per_token=0.0, time_scale=2.0)
    clock = FakeClock()
    pacer = Pacer(model, clock=clock, sleep=clock.sleep)

    def one(length: int) -> Callable[[], Awaitable[float]]:
        async def go() -> float:
            return await pacer.release(pacer.arrive(0, length))

        return go

    first, second = asyncio.run(clock.run([(0.0, one(3)), (100.0, one(2))]))
    assert first == pytest.approx(2.0 * 2)  # 2 decode steps of 1 s, scaled by 2
    assert second == pytest.approx(100.0 + 2.0 * 1)
    assert math.isfinite(second)


def test_scale_zero_releases_at_once() -> None:
    clock = FakeClock()
    pacer = Pacer(PaceModel(time_scale=0.0), clock=clock, sleep=clock.sleep)

    async def go() -> float:
        return await pacer.release(pacer.arrive(10, 200))

    (released,) = asyncio.run(clock.run([(3.0, go)]))
    assert released == 3.0


def test_batch_sampler_lengths_and_batch_independence(tmp_path) -> None:  # noqa: ANN001
    """Each response has exactly its drawn length (EOS last, unless at the cap), completes in
    length order, and its tokens do not depend on the rest of the batch."""
    torch = pytest.importorskip("torch")
    from conduit_verl_cpu.batch_sampler import Request, sample_batch
    from conduit_verl_cpu.model import build_model_dir
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        build_model_dir(tmp_path / "m"), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    eos, pad, cap = 1, 0, 12
    reqs = [Request([5, 6, 7][: 1 + i % 3], length, 100 + i) for i, length in enumerate([9, 3, 12, 5])]

    def run(batch: list[Request]) -> tuple[dict[int, tuple[list[int], list[float]]], list[int]]:
        got: dict[int, tuple[list[int], list[float]]] = {}
        done: list[int] = []

        def on_done(i: int, tokens: list[int], logps: list[float]) -> None:
            got[i] = (tokens, logps)
            done.append(i)

        sample_batch(model, batch, 1.0, eos, pad, cap, on_done)
        return got, done

    got, done = run(reqs)
    assert done == [1, 3, 0, 2]  # shortest first
    for i, r in enumerate(reqs):
        tokens, logps = got[i]
        assert len(tokens) == len(logps) == r.length
        assert eos not in tokens[:-1]  # EOS held back
        assert (tokens[-1] == eos) == (r.length < cap)  # at the cap: truncated
        assert all(lp <= 0 for lp in logps)
    alone, _ = run([reqs[2], reqs[0]])
    assert alone[0][0] == got[2][0] and alone[1][0] == got[0][0]


def _server(wave: int) -> tuple[object, list[list[int]]]:
    """A paced server reduced to its wave logic: generating a wave records its requests' seeds."""
    from conduit_verl_cpu.paced_server import PacedGenerationServer

    server = PacedGenerationServer.__new__(PacedGenerationServer)
    server.wave, server._pending, server._waves = wave, [], None
    waves: list[list[int]] = []

    async def generate(part: list, temperature: float) -> None:
        waves.append([r.seed for r, _ in part])
        for _, f in part:
            f.set_result(None)

    server._generate_wave = generate  # type: ignore[attr-defined]
    return server, waves


def _arrivals(server: object, seeds_at: list[tuple[float, int]]) -> None:
    from conduit_verl_cpu.batch_sampler import Request

    async def main() -> None:
        loop = asyncio.get_running_loop()
        futures = []
        start = loop.time()
        for at, seed in seeds_at:
            await asyncio.sleep(max(0.0, start + at - loop.time()))
            f = loop.create_future()
            server._pending.append((Request([1], 1, seed), 1.0, f))  # type: ignore[attr-defined]
            futures.append(f)
            if server._waves is None or server._waves.done():  # type: ignore[attr-defined]
                server._waves = asyncio.create_task(server._run_waves())  # type: ignore[attr-defined]
        await asyncio.wait_for(asyncio.gather(*futures), timeout=10)

    asyncio.run(main())


def test_a_step_is_one_wave_in_seed_order_however_its_requests_arrive() -> None:
    """Requests of a step that arrive with gaps longer than a burst still form one wave, ordered by
    seed: the same batch in every run, so no near-tie can flip a token between runs."""
    server, waves = _server(wave=4)
    _arrivals(server, [(0.0, 7), (0.0, 3), (0.1, 9), (0.2, 1), (0.5, 8), (0.5, 2), (0.5, 6), (0.5, 4)])
    assert waves == [[1, 3, 7, 9], [2, 4, 6, 8]]


def test_a_short_step_wave_and_unsized_requests_close_when_they_stop_coming() -> None:
    server, waves = _server(wave=4)
    _arrivals(server, [(0.0, 5), (0.0, 2)])  # e.g. validation: fewer requests than a step's
    assert waves == [[2, 5]]
    server, waves = _server(wave=0)  # no wave size: a burst is a wave
    _arrivals(server, [(0.0, 5), (0.0, 2), (0.3, 1)])
    assert waves == [[2, 5], [1]]


def test_a_paced_conduit_run_tells_auto_the_rollout_has_its_own_hardware(tmp_path) -> None:  # noqa: ANN001
    from conduit_verl_cpu.run import parse_args, streaming_overrides

    def knobs(*argv: str) -> list[str]:
        args, _ = parse_args(list(argv))
        return [o.split("=")[0] for o in streaming_overrides(args, tmp_path)]

    hardware = "+trainer.v1.conduit.rollout_hardware"
    assert hardware in knobs("--trainer-mode", "conduit", "--rollout", "paced")
    assert hardware not in knobs("--trainer-mode", "conduit", "--rollout", "hf")  # shares the cores
    # vLLM on a core of its own (--core-split, the default) is separate hardware; unsplit, it shares
    assert hardware in knobs("--trainer-mode", "conduit", "--rollout", "vllm")
    assert hardware not in knobs("--trainer-mode", "conduit", "--rollout", "vllm", "--core-split", "none")
    assert knobs("--trainer-mode", "sync", "--rollout", "paced") == []
    assert knobs("--trainer-mode", "conduit", "--rollout", "paced", "+trainer.v1.conduit.overlap=sync") == []
    # a user's own setting is left alone
    mine = knobs(
        "--trainer-mode", "conduit", "--rollout", "paced", "+trainer.v1.conduit.rollout_hardware=shared"
    )
    assert hardware not in mine and "+trainer.v1.conduit.tuner_cache" in mine
