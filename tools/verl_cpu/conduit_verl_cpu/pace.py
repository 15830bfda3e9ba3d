"""The paced rollout's model of a separate inference server: when would it finish each response?

A *paced* rollout generates every token with the tiny CPU model (learning stays real) but releases
each response at the time a modelled inference server on its own hardware would finish it, and
sleeps meanwhile, leaving the cores to the rest of the pipeline. It is a model of separate
hardware, not a GPU measurement: every row, table and plot made with it says ``paced``.

The server model (continuous batching, as vLLM schedules by default):

* a request joins the running batch at the first decode-step boundary after it arrives; joining
  costs a prefill of ``prefill_s_per_token`` per prompt token, which stalls the batch (no chunked
  prefill) and yields the response's first token;
* each decode step takes ``step_s + seq_s * active`` (``active``: sequences in the batch) and gives
  every active sequence one token; a sequence leaves the batch at its last token.

Default parameters, unscaled (seconds on the modelled hardware), are a roofline estimate for a
7B model in bf16 on one A100-80GB, from published figures:

* NVIDIA A100 datasheet: 2,039 GB/s HBM2e, 312 TFLOPS dense BF16 tensor throughput;
* Qwen2.5-7B's published config: 7.61 B parameters, 28 layers, 4 KV heads of dimension 128.

``step_s`` = reading the 15.2 GB of weights once per step at 2,039 GB/s = 7.5 ms. ``seq_s`` = one
sequence's KV cache (2 × 28 × 4 × 128 × 2 B = 57 KB per token, ~1.5 k tokens: 86 MB → 0.04 ms)
plus its matmuls (2 × 7.61 GFLOP at 312 TFLOPS: 0.05 ms) = 0.09 ms. ``prefill_s_per_token`` =
15.2 GFLOP at half of 312 TFLOPS = 0.1 ms. The whole model is then multiplied by ``time_scale``
(the benchmark sets it so that a step's generation takes ``R`` times that batch's measured
ingestion time, ``R = 4`` by default: generation about two thirds of a step, as in public verl
profiles).

Response lengths are lognormal with a given median and p99 (``tail = p99 / median``; 1: all
equal), capped at ``max_len``, drawn per request from its sampling seed, so every system of a
benchmark sees the same lengths. A share ``prompt_share`` of the log-length variance belongs to the
prompt (drawn from a per-prompt seed, common to its group): a hard prompt gets long answers from
all of its samples, so whole groups finish late, as in reasoning RL; the marginal median and p99
stay as set. 0.5 is an assumption (no published figure), and a hydra knob.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

#: z-score of the 99th percentile of a standard normal
Z99 = 2.3263478740408408


@dataclass(frozen=True)
class PaceModel:
    """A continuous-batching inference server's timing, and the response-length distribution."""

    median_len: int = 96
    tail: float = 4.0  # p99 / median of the response length
    max_len: int = 256
    step_s: float = 7.5e-3
    seq_s: float = 9e-5
    prefill_s_per_token: float = 1e-4
    time_scale: float = 1.0  # multiplies every modelled time; 0 releases on generation
    prompt_share: float = 0.5  # share of the log-length variance common to a prompt's responses

    def __post_init__(self) -> None:
        from conduit.errors import ConfigError

        if self.median_len < 1 or self.max_len < 1:
            raise ConfigError(f"paced rollout: lengths must be >= 1, got {self.median_len}, {self.max_len}")
        if not self.tail >= 1.0:
            raise ConfigError(f"paced rollout: tail (p99/median) must be >= 1, got {self.tail}")
        if not 0.0 <= self.prompt_share <= 1.0:
            raise ConfigError(f"paced rollout: prompt_share must be in [0, 1], got {self.prompt_share}")
        bad = {
            k: v
            for k, v in (
                ("step_s", self.step_s),
                ("seq_s", self.seq_s),
                ("prefill_s_per_token", self.prefill_s_per_token),
                ("time_scale", self.time_scale),
            )
            if not (math.isfinite(v) and v >= 0)
        }
        if bad:
            raise ConfigError(f"paced rollout: times must be finite and >= 0, got {bad}")

    def draw_length(self, seed: int, prompt_seed: int) -> int:
        """The response length (in ``[1, max_len]``) of the request with sampling seed ``seed``
        whose prompt has seed ``prompt_seed`` (the same for every response to that prompt)."""
        sigma = math.log(self.tail) / Z99
        z_prompt = float(np.random.default_rng(prompt_seed).standard_normal())
        z_own = float(np.random.default_rng(seed).standard_normal())
        z = math.sqrt(self.prompt_share) * z_prompt + math.sqrt(1.0 - self.prompt_share) * z_own
        return int(min(self.max_len, max(1, round(self.median_len * math.exp(sigma * z)))))

    def finish_times(self, arrivals: np.ndarray, prompt_lens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Unscaled finish time of each request (same time origin as ``arrivals``).

        Event-driven: between two events (an arrival, a finish) the batch size is constant, so
        the loop runs once per event, not once per token.
        """
        n = len(arrivals)
        finish = np.zeros(n)
        order = np.argsort(arrivals, kind="stable")
        left = np.asarray(lengths, dtype=np.int64) - 1  # decode steps after the prefill's token
        active: list[int] = []
        t, nxt = 0.0, 0
        while nxt < n or active:
            if not active:
                t = max(t, float(arrivals[order[nxt]]))
            joined = []
            while nxt < n and arrivals[order[nxt]] <= t:
                joined.append(int(order[nxt]))
                nxt += 1
            if joined:
                t += self.prefill_s_per_token * float(np.sum(prompt_lens[joined]))
                for j in joined:
                    if left[j] <= 0:
                        finish[j] = t
                    else:
                        active.append(j)
            if not active:
                continue
            dt = self.step_s + self.seq_s * len(active)
            k = int(min(left[active]))
            if nxt < n:  # stop at the step boundary where the next request joins
                k = min(k, max(1, math.ceil((float(arrivals[order[nxt]]) - t) / dt)))
            t += k * dt
            left[active] -= k
            for j in [j for j in active if left[j] <= 0]:
                finish[j] = t
            active = [j for j in active if left[j] > 0]
        return finish


@dataclass
class _Period:
    """Requests since the server was last idle (the model's time origin is the first arrival)."""

    origin: float
    arrivals: list[float] = field(default_factory=list)
    prompt_lens: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    released: int = 0
    _finish: np.ndarray | None = None

    def finish(self, model: PaceModel) -> np.ndarray:
        if self._finish is None or len(self._finish) != len(self.arrivals):
            self._finish = model.finish_times(
                np.asarray(self.arrivals), np.asarray(self.prompt_lens), np.asarray(self.lengths)
            )
        return self._finish


@dataclass(frozen=True)
class Ticket:
    """One request's place in a busy period."""

    period: _Period
    index: int


class Pacer:
    """Releases requests at their modelled finish times (scaled by ``model.time_scale``).

    ``arrive`` registers a request (synchronous, so a burst of requests is all registered before
    anyone computes the schedule); ``release`` sleeps until the request's modelled finish. A later
    arrival can only delay an earlier request's finish, never advance it, so ``release`` sleeps
    until the finish it knows and checks again.
    """

    def __init__(
        self,
        model: PaceModel,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.model, self.clock, self.sleep = model, clock, sleep
        self._period: _Period | None = None

    def arrive(self, prompt_len: int, length: int) -> Ticket:
        """Register a request that arrives now (``length``: its response length in tokens)."""
        now = self.clock()
        p = self._period
        if p is None or (p.released == len(p.arrivals) and now >= self._period_end(p)):
            p = self._period = _Period(origin=now)  # the server was idle: a new time origin
        scale = self.model.time_scale
        p.arrivals.append((now - p.origin) / scale if scale > 0 else 0.0)
        p.prompt_lens.append(prompt_len)
        p.lengths.append(length)
        return Ticket(p, len(p.arrivals) - 1)

    def model_finish_s(self, ticket: Ticket) -> float:
        """Unscaled modelled finish, seconds after the period's first arrival."""
        return float(ticket.period.finish(self.model)[ticket.index])

    def finish_at(self, ticket: Ticket) -> float:
        """Clock time at which the request's response is due."""
        return ticket.period.origin + self.model.time_scale * self.model_finish_s(ticket)

    def _period_end(self, p: _Period) -> float:
        return p.origin + self.model.time_scale * float(np.max(p.finish(self.model)))

    async def release(self, ticket: Ticket) -> float:
        """Sleep until the request is due; return the clock time of its release."""
        while (due := self.finish_at(ticket)) > (now := self.clock()):
            await self.sleep(due - now)
        ticket.period.released += 1
        return now
