"""A token-in/token-out generation server (a Ray actor) that runs ``transformers.generate`` on CPU.

It plays the role vLLM's ``vLLMHttpServer`` plays for verl's agent loop: ``generate`` returns a
``TokenOutput`` tagged with the weight version (``global_steps``), and ``load_weights`` receives the
actor's updated weights after every step.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import signal
import time
from typing import Any

import torch

logger = logging.getLogger(__name__)

#: If set, every generate call appends ``{"version", "t0", "t1", "length"}`` (wall clock; response
#: tokens) to this JSONL file.
GEN_LOG_ENV = "CONDUIT_VERL_GEN_LOG"

#: Test only: if set to ``k`` (1-based), the k-th generate call of the run never returns (a hung
#: request), so the tests can check that a step ends by the trainer's timeout policy, never hangs.
HANG_REQUEST_ENV = "CONDUIT_CPU_HANG_REQUEST"
#: Test only: if set to ``k``, the server's process SIGKILLs itself at the k-th generate call (a dead
#: rollout server).
KILL_REQUEST_ENV = "CONDUIT_CPU_KILL_REQUEST"
#: Test only: if set to ``k``, the server SIGKILLs the process of verl's agent-loop worker (the caller
#: of every generate request) at the k-th generate call (a dead agent loop mid-step).
KILL_AGENT_LOOP_ENV = "CONDUIT_CPU_KILL_AGENT_LOOP"


def request_number(env: str) -> int | None:
    """The request number environment variable ``env`` names (``None``: unset); a bad value raises
    ``ValueError``."""
    raw = os.environ.get(env, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{env} must be a request number >= 1, got {raw!r}")
    return int(raw)


def log_gen_event(path: str | None, version: int, t0: float, t1: float, length: int) -> None:
    """Append one request to the generation log (``GEN_LOG_ENV``; nothing when ``path`` is None)."""
    if path is None:
        return
    event = {"version": version, "t0": t0, "t1": t1, "length": length}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(event) + "\n")


def request_seed(seed: int, version: int, prompt_ids: list[int], occurrence: int) -> int:
    """A sampling seed fixed by (rollout seed, weight version, prompt, k-th request of that prompt).

    Requests are served one at a time, so the multiset of responses to a prompt is the same in
    every run with the same seed, whatever order the agent loop sends them in. Which GRPO group a
    response lands in is not, when one prompt text appears in two groups of a step: the two groups'
    requests are identical here, and take the prompt's occurrences in arrival order.
    """
    key = f"{seed}:{version}:{occurrence}:{','.join(map(str, prompt_ids))}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def _agent_loop_pids() -> list[int]:
    """The processes of verl's live agent-loop workers, from Ray's actor table."""
    import ray

    from conduit_verl_cpu.vllm_cpu import AGENT_LOOP_CLASSES

    actors = ray._private.state.actors().values()  # noqa: SLF001
    return [
        int(a["Pid"])
        for a in actors
        if a["State"] == "ALIVE" and a["ActorClassName"].endswith(AGENT_LOOP_CLASSES) and a.get("Pid")
    ]


class HFGenerationServer:
    """Holds one CPU copy of the policy and generates one request at a time."""

    def __init__(
        self,
        model_path: str,
        response_length: int,
        prompt_length: int,
        num_threads: int = 1,
        seed: int = 0,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(num_threads)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, torch_dtype=torch.float32, attn_implementation="eager"
        ).eval()
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.eos_token_id: int = int(tokenizer.eos_token_id)
        self.pad_token_id: int = int(
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_id
        )
        self.response_length = response_length
        self.prompt_length = prompt_length
        self.global_steps: int | None = None
        self.weight_version = 0
        self.seed = seed
        self._occurrences: dict[tuple[int, tuple[int, ...]], int] = {}
        self._gen_log = os.environ.get(GEN_LOG_ENV) or None
        self._hang_at = request_number(HANG_REQUEST_ENV)
        self._kill_at = request_number(KILL_REQUEST_ENV)
        self._kill_loop_at = request_number(KILL_AGENT_LOOP_ENV)
        self._requests = 0
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------------ generation
    def _generate_sync(self, prompt_ids: list[int], params: dict[str, Any]) -> tuple[list[int], list[float]]:
        max_tokens = int(params.pop("max_tokens", params.pop("max_new_tokens", self.response_length)))
        max_tokens = max(1, min(max_tokens, self.response_length))
        temperature = float(params.get("temperature", 1.0) or 0.0)
        top_p = float(params.get("top_p", 1.0) or 1.0)
        top_k = int(params.get("top_k", -1) or -1)
        do_sample = temperature > 0
        gen_kwargs: dict[str, Any] = dict(
            max_new_tokens=max_tokens,
            do_sample=do_sample,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.pad_token_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        if do_sample:
            gen_kwargs.update(temperature=temperature, top_p=top_p, top_k=top_k if top_k > 0 else 0)
        input_ids = torch.tensor([prompt_ids], dtype=torch.long)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **gen_kwargs
            )
        tokens = out.sequences[0, input_ids.shape[1] :].tolist()
        # log-probs of the sampled tokens under logits / temperature (what verl recomputes)
        scale = temperature if do_sample else 1.0
        log_probs: list[float] = []
        for step, token in enumerate(tokens):
            logp = torch.log_softmax(out.logits[step][0].float() / scale, dim=-1)
            log_probs.append(float(logp[token]))
        # keep the EOS token (it is part of the response), drop anything after it
        if self.eos_token_id in tokens:
            cut = tokens.index(self.eos_token_id) + 1
            tokens, log_probs = tokens[:cut], log_probs[:cut]
        return tokens, log_probs

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        **_kwargs: Any,
    ) -> Any:
        """verl's server ``generate`` contract: token ids in (``_respond``), ``TokenOutput`` out."""
        from verl.workers.rollout.replica import TokenOutput

        params = dict(sampling_params)
        tokens, log_probs, steps, version = await self._respond(list(prompt_ids), params, request_id)
        stop = "completed" if tokens and tokens[-1] == self.eos_token_id else "length"
        return TokenOutput(
            token_ids=tokens,
            log_probs=log_probs if params.get("logprobs") else None,
            stop_reason=stop,
            extra_fields={"global_steps": steps, "weight_version": version},
        )

    def _next_seed(self, ids: list[int]) -> int:
        """A request's sampling seed (``request_seed``): its prompt's next occurrence at this version."""
        key = (self.weight_version, tuple(ids))
        occurrence = self._occurrences.get(key, 0)
        self._occurrences[key] = occurrence + 1
        return request_seed(self.seed, self.weight_version, ids, occurrence)

    async def _respond(
        self, ids: list[int], params: dict[str, Any], request_id: str
    ) -> tuple[list[int], list[float], int | None, int]:
        """One request generated alone, once the test switches had their say: its tokens, their
        log-probs, and the ``global_steps`` and weight version they were generated at."""
        self._requests += 1
        if self._requests == self._hang_at:
            print(
                f"[conduit-cpu] hf server: request {self._requests} ({request_id}) hangs (test switch)",
                flush=True,
            )
            await asyncio.Event().wait()  # never set: this request never returns; the others go on
        if self._requests == self._kill_at:
            print(
                f"[conduit-cpu] hf server: request {self._requests} kills the server (test switch)",
                flush=True,
            )
            os.kill(os.getpid(), signal.SIGKILL)
        if self._requests == self._kill_loop_at:
            pids = _agent_loop_pids()
            print(
                f"[conduit-cpu] hf server: request {self._requests} kills the agent loop worker(s) {pids} "
                "(test switch)",
                flush=True,
            )
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
        async with self._lock:
            torch.manual_seed(self._next_seed(ids))
            t0 = time.time()
            tokens, log_probs = await asyncio.to_thread(self._generate_sync, ids, params)
            steps = self.global_steps
            self._log_event(t0, time.time(), len(tokens))
        return tokens, log_probs, steps, self.weight_version

    def _log_event(self, t0: float, t1: float, length: int) -> None:
        log_gen_event(self._gen_log, self.weight_version, t0, t1, length)

    # ------------------------------------------------------------------ weights
    async def load_weights(self, state_dict: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        """Load a full (HF-named) state dict from the trainer; returns the count of tensors loaded."""
        async with self._lock:
            own = self.model.state_dict()
            loaded = 0
            with torch.no_grad():
                for name, tensor in state_dict.items():
                    if name in own:
                        own[name].copy_(tensor.to(own[name].dtype))
                        loaded += 1
                if getattr(self.model.config, "tie_word_embeddings", False):
                    self.model.tie_weights()
            self.weight_version += 1
            self._occurrences.clear()
            if global_steps is not None:
                self.global_steps = global_steps
            norm = float(torch.sqrt(sum((p.detach().float() ** 2).sum() for p in self.model.parameters())))
        print(
            f"[conduit-cpu] hf server: weights v{self.weight_version} loaded ({loaded} tensors, "
            f"global_steps={global_steps}, param_norm={norm:.6f})",
            flush=True,
        )
        return loaded

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def get_weight_version(self) -> int:
        return self.weight_version

    # ------------------------------------------------------------------ no-op lifecycle (CPU)
    async def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        return {}

    async def resume_generation(self) -> None:
        return None

    async def start_profile(self, **_kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None
