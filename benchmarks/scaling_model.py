"""A discrete-event model (SimPy) of one GRPO iteration on a cluster, for two data-path designs.

Why SimPy and not the core cost model's equations alone: those give one call's time and a steady
pipeline's, but what decides a cluster's data path is waiting: every rank asking the one controller at
once, responses finishing in a long tail, many puts converging on one store or one NIC. A schedule
of events gives that waiting without a queueing formula per case. Shared resources are SimPy
``Resource``s of capacity 1, so contention and queueing come out of the
schedule rather than from a formula: TransferQueue's controller (one process, one thread: every
request of every client in turn), one store per node, one NIC per node for the stores' host traffic
(send and receive apart), and each calling process (the driver, each agent-loop worker, each training
rank; a process does its own side of its calls' parts one at a time, the stores theirs meanwhile).
Where the nodes share one host's cores (``Cluster.host_cores``: the measured configurations, Ray nodes on
one machine) every such service holds one of those cores while it works, and so does each part's off-path
work (``Calibration.offpath_s``; none without ``host_cores``). Each call's service time is the core's
cost-model equation (``OperatorCost``: a + b * samples + per_byte * bytes, constants from the
``Calibration``); the wire is bytes / the NIC's rate.

The iteration (verl 0.9.1's GRPO step, phases one after another, the same compute in both designs):
generation (each response put when it finishes, by the agent-loop worker that handled it) and the
trainer's noticing that it is complete; the old and reference log-prob stages (each rank gets its
shard, computes, puts its log-probs; the driver gets them and puts what it derives); the advantage
stage (driver); the update (each rank gets its shard of the training fields); the clear.

- ``tq_simplestorage``: SimpleStorage's storage units (one per node), the driver puts once per stage,
  the replay buffer notices completion by re-reading ``kv_list`` every ``poll_s``.
- ``conduit``: Conduit's stores (one per node), the driver's derived fields put once per piece (one
  whole-batch piece: nothing overlaps generation here), completion through the channel.

Both keep TransferQueue's controller and its requests (Conduit's backend plugs in under it). The data
path's time is the iteration less the same iteration with a free data path (every constant 0).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy
from scaling_config import (
    ADVANTAGE_READS,
    LOGPROB_READS,
    REQUESTS,
    ROLLOUT_FIELDS,
    UPDATE_READS,
    Calibration,
    Cluster,
    Compute,
    Workload,
)

Proc = Generator[Any, Any, Any]
#: serial resources; ``relieve`` makes some unbounded (nobody queues; each use still costs its time)
RESOURCES = ("controller", "stores", "nics", "agents")
#: calling processes; ``free_calls`` makes their calls cost nothing
CALLERS = {"driver": "driver", "agent": "agents", "rank": "ranks"}
UNBOUNDED = 10**9


@dataclass(frozen=True)
class Design:
    """A data-path design: its store (a ``Calibration.stores`` key), how completion is noticed
    (``"channel"`` or ``"poll"``) and whether the driver puts once per stage (else once per piece)."""

    name: str
    store: str
    completion: str
    put_per_stage: bool


DESIGNS = {
    "conduit": Design("conduit", "Conduit", "channel", put_per_stage=False),
    "tq_simplestorage": Design("tq_simplestorage", "SimpleStorage", "poll", put_per_stage=True),
}


def work(env: simpy.Environment, cpu: simpy.Resource | None, seconds: float) -> Proc:
    """``seconds`` of a process's own work; on a shared host (``cpu``: its cores) while holding a core."""
    if cpu is None:
        yield env.timeout(seconds)
        return
    with cpu.request() as core:
        yield core
        yield env.timeout(seconds)


class Controller:
    """A serial server: each request holds it ``service_s``; requests queue in arrival order."""

    def __init__(self, env: simpy.Environment, capacity: int = 1, cpu: simpy.Resource | None = None) -> None:
        self.env = env
        self.cpu = cpu
        self.server = simpy.Resource(env, capacity=capacity)
        self.busy_s = 0.0
        self.wait_s = 0.0
        self.max_wait_s = 0.0
        self.requests = 0

    def serve(self, service_s: float) -> Proc:
        start = self.env.now
        with self.server.request() as turn:
            yield turn
            waited = self.env.now - start
            self.wait_s += waited
            self.max_wait_s = max(self.max_wait_s, waited)
            yield from work(self.env, self.cpu, service_s)
        self.busy_s += service_s
        self.requests += 1


def finish_times(response: np.ndarray, gpus: int, c: Compute) -> np.ndarray:
    """When each response finishes decoding: response ``i`` on replica ``i mod gpus`` (TP=1), each
    replica running at most ``max_running`` at once (a finished one lets the next start), a decode
    step taking ``decode_step_s + decode_per_seq_s * running``."""
    out = np.empty(len(response))
    for g in range(gpus):
        idx = np.arange(g, len(response), gpus)
        running = min(len(idx), c.max_running)
        step = c.decode_step_s + c.decode_per_seq_s * running
        slots = [0.0] * running
        for i in idx:
            start = heapq.heappop(slots)
            out[i] = start + response[i] * step
            heapq.heappush(slots, out[i])
    return out


class Iteration:
    """One simulated iteration of ``design`` on ``cluster``; :meth:`run` returns its record."""

    def __init__(
        self,
        design: Design,
        cluster: Cluster,
        workload: Workload,
        compute: Compute,
        cal: Calibration,
        seed: int,
        agent_workers: int = 8,
        relieve: frozenset[str] = frozenset(),
        free_calls: frozenset[str] = frozenset(),
    ) -> None:
        unknown = (relieve - set(RESOURCES)) | (free_calls - set(CALLERS.values()))
        if unknown:
            raise ValueError(
                f"unknown resource(s) {sorted(unknown)}: relieve {RESOURCES}, free_calls {set(CALLERS.values())}"
            )
        self.d, self.cl, self.w, self.c, self.cal = design, cluster, workload, compute, cal
        self.relieve, self.free_calls = relieve, free_calls
        self.env = simpy.Environment()
        #: a shared host's cores (``Cluster.host_cores``), held by every service the model charges
        self.cpu = simpy.Resource(self.env, cluster.host_cores) if cluster.host_cores else None
        self.ctrl = Controller(self.env, self._capacity("controller"), self.cpu)
        n = cluster.nodes
        self.stores = [simpy.Resource(self.env, self._capacity("stores")) for _ in range(n)]
        self.tx = [simpy.Resource(self.env, self._capacity("nics")) for _ in range(n)]
        self.rx = [simpy.Resource(self.env, self._capacity("nics")) for _ in range(n)]
        self.callers: dict[str, simpy.Resource] = {}
        self.busy: dict[str, float] = defaultdict(float)
        self.nic_bytes = 0.0
        self.bytes_moved = 0.0
        self.agent_workers = agent_workers
        self.prompt, self.response = workload.lengths(seed)
        self.phases: dict[str, float] = {}

    # ---------------------------------------------------------------------------------- the data path

    def _capacity(self, resource: str) -> int:
        return UNBOUNDED if resource in self.relieve else 1

    def _caller(self, name: str) -> simpy.Resource:
        if name not in self.callers:
            self.callers[name] = simpy.Resource(self.env, self._capacity(CALLERS[name.rstrip("0123456789")]))
        return self.callers[name]

    def request(self, samples: int, keys: int = 0) -> Proc:
        """One controller request: the round trip and the controller's turn."""
        c = self.cal.controller
        yield self.env.timeout(self.cal.rtt_s)
        yield from self.ctrl.serve(c["fixed_s"] + c["per_sample_s"] * samples + c["per_key_s"] * keys)

    def call(self, caller: str, node: int, op: str, idx: np.ndarray, per_sample_bytes: np.ndarray) -> Proc:
        """A TransferQueue client call (``put`` / ``get``) from ``caller`` on ``node`` on samples ``idx``:
        its controller requests, and one part per owning store (samples ``i mod nodes``), sent as the
        clients do (``asyncio.gather``): the caller works through its side of each part in turn (its
        node's store first), and each store serves its side (and the NICs carry a remote part's bytes)
        while the caller goes on to the next."""
        s = len(idx)
        self.bytes_moved += float(per_sample_bytes.sum())
        if CALLERS[caller.rstrip("0123456789")] in self.free_calls:
            return
        first, last = (1, REQUESTS[op] - 1)
        for _ in range(first):
            yield from self.request(s)
        owner = idx % self.cl.nodes
        counts = np.bincount(owner, minlength=self.cl.nodes)
        nbytes = np.bincount(owner, weights=per_sample_bytes, minlength=self.cl.nodes)
        cost = self.cal.store(self.d.store, op)
        extra = self.cal.remote_per_byte(self.d.store, op)
        owners = sorted(np.flatnonzero(counts).tolist(), key=lambda o: o != node)
        parts = []
        for o in owners:
            remote = o != node
            svc = cost.seconds(int(counts[o]), float(nbytes[o])) + (
                extra * float(nbytes[o]) if remote else 0.0
            )
            mine = (1 - self.cal.store_share) * svc
            with self._caller(caller).request() as me:
                yield me
                yield from work(self.env, self.cpu, mine)  # the caller's own side of the part
            self.busy[caller] += mine
            parts.append(self.env.process(self._store_side(o, svc - mine, node, op, float(nbytes[o]))))
        yield simpy.AllOf(self.env, parts)
        for _ in range(last):
            yield from self.request(s)

    def _store_side(self, o: int, seconds: float, node: int, op: str, nbytes: float) -> Proc:
        if self.cpu is not None and self.cal.offpath_s > 0:  # the part's I/O threads: a core, off the path
            self.env.process(work(self.env, self.cpu, self.cal.offpath_s))
        with self.stores[o].request() as st:
            yield st
            yield from work(self.env, self.cpu, seconds)
            self.busy[f"store{o}"] += seconds
            if o != node and nbytes > 0:
                yield from self.wire(*((node, o) if op == "put" else (o, node)), nbytes)

    def wire(self, src: int, dst: int, nbytes: float) -> Proc:
        """``nbytes`` from node ``src``'s NIC to node ``dst``'s (each held while the bytes pass)."""
        t = self.cl.nic_latency_s + nbytes / self.cl.nic_bytes_per_s
        with self.tx[src].request() as a:
            yield a
            with self.rx[dst].request() as b:
                yield b
                yield self.env.timeout(t)
        self.busy[f"nic{src}"] += t
        self.busy[f"nic{dst}"] += t
        self.nic_bytes += nbytes

    def bytes_of(self, names: tuple[str, ...], idx: np.ndarray) -> np.ndarray:
        return self.w.field_bytes(names, self.prompt[idx], self.response[idx])

    # ------------------------------------------------------------------------------------- the phases

    def generate(self) -> Proc:
        done = finish_times(self.response, self.cl.gpus, self.c)
        self.decode_end = float(done.max())
        puts = [self.env.process(self._put_rollout(i, float(t))) for i, t in enumerate(done)]
        if self.d.completion == "poll":
            yield self.env.process(self._poll(puts))
        else:
            yield simpy.AllOf(self.env, puts)
            yield self.env.timeout(self.cal.channel_s)

    def _put_rollout(self, i: int, t: float) -> Proc:
        yield self.env.timeout(t)
        a = i % self.agent_workers
        idx = np.array([i])
        yield from self.call(f"agent{a}", a % self.cl.nodes, "put", idx, self.bytes_of(ROLLOUT_FIELDS, idx))

    def _poll(self, puts: list[simpy.Process]) -> Proc:
        """verl's replay buffer: ``kv_list`` every ``poll_s`` until a listing shows every response."""
        while True:
            yield self.env.timeout(self.cal.poll_s)
            finished = sum(p.triggered for p in puts)
            yield from self.request(0, keys=finished)
            if finished == len(puts):
                return

    def logprob_stage(self, out_field: str) -> Proc:
        ranks = [self.env.process(self._rank_logprob(g)) for g in range(self.cl.gpus)]
        yield simpy.AllOf(self.env, ranks)
        everything = np.arange(self.w.responses)
        yield from self.call("driver", 0, "get", everything, self.bytes_of((out_field,), everything))
        if self.d.put_per_stage:
            yield from self.call("driver", 0, "put", everything, self.bytes_of((out_field,), everything))

    def _shard(self, g: int) -> np.ndarray:
        return np.arange(g, self.w.responses, self.cl.gpus)

    def _rank_logprob(self, g: int) -> Proc:
        idx, node = self._shard(g), g // self.cl.gpus_per_node
        yield from self.call(f"rank{g}", node, "get", idx, self.bytes_of(LOGPROB_READS, idx))
        tokens = float((self.prompt[idx] + self.response[idx]).sum())
        yield self.env.timeout(2 * self.w.params * tokens / (self.c.peak_flops * self.c.mfu_forward))
        yield from self.call(f"rank{g}", node, "put", idx, self.bytes_of(("old_log_probs",), idx))

    def advantage(self) -> Proc:
        everything = np.arange(self.w.responses)
        yield from self.call("driver", 0, "get", everything, self.bytes_of(ADVANTAGE_READS, everything))
        derived = (
            ("advantages", "returns")
            if self.d.put_per_stage
            else ("old_log_probs", "ref_log_prob", "advantages", "returns")
        )
        yield from self.call("driver", 0, "put", everything, self.bytes_of(derived, everything))

    def update(self) -> Proc:
        ranks = [self.env.process(self._rank_update(g)) for g in range(self.cl.gpus)]
        yield simpy.AllOf(self.env, ranks)

    def _rank_update(self, g: int) -> Proc:
        idx, node = self._shard(g), g // self.cl.gpus_per_node
        yield from self.call(f"rank{g}", node, "get", idx, self.bytes_of(UPDATE_READS, idx))
        tokens = float((self.prompt[idx] + self.response[idx]).sum())
        yield self.env.timeout(6 * self.w.params * tokens / (self.c.peak_flops * self.c.mfu_train))

    def clear(self) -> Proc:
        """kv_clear: mark_clearing, one call per store (its per-call cost, split as a call's part), clear_meta."""
        yield from self.request(self.w.responses)
        a = self.cal.store(self.d.store, "get").a
        mine = (1 - self.cal.store_share) * a
        parts = []
        for o in range(min(self.cl.nodes, self.w.responses)):
            with self._caller("driver").request() as me:
                yield me
                yield from work(self.env, self.cpu, mine)
            self.busy["driver"] += mine
            parts.append(self.env.process(self._store_side(o, a - mine, o, "get", 0.0)))
        yield simpy.AllOf(self.env, parts)
        yield from self.request(self.w.responses)

    def _iteration(self) -> Proc:
        steps = [
            ("generate", self.generate),
            ("old_log_prob", lambda: self.logprob_stage("old_log_probs")),
            ("ref_log_prob", lambda: self.logprob_stage("ref_log_prob")),
            ("advantage", self.advantage),
            ("update", self.update),
            ("clear", self.clear),
        ]
        for name, step in steps:
            t = self.env.now
            yield from step()
            self.phases[name] = self.env.now - t
        self.end_s = float(self.env.now)  # off-path work may still hold a core; the iteration is over

    def run(self) -> dict[str, Any]:
        """Simulate the iteration; its time, phases, the busiest resources and the controller's load."""
        self.env.process(self._iteration())
        self.env.run()
        total = self.end_s
        kinds: dict[str, float] = defaultdict(float)
        for name, s in self.busy.items():
            kind = name.rstrip("0123456789")
            kinds[kind] = max(kinds[kind], s)
        busy = {"controller": self.ctrl.busy_s, **{f"busiest_{k}": v for k, v in kinds.items()}}
        return {
            "iteration_s": total,
            "phases_s": self.phases,
            "decode_s": self.decode_end,
            "busy_s": busy,
            "controller": {
                "requests": self.ctrl.requests,
                "busy_s": self.ctrl.busy_s,
                "queue_wait_s": self.ctrl.wait_s,
                "max_wait_s": self.ctrl.max_wait_s,
                "mean_service_s": self.ctrl.busy_s / max(1, self.ctrl.requests),
            },
            "nic_bytes": self.nic_bytes,
            "work": {
                "responses": self.w.responses,
                "prompt_tokens": int(self.prompt.sum()),
                "response_tokens": int(self.response.sum()),
                "bytes_moved": self.bytes_moved,
            },
        }


def compute_only_s(cluster: Cluster, workload: Workload, compute: Compute, seed: int = 0) -> float:
    """The iteration with a free data path: the last response's decode, the slowest rank's two
    forward passes and its update (its tokens: prompt + response of its shard)."""
    prompt, response = workload.lengths(seed)
    tokens = np.bincount(np.arange(workload.responses) % cluster.gpus, weights=prompt + response).max()
    forward = 2 * workload.params * tokens / (compute.peak_flops * compute.mfu_forward)
    train = 6 * workload.params * tokens / (compute.peak_flops * compute.mfu_train)
    return float(finish_times(response, cluster.gpus, compute).max() + 2 * forward + train)


def simulate(
    design: Design,
    cluster: Cluster,
    workload: Workload,
    compute: Compute,
    cal: Calibration,
    seed: int = 0,
    relieve: frozenset[str] = frozenset(),
    free_calls: frozenset[str] = frozenset(),
    agent_workers: int = 8,
) -> dict[str, Any]:
    """One iteration; ``data_path_s`` is its time less the same iteration's with a free data path."""
    real = Iteration(
        design, cluster, workload, compute, cal, seed, agent_workers, relieve=relieve, free_calls=free_calls
    ).run()
    free = compute_only_s(cluster, workload, compute, seed)
    data = max(0.0, real["iteration_s"] - free)
    return {
        **real,
        "free_iteration_s": free,
        "data_path_s": data,
        "data_path_share": data / real["iteration_s"],
    }
