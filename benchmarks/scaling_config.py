"""What the scaling model is given: the GRPO workload, the compute rates, the cluster and the calibration.

Every figure lives in one frozen dataclass with its unit in the field's comment, and goes into the
result JSON whole (``asdict``). ``Calibration`` holds the per-call and per-byte constants of the data
path; ``benchmarks/scaling_validate.py`` fits them from measured calls and checks the fit.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from conduit.costmodel import OperatorCost
from conduit.errors import ConfigError
from conduit.topology import Topology

TOPOLOGY = Path(__file__).resolve().parent.parent / "topologies" / "cluster128_h100.toml"

#: token fields of verl's GRPO batch: name -> (bytes per token, span). span: "prompt", "response" or
#: "sequence" (prompt + response). int64 ids and masks as verl keeps them, fp32 log-probs and scores.
FIELDS: dict[str, tuple[int, str]] = {
    "prompts": (8, "prompt"),
    "responses": (8, "response"),
    "response_mask": (8, "response"),
    "input_ids": (8, "sequence"),
    "attention_mask": (8, "sequence"),
    "position_ids": (8, "sequence"),
    "rollout_log_probs": (4, "response"),
    "token_level_scores": (4, "response"),
    "old_log_probs": (4, "response"),
    "ref_log_prob": (4, "response"),
    "advantages": (4, "response"),
    "returns": (4, "response"),
}
ROLLOUT_FIELDS = (
    "prompts",
    "responses",
    "response_mask",
    "input_ids",
    "attention_mask",
    "position_ids",
    "rollout_log_probs",
    "token_level_scores",
)
#: controller requests of one TransferQueue client call: kv_batch_put = kv_retrieve_meta(create) +
#: notify_data_update + set_custom_meta; kv_batch_get = kv_retrieve_meta
REQUESTS = {"put": 3, "get": 1}
#: the replay-buffer poll every polling baseline gets (issue 47): the verl benchmarks' short period
#: (``verl_demo.POLL_S``), in the model (``Calibration.poll_s``) and in the measured runs alike; verl
#: ships 2 s, which would hand Conduit's channel a win the poll, not the data path, made
SHORT_POLL_S = 0.02
LOGPROB_READS = ("input_ids", "attention_mask", "position_ids", "responses")
ADVANTAGE_READS = ("token_level_scores", "response_mask")
UPDATE_READS = (*LOGPROB_READS, "response_mask", "old_log_probs", "ref_log_prob", "advantages")


def _positive(where: str, **values: float) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
            raise ConfigError(f"{where}: {name} must be a finite number > 0, got {v!r}")


@dataclass(frozen=True)
class Workload:
    """One GRPO iteration of a 7B policy: ``prompts`` x ``n`` responses, lengths log-normal (long tail)."""

    params: float = 7e9  # policy parameters (Qwen2.5-7B class)
    prompts: int = 512  # prompts per iteration (global batch)
    n: int = 16  # responses per prompt (GRPO group size)
    prompt_median: int = 400  # tokens; log-normal, sigma prompt_sigma, clipped to [32, max_prompt]
    prompt_sigma: float = 0.5
    max_prompt: int = 2048
    response_median: int = 1200  # tokens; log-normal, sigma response_sigma, clipped to [16, max_response]
    response_sigma: float = 0.8
    max_response: int = 8192

    def __post_init__(self) -> None:
        _positive("workload", **{f.name: getattr(self, f.name) for f in fields(self)})

    @property
    def responses(self) -> int:
        return self.prompts * self.n

    def lengths(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(prompt, response) token counts per response, deterministic for ``seed``; a group shares its prompt."""
        rng = np.random.default_rng(seed)
        p = rng.lognormal(math.log(self.prompt_median), self.prompt_sigma, self.prompts)
        prompt = np.repeat(np.clip(np.rint(p), 32, self.max_prompt).astype(np.int64), self.n)
        r = rng.lognormal(math.log(self.response_median), self.response_sigma, self.responses)
        return prompt, np.clip(np.rint(r), 16, self.max_response).astype(np.int64)

    def field_bytes(self, names: tuple[str, ...], prompt: np.ndarray, response: np.ndarray) -> np.ndarray:
        """Bytes per response of the fields ``names`` (vectorised over responses)."""
        span = {"prompt": prompt, "response": response, "sequence": prompt + response}
        return sum((FIELDS[f][0] * span[FIELDS[f][1]] for f in names), np.zeros_like(prompt))


@dataclass(frozen=True)
class Compute:
    """GPU compute of a 7B policy on one H100 SXM (assumptions stated; not the data path)."""

    peak_flops: float = 989e12  # bf16 dense, H100 SXM datasheet
    mfu_train: float = 0.40  # model FLOPs utilisation of the FSDP update (assumption)
    mfu_forward: float = 0.40  # of the old / reference log-prob forward passes (assumption)
    decode_step_s: float = 6e-3  # one decode step at batch 1: 14 GB of bf16 weights / 3.35 TB/s + launch
    decode_per_seq_s: float = (
        26e-6  # per running sequence: KV cache read, 57 KB/token x ~1.5k tokens / 3.35 TB/s
    )
    max_running: int = 256  # sequences a vLLM replica (TP=1) decodes at once

    def __post_init__(self) -> None:
        _positive("compute", **{f.name: getattr(self, f.name) for f in fields(self)})


@dataclass(frozen=True)
class Cluster:
    """``nodes`` x ``gpus_per_node``; one NIC per node carries the stores' host traffic (bytes/s)."""

    nodes: int
    gpus_per_node: int
    nic_bytes_per_s: float
    nic_latency_s: float
    source: str = "in memory"
    #: 0: every node has cores to spare (a cluster); n: every node, store, client and the controller
    #: share one host's n cores (the measured configurations: Ray nodes on one machine)
    host_cores: int = 0

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @classmethod
    def from_topology(cls, topo: Topology, gpus: int) -> Cluster:
        """The first ``gpus`` GPUs of ``topo`` (whole nodes); the host -> remote host link is the NIC."""
        per = sum(t.kind == "hbm" for t in topo.tiers_on(topo.nodes[0]))
        if per <= 0 or gpus % per or not 0 < gpus <= topo.gpu_count:
            raise ConfigError(f"{topo.source}: {gpus} GPUs is not a whole number of its {per}-GPU nodes")
        if len(topo.nodes) < 2:
            raise ConfigError(f"{topo.source}: needs two nodes written out to read the network link")
        a, b = (f"{n}/host" for n in topo.nodes[:2])
        link = topo.link(a, b)
        if link is None:
            raise ConfigError(f"{topo.source}: no link {a} -> {b}")
        return cls(gpus // per, per, link.gb_per_s * 1e9, link.latency_us * 1e-6, topo.source)


def _cost(a: float, b: float, per_byte: float) -> dict[str, float]:
    return {"a": a, "b": b, "per_byte": per_byte}


def _default_stores() -> dict[str, dict[str, dict[str, float]]]:
    # scaling_validate.fit_stores on benchmarks/results/tq_backends.json (commit c640009: TransferQueue's
    # kv_batch_put / kv_batch_get through 1 and 3 Ray nodes on this 2-core machine, loopback; 64-1024
    # samples per call), less the controller's share of each call. a: per call, b: per sample, per_byte;
    # remote_per_byte: extra per byte when the store is on another node (the wire is the NIC's, apart).
    # SimpleStorage has no 3-node rows at one unit per node: no remote extra is known (0).
    return {
        "SimpleStorage": {
            "put": _cost(8.54e-3, 2.81e-4, 9.51e-10),
            "get": _cost(0.0, 2.60e-4, 1.15e-9),
            "remote_per_byte": {"put": 0.0, "get": 0.0},
        },
        "Conduit": {
            "put": _cost(1.52e-2, 7.24e-5, 4.36e-11),
            "get": _cost(8.32e-3, 1.28e-5, 8.9e-11),
            "remote_per_byte": {"put": 2.98e-9, "get": 2.75e-9},
        },
    }


@dataclass(frozen=True)
class Calibration:
    """The data path's constants (seconds; per sample; per byte). ``--measure`` refits them.

    ``controller``: TransferQueue's controller, one thread serving every request in turn: a request
    on ``s`` samples holds it ``fixed_s + per_sample_s * s``; a ``kv_list`` holds it ``fixed_s +
    per_key_s * keys in the partition``. ``stores``: per system and operation, one store's part of a
    call holds the store and the caller ``a + b * samples + per_byte * bytes`` (``OperatorCost``).
    ``store_share``: the share of a part's time that holds the store (the rest is the caller's own
    side: its serialisation, its copies); measured calls time both sides together, so it is assumed.
    ``channel_s``: Conduit's completion-channel call; ``poll_s``: verl's replay buffer re-reads
    ``kv_list`` this often, at most ``SHORT_POLL_S`` (issue 47: no baseline waits on verl's shipped
    2 s); ``rtt_s``: a request's network round trip to the controller.
    ``offpath_s``: host CPU seconds each part of a call (one message to a store and its reply) costs
    beyond the call's critical path: the I/O threads that move it at both ends (ZeroMQ's, Ray's core
    worker's), the receiver's wake-up. A lone call on an idle host runs that work on a spare core, so
    its latency (what ``a``, ``b`` are fitted to) does not show it; concurrent calls on a host with few
    cores queue for them. It is charged only where a ``Cluster`` has ``host_cores`` (Ray nodes sharing
    one machine's cores: the measured configurations); a cluster node's cores are plentiful next to its
    few data-path processes (``host_cores=0``), so there it costs nothing and the 2-core calibration
    does not carry into the modelled cluster; so it is never in a calibration the model extrapolates
    (``scaling_rules.check_carried``). 0 in the defaults and in the validated calibration;
    ``scaling_validate.fit_offpath`` fits it as a diagnostic of the measured host only.
    """

    # controller: scaling_validate.probe_controller on this 2-core machine (TransferQueue 0.1.11's request
    # handlers in process, message (de)serialisation included, sockets not; three runs): 0.10-0.13 ms a
    # request, 0.8-1.0 us a sample, 1.9-2.8 us a key listed; fixed_s adds 0.05 ms (assumed) for the
    # ROUTER socket's receive and send.
    controller: dict[str, float] = field(
        default_factory=lambda: {"fixed_s": 1.6e-4, "per_sample_s": 0.9e-6, "per_key_s": 2.0e-6}
    )
    stores: dict[str, dict[str, dict[str, float]]] = field(default_factory=_default_stores)
    store_share: float = 0.5
    channel_s: float = 1.3e-3
    poll_s: float = SHORT_POLL_S
    rtt_s: float = 1e-5
    offpath_s: float = 0.0
    source: str = (
        "defaults: python benchmarks/scaling_validate.py (controller probe; fit to tq_backends.json)"
    )

    def __post_init__(self) -> None:
        c = self.controller
        for key in ("fixed_s", "per_sample_s", "per_key_s"):
            v = c.get(key)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise ConfigError(
                    f"calibration controller.{key} must be a finite number >= 0, got {c.get(key)!r}"
                )
        for system in self.stores:
            for op in ("put", "get"):
                self.store(system, op)
        _positive("calibration", poll_s=self.poll_s)
        if self.poll_s > SHORT_POLL_S:
            raise ConfigError(
                f"calibration poll_s must be <= {SHORT_POLL_S} s (issue 47: every polling baseline gets "
                f"the benchmarks' short poll, not verl's shipped 2 s), got {self.poll_s!r}"
            )
        off = self.offpath_s
        if isinstance(off, bool) or not isinstance(off, int | float) or not math.isfinite(off) or off < 0:
            raise ConfigError(f"calibration offpath_s must be a finite number >= 0, got {off!r}")
        if not 0 <= self.store_share <= 1:
            raise ConfigError(f"calibration store_share must be in [0, 1], got {self.store_share!r}")

    def store(self, system: str, op: str) -> OperatorCost:
        """One store's part of a ``system`` ``op`` ("put" / "get") call on this node."""
        try:
            c = self.stores[system][op]
            cost = OperatorCost(float(c["a"]), float(c["b"]), float(c["per_byte"]))
        except (KeyError, TypeError, ValueError):
            raise ConfigError(
                f"calibration stores.{system}.{op} needs a, b, per_byte; got {self.stores.get(system)!r}"
            ) from None
        if min(cost.a, cost.b, cost.per_byte) < 0:
            raise ConfigError(f"calibration stores.{system}.{op}: negative cost {cost}")
        return cost

    def remote_per_byte(self, system: str, op: str) -> float:
        return float(self.stores[system].get("remote_per_byte", {}).get(op, 0.0))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ConfigError(f"calibration: unknown key(s) {sorted(unknown)}")
        return cls(**d)
