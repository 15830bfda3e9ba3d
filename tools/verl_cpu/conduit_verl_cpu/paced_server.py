"""The paced generation server: real tokens from the tiny model, released at modelled times.

``PacedGenerationServer`` is the ``HFGenerationServer`` with another ``_respond`` (what ``generate``
awaits). A request draws its response length from its sampling seed and its prompt's
(``pace.PaceModel.draw_length``), registers with the ``Pacer`` as it arrives, and joins the next *wave*:
a training step's requests (``wave`` of them, the harness sets prompts × n; or, for other requests,
those that arrive together: no new one for ``GATHER_S``) are generated in one batch
(``batch_sampler.sample_batch``), in the order of their seeds, each finishing after its own length's
steps. The sampler is batch-invariant (every prompt padded to the server's prompt length, every linear
layer computed row by row): a request's tokens and log-probs are those it would get alone, so neither a
wave's composition nor its order can flip a near-tie between two tokens from one run to another (sync vs
conduit, a short wave, a resumed step). Requests are sampled by seed (``hf_server.request_seed``:
rollout seed, weight version, prompt, k-th request of that prompt), so a prompt's responses are the same
in every run; which of them go to which GRPO group is not when one prompt text appears twice in a step
(the server cannot tell the two groups' requests apart; they take the seeds in arrival order). The
response is then held until its modelled finish and released; the server sleeps meanwhile, leaving the
cores to the rest of the pipeline, as separate rollout GPUs would.
A response whose real tokens come later than its modelled finish is released when they come; the
generation log records that lateness (``late_s``), so a run can tell whether the model held.

The generation log (``GEN_LOG_ENV``) gets, per request, ``t0`` (arrival) and ``t1`` (release) like
the plain server, plus ``length``, ``model_s`` (unscaled modelled finish after the busy period's
first arrival: the benchmark's calibration reads it) and ``late_s``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from conduit_verl_cpu.batch_sampler import Request, sample_batch
from conduit_verl_cpu.hf_server import HFGenerationServer, request_seed
from conduit_verl_cpu.pace import PaceModel, Pacer

#: a wave closes when no request has arrived for this long (verl's agent loop sends a step's
#: requests in one burst)
GATHER_S = 0.02
#: a step's wave still short of ``wave`` requests closes after this long without a new one
WAVE_WAIT_S = 2.0


class PacedGenerationServer(HFGenerationServer):
    """Generates every token for real; releases each response when the modelled server would."""

    def __init__(self, *args: Any, pace: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        pace = dict(pace)
        self.wave = int(pace.pop("wave", 0))  # requests of one training step (0: close on bursts)
        self.pace = PaceModel(**{"max_len": self.response_length, **pace})
        self.pacer = Pacer(self.pace)
        self._pending: list[tuple[Request, float, asyncio.Future]] = []
        self._waves: asyncio.Task | None = None

    async def _respond(
        self, ids: list[int], params: dict[str, Any], request_id: str
    ) -> tuple[list[int], list[float], int | None, int]:
        """One request generated in its wave and released at the modelled time (``generate`` makes
        the ``TokenOutput``)."""
        from conduit.errors import ConfigError

        if float(params.get("top_p", 1.0) or 1.0) < 1.0 or int(params.get("top_k", -1) or -1) > 0:
            raise ConfigError(f"paced rollout samples the full distribution; got top_p/top_k in {params}")
        seed = self._next_seed(ids)
        cap = int(params.get("max_tokens", params.get("max_new_tokens", self.response_length)))
        prompt_seed = request_seed(self.seed, self.weight_version, ids, -1)  # common to the group
        length = min(self.pace.draw_length(seed, prompt_seed), max(1, min(cap, self.response_length)))
        t0 = time.time()
        ticket = self.pacer.arrive(len(ids), length)
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending.append((Request(ids, length, seed), float(params.get("temperature", 1.0) or 0.0), done))
        if self._waves is None or self._waves.done():
            self._waves = asyncio.create_task(self._run_waves())
        tokens, log_probs, steps, version = await done
        released = await self.pacer.release(ticket)
        late_s = released - self.pacer.finish_at(ticket)  # > 0: the real tokens came after the model's time
        self._log(t0, time.time(), version, length, self.pacer.model_finish_s(ticket), late_s)
        return tokens, log_probs, steps, version

    async def _run_waves(self) -> None:
        """Gather the requests that arrive together and generate them as one batch, until none wait."""
        while self._pending:
            await self._gather()
            cut = self.wave or len(self._pending)
            wave, self._pending = self._pending[:cut], self._pending[cut:]
            wave.sort(key=lambda item: item[0].seed)
            for temperature in sorted({t for _, t, _ in wave}):
                part = [(r, f) for r, t, f in wave if t == temperature]
                try:
                    await self._generate_wave(part, temperature)
                except Exception as e:  # never leave a request waiting forever
                    for _, f in part:
                        if not f.done():
                            f.set_exception(e)

    async def _gather(self) -> None:
        """Wait until a step's ``wave`` requests are pending, or (no ``wave``, or a short one) until
        none has arrived for ``GATHER_S`` (``WAVE_WAIT_S`` while a step's wave is short)."""
        quiet = WAVE_WAIT_S if self.wave else GATHER_S
        seen, idle = -1, 0.0
        while not (self.wave and len(self._pending) >= self.wave):
            if len(self._pending) != seen:
                seen, idle = len(self._pending), 0.0
            elif idle >= quiet:
                return
            await asyncio.sleep(GATHER_S)
            idle += GATHER_S

    async def _generate_wave(self, part: list[tuple[Request, asyncio.Future]], temperature: float) -> None:
        """One batch through the model; each request's future is set as its response completes."""
        loop = asyncio.get_running_loop()
        async with self._lock:  # no weight update in the middle of a wave
            tag = (self.global_steps, self.weight_version)

            def deliver(i: int, tokens: list[int], logps: list[float]) -> None:
                loop.call_soon_threadsafe(part[i][1].set_result, (tokens, logps, *tag))

            reqs = [r for r, _ in part]
            await asyncio.to_thread(
                sample_batch,
                self.model,
                reqs,
                temperature,
                self.eos_token_id,
                self.pad_token_id,
                self.response_length,
                deliver,
                self.prompt_length,  # one padded width for every wave: batch-invariant rows
            )

    def _log(self, t0: float, t1: float, version: int, length: int, model_s: float, late_s: float) -> None:
        if self._gen_log is None:
            return
        event = {"version": version, "t0": t0, "t1": t1, "length": length, "model_s": model_s}
        event["late_s"] = round(max(0.0, late_s), 6)
        with open(self._gen_log, "a", encoding="utf-8") as f:
            f.write(json.dumps(event) + "\n")
