"""The driver side of ``tq_backends.py`` (the method: ``notes/tq_backends.md``): one phase's cells, rounds
interleaved over the systems' worker subprocesses, the memcpy reference timed in the same rounds, the rows."""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from child import Child
from tq_batch import cell_seed, make_arrays, min_field_bytes, payload_bytes
from tq_worker import CALL_TIMEOUT_S, MIB, START_TIMEOUT_S, parse_label

HERE = Path(__file__).resolve().parent
NIXL_NOTE = (
    " (TQ's RayStorageClient.put calls ray.put(tensor, _tensor_transport='nixl') for every tensor;"
    " Ray's NIXL transport needs the nixl package, which is not installed here, so RayStore cannot"
    " store tensors on this machine)"
)


class Worker(Child):
    """A system's worker subprocess (``tq_backends.py --worker``), with its own Ray temp folder."""

    def __init__(self, label: str, nodes: int, logdir: Path, threads: int) -> None:
        self.system = label
        backend, units = parse_label(label)
        self.tmp = Path(tempfile.mkdtemp(prefix=f"tqb{nodes}{backend[:2]}{units or ''}", dir="/tmp"))
        path = os.pathsep.join([str(HERE), str(HERE / "peers"), os.environ.get("PYTHONPATH", "")])
        # the cross-node client actors import tq_worker (and its imports) in Ray's worker processes
        env = dict(os.environ, RAY_TMPDIR=str(self.tmp), PYTHONUNBUFFERED="1", RAY_DEDUP_LOGS="0",
                   PYTHONPATH=path)  # fmt: skip
        cmd = [sys.executable, str(HERE / "tq_backends.py"), "--worker", backend, "--nodes", str(nodes),
               "--threads", str(threads), *(["--units", str(units)] if units else [])]  # fmt: skip
        super().__init__(label, cmd, logdir / f"{backend}{units or ''}-nodes{nodes}.log", env, HERE.parent)
        self.error: str | None = None
        self.info: dict[str, Any] = {}

    def start(self, deadline: float) -> None:
        """Wait for the worker's ready line; a failure sets ``error`` and ends the worker."""
        try:
            self.info = self.receive(max(deadline - time.monotonic(), 1.0))
        except (TimeoutError, RuntimeError) as e:
            self.info = {"ready": False, "error": str(e)}
        if not self.info.get("ready"):
            self.error = "startup: " + str(self.info.get("error"))
            self.kill()

    @property
    def alive(self) -> bool:
        return self.error is None and self.proc.poll() is None

    def kill(self) -> None:
        super().kill()
        shutil.rmtree(self.tmp, ignore_errors=True)


def time_memcpy(values: list[Any], into: list[Any] | None = None, min_total_s: float = 0.02,
                max_reps: int = 20) -> float:  # fmt: skip
    """Fastest of a few back-to-back copies of every field: ``clone`` (fresh memory, as a get returns),
    or ``copy_`` into the preallocated ``into`` (no allocation, no page faults)."""
    best, spent, reps = float("inf"), 0.0, 0
    while reps < 2 or (spent < min_total_s and reps < max_reps):
        t0 = time.perf_counter()
        if into is None:
            out = [v.clone() for v in values]
        else:
            for d, v in zip(into, values):
                d.copy_(v)
        seconds = time.perf_counter() - t0
        if into is None:
            del out
        best, spent, reps = min(best, seconds), spent + seconds, reps + 1
    return best


def conduit_path_bytes(op: str, counters: list[list[dict]] | None) -> dict[str, Any] | None:
    """Bytes per round through each of Conduit's paths for ``op``, from the storage actors' counters
    (summed over the actors, averaged over the rounds), and the share that took the mapped path."""
    if not counters:
        return None
    keys = ("bytes_put", "bytes_put_direct") if op == "put" else ("bytes_get_mapped", "bytes_get_copied")
    per_round = {k: sum(a[k] for run in counters for a in run) / len(counters) for k in keys}
    if op == "put":
        total, mapped = per_round["bytes_put"], per_round["bytes_put_direct"]
    else:
        mapped = per_round["bytes_get_mapped"]
        total = mapped + per_round["bytes_get_copied"]
    return {**{k: round(v) for k, v in per_round.items()}, "storage_actors": len(counters[0]),
            "mapped_share": round(mapped / total, 4) if total else None}  # fmt: skip


def make_row(system: str, op: str, nodes: int, samples: int, tokens: int, nbytes: int, per_field: int,
             secs: list[float], memcpy_s: float | None, units: int | None = None,
             paths: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    med = statistics.median(secs)
    row: dict[str, Any] = {"system": system}
    if system == "SimpleStorage":
        row["storage_units"] = units
    row.update({
        "op": op, "nodes": nodes, "samples": samples, "tokens_per_sample": tokens, "bytes": nbytes,
        "seconds": med, "gb_per_s": nbytes / med / 1e9,
        "memcpy_equivalents": None if not memcpy_s else round(med / memcpy_s, 2),
        "min_field_bytes": per_field, "all_seconds": [round(x, 6) for x in secs],
    })  # fmt: skip
    if system == "Conduit":
        row["conduit_path_bytes"] = paths
    return row


def backend_split(secs: list[float], backend: list[float]) -> dict[str, Any]:
    """Medians of the time inside the backend and of the rest (TransferQueue's client), per round."""
    return {"backend_seconds": statistics.median(backend),
            "client_seconds": statistics.median(s - b for s, b in zip(secs, backend))}  # fmt: skip


class Phase:
    """The cells of one phase over the systems' workers; failures go to ``skipped`` and ``errors``."""

    def __init__(self, nodes: int, systems: list[str], rounds: int, logdir: Path, skipped: dict[str, str],
                 errors: list[dict], threads: int) -> None:  # fmt: skip
        self.nodes, self.rounds, self.skipped, self.errors = nodes, rounds, skipped, errors
        self.systems = [s for s in systems if s not in skipped]
        self.name = "same node" if nodes == 1 else f"cross node ({nodes}-node cluster)"
        print(f"\n== {self.name}: starting workers for {', '.join(self.systems)} ...", flush=True)
        self.workers = {s: Worker(s, nodes, logdir, threads) for s in self.systems}
        deadline = time.monotonic() + START_TIMEOUT_S  # they start in parallel
        for w in self.workers.values():
            w.start(deadline)
            if w.error:
                skipped[w.system] = w.error
                print(f"   {w.system}: FAILED to start: {w.error.splitlines()[0][:300]}", flush=True)
            else:
                print(f"   {w.system}: ready in {w.info.get('startup_s', 0):.1f}s", flush=True)

    def call(self, s: str, msg: dict[str, Any]) -> dict[str, Any] | None:
        """System ``s``'s reply to one round of a cell; None (and the error recorded) where it failed."""
        w = self.workers[s]
        try:
            res = w.call(msg, CALL_TIMEOUT_S)
        except (TimeoutError, RuntimeError, OSError) as e:
            res = {"error": str(e)}
            w.error = str(e)
        where = {"system": s, "nodes": self.nodes, "samples": msg["samples"], "tokens": msg["tokens"],
                 "round": msg["round"]}  # fmt: skip
        if "error" in res:
            self.errors.append({**where, "error": res["error"], "traceback": res.get("traceback")})
            print(f"   {s} {msg['samples']}x{msg['tokens']} round {msg['round']}: ERROR {res['error'][:300]}",
                  flush=True)  # fmt: skip
            if s == "RayStore" or not w.alive:  # RayStore failing: see tq_backends' docstring
                w.error = w.error or res["error"]
                self.skipped[s] = res["error"] + (NIXL_NOTE if "nixl" in res["error"] else "")
                w.close()
            return None
        if res.get("mismatch"):
            self.errors.append({**where, "error": "data read back differs: " + res["mismatch"]})
            print(f"   {s}: DATA MISMATCH: {res['mismatch']}", flush=True)
        return res

    def cell(self, ci: int, samples: int, tokens: int) -> list[dict]:
        """The rows of one cell: every live system and the memcpy references, rounds interleaved."""
        seed = cell_seed(samples, tokens)
        arrays = make_arrays(samples, tokens, seed)
        flats = [*arrays["values"].values(), arrays["rm_scores"]]
        into = [v.clone() for v in flats]
        nbytes, per_field = payload_bytes(arrays), min_field_bytes(arrays)
        results: dict[str, list[dict]] = {s: [] for s in self.systems}
        verified: dict[str, bool] = {}
        memcpy_s: list[float] = []
        copy_into_s: list[float] = []
        for r in range(self.rounds + 1):
            live = [s for s in self.systems if self.workers[s].alive]
            order = live[r % len(live) :] + live[: r % len(live)] if live else []
            for s in order:
                msg = {"cmd": "cell", "samples": samples, "tokens": tokens, "seed": seed,
                       "tag": f"n{self.nodes}c{ci}r{r}", "verify": r == 0, "round": r}  # fmt: skip
                res = self.call(s, msg)
                if res is None:
                    continue
                if r == 0:
                    verified[s] = bool(res.get("verified"))
                else:
                    results[s].append(res)
            if r > 0:
                memcpy_s.append(time_memcpy(flats))
                copy_into_s.append(time_memcpy(flats, into))
        del arrays, flats, into
        rows: list[dict] = []
        med_memcpy = statistics.median(memcpy_s) if memcpy_s else None
        if med_memcpy is not None:
            for op, secs in (("copy", memcpy_s), ("copy_into", copy_into_s)):
                rows.append(
                    make_row("memcpy", op, self.nodes, samples, tokens, nbytes, per_field, secs, None)
                )
        for s, runs in results.items():
            for op in ("put", "get") if runs else ():
                secs = [x[f"{op}_s"] for x in runs]
                counters = [x[f"{op}_counters"] for x in runs if x.get(f"{op}_counters")]
                backend_name, units = parse_label(s)
                paths = conduit_path_bytes(op, counters) if backend_name == "Conduit" else None
                row = make_row(backend_name, op, self.nodes, samples, tokens, nbytes, per_field, secs,
                               med_memcpy, units=units, paths=paths)  # fmt: skip
                split = backend_split(secs, [x[f"{op}_backend_s"] for x in runs])
                rows.append({**row, **split, "verified": verified.get(s, False)})
        return rows

    def run(self, cells: list[tuple[int, int]], t_start: float) -> list[dict]:
        """All cells of the phase (the workers closed at the end); returns the rows."""
        rows: list[dict] = []
        try:
            for ci, (samples, tokens) in enumerate(cells):
                if not any(w.alive for w in self.workers.values()):
                    print(f"   no system left to measure in the {self.name} phase", flush=True)
                    break
                got = self.cell(ci, samples, tokens)
                rows += got
                nbytes = got[0]["bytes"] if got else 0
                line = [f"{r['system']}{'@' + str(r['storage_units']) if r.get('storage_units') else ''} "
                        f"{r['op']} {r['gb_per_s']:.2f}" for r in got if r["system"] != "memcpy"]  # fmt: skip
                clone = next((r for r in got if r["op"] == "copy"), None)
                print(
                    f"[{self.name} cell {ci + 1}/{len(cells)}] {samples}x{tokens} ({nbytes / MIB:.1f} MiB) GB/s: "
                    + ", ".join(line)
                    + (f", memcpy(clone) {clone['gb_per_s']:.2f}" if clone else "")
                    + f"  [t={time.perf_counter() - t_start:.0f}s, load {os.getloadavg()[0]:.2f}]",
                    flush=True,
                )
        finally:
            for w in self.workers.values():
                w.close()
        return rows
