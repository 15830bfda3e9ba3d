"""verl crash trials: SIGKILL a ``conduit``-mode trainer mid-step, resume, count what the resume kept.

Real verl in CPU mode (``tools/verl_cpu``), GRPO, a checkpoint after every step, a *paced*
rollout (real tokens released at a modelled inference server's times, ``pace.py``: generation
times are modelled, not measured on a GPU). Two systems, the same run config:

- ``conduit``: trainer mode ``conduit`` with the rollout journal on (``trainer.v1.conduit.journal``):
  the resume restores the interrupted step's journaled groups and generates only the others;
- ``verl``: the same mode with the journal off, i.e. verl's own resume: the checkpoint of the
  previous step, and the interrupted step's generation thrown away (verl keeps finished rollouts
  only in memory).

One long run per system; trial ``t`` kills the whole job (launcher, Ray, workers) at a random
moment of step ``t + 1`` (a fraction of the previous step's generation time, the same fractions for
both systems) and relaunches the same command, which resumes; each relaunch is a trial. Per trial:
the prompt groups kept (restored from the journal) and regenerated, the requests the rollout server
saw again, prompts lost / duplicated (the resumed step's trained prompts, counted against verl's
resumed step: must be zero), whether the kept groups' trained responses are the journaled ones
(checksum), and the generation time lost to the crash::

    lost_gen_s = elapsed_gen_s - (ref_gen_s - resumed_gen_s)

``elapsed_gen_s``: generation wall time of the step before the kill; ``resumed_gen_s``: the resumed
step's generation time (verl's ``timing_s/gen``); ``ref_gen_s``: verl's resumed step's (it
generates the whole step again). For verl it is ``elapsed_gen_s``: all of it. The durability lag
(group finished → journal fsynced) comes from the journal's ``lag.jsonl``.

    .venv/bin/python benchmarks/verl_crash_resume.py [--quick] [--trials N]

Writes ``benchmarks/results/verl_crash_resume.json`` (with provenance) and ``.png``; prints a table.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
from conduit_verl_cpu.crash import kill_session, responses_checksum  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SYSTEMS = {"conduit": "on", "verl": "off"}  # system -> --journal


def command(work: Path, steps: int, args: argparse.Namespace, journal: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "conduit_verl_cpu.run",
        "--trainer-mode",
        "conduit",
        "--steps",
        str(steps),
        "--rollout",
        "paced",
        "--pace-scale",
        str(args.pace_scale),
        "--batch-size",
        str(args.batch_size),
        "--n",
        str(args.n),
        "--seed",
        str(args.seed),
        "--save-freq",
        "1",
        "--journal",
        journal,
        "--dump-samples",
        "--work-dir",
        str(work),
    ]


def env() -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "tools/verl_cpu"), out.get("PYTHONPATH")) if p)
    return out


def lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (a line torn by a kill is skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def step_metrics(work: Path, step: int) -> dict[str, Any] | None:
    """The metrics of ``step`` logged by the current launch (verl's file logger truncates per launch)."""
    found = [m["data"] for m in lines(work / "metrics.jsonl") if m.get("step") == step]
    return found[-1] if found else None


def resumed_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """What a trial keeps of its resumed step's metrics."""
    keys = ("timing_s/gen", "conduit/journal_restored_groups", "conduit/journal_generated_groups")
    return {k: metrics[k] for k in keys if k in metrics}


def journaled(work: Path, step: int) -> list[dict[str, Any]]:
    """The groups journaled for ``step`` right after a kill: prompt ids and response checksum."""
    from conduit_verl.journal import journal_root, read_step

    groups, _ = read_step(journal_root(work / "ckpt"), step)
    return [
        {
            "prompt": g.samples[0]["prompts"].tolist(),
            "checksum": responses_checksum([s["responses"].tolist() for s in g.samples]),
            # request-seconds its responses took (the agent loop's own per-sample timer)
            "request_s": sum(
                float((s.get("metrics") or {}).get("generate_sequences", 0.0)) for s in g.samples
            ),
        }
        for g in groups
    ]


def run_system(
    system: str, work: Path, args: argparse.Namespace, fractions: list[float]
) -> list[dict[str, Any]]:
    """One long run of ``system`` with a kill in each step 2..trials+1; the raw trial records."""
    steps = args.trials + 1
    cmd = command(work, steps, args, SYSTEMS[system])
    trials: list[dict[str, Any]] = []
    log = open(work.parent / f"{system}.log", "w")  # noqa: SIM115
    launch = lambda: subprocess.Popen(  # noqa: E731
        cmd, cwd=ROOT, env=env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    proc = launch()
    try:
        for t, fraction in enumerate(fractions, start=1):
            step = t + 1
            deadline = time.monotonic() + args.step_timeout
            while (prev := step_metrics(work, step - 1)) is None:  # step `step` begins
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{system}: run ended before step {step - 1} finished; see {log.name}")
                time.sleep(0.05)
            t_step_seen = time.time()
            if trials:  # verl's file logger starts a new metrics file per launch: read it now
                trials[-1]["resumed"] = resumed_metrics(prev)
            delay = fraction * float(prev.get("timing_s/gen", 5.0))
            time.sleep(delay)
            t_kill = time.time()
            kill_session(proc)
            events_at_kill = len(lines(work / "gen_events.jsonl"))
            trials.append(
                {
                    "trial": t,
                    "step": step,
                    "kill_fraction": fraction,
                    "kill_delay_s": delay,
                    "t_step_seen": t_step_seen,
                    "t_kill": t_kill,
                    "events_at_kill": events_at_kill,
                    "trained_before_kill": step_metrics(work, step) is not None,
                    "journaled": journaled(work, step) if SYSTEMS[system] == "on" else [],
                }
            )
            proc = launch()
        proc.wait(timeout=args.step_timeout * 2)
        if proc.returncode != 0:
            raise RuntimeError(
                f"{system}: the last resumed run failed (rc {proc.returncode}); see {log.name}"
            )
        trials[-1]["resumed"] = resumed_metrics(step_metrics(work, trials[-1]["step"]) or {})
    finally:
        if proc.poll() is None:
            kill_session(proc)
        log.close()
    return trials


def measure(system: str, work: Path, trials: list[dict[str, Any]], n: int) -> None:
    """Fill each trial's counts from the run's logs (gen events, metrics, sample dump)."""
    events = lines(work / "gen_events.jsonl")
    dumps: dict[int, list[dict[str, Any]]] = {}
    for d in lines(work / "samples.jsonl"):
        dumps[d["step"]] = d["samples"]  # the last dump of a step: the resumed step's
    for i, tr in enumerate(trials):
        step = tr["step"]
        # the server numbers weight versions per process, so a step's requests are found by time
        # (before the kill: sent after the step began) and by version (after: the relaunch's first)
        seg_start = trials[i - 1]["events_at_kill"] if i else 0
        seg_end = trials[i + 1]["events_at_kill"] if i + 1 < len(trials) else len(events)
        before = [e for e in events[seg_start : tr["events_at_kill"]] if e["t0"] >= tr["t_step_seen"]]
        resumed = events[tr["events_at_kill"] : seg_end]
        after = [e for e in resumed if e["version"] == resumed[0]["version"]] if resumed else []
        t_gen_start = min((e["t0"] for e in before), default=tr["t_kill"])
        tr["elapsed_gen_s"] = max(0.0, tr["t_kill"] - t_gen_start)
        tr["requests_before_kill"] = len(before)
        tr["requests_regenerated"] = len(after)
        # generation work (request-seconds) done in the step before the kill, and what was kept
        tr["work_before_kill_s"] = sum(e["t1"] - e["t0"] for e in before)
        tr["work_kept_s"] = sum(g["request_s"] for g in tr["journaled"])
        m = tr.pop("resumed", {})
        tr["resumed_gen_s"] = m.get("timing_s/gen")
        tr["kept_groups"] = int(m.get("conduit/journal_restored_groups", 0))
        tr["requests_lost"] = max(0, tr["requests_before_kill"] - tr["kept_groups"] * n)
        tr["work_lost_s"] = max(0.0, tr["work_before_kill_s"] - tr["work_kept_s"])
        tr["generated_groups"] = int(m.get("conduit/journal_generated_groups", 0))
        samples = dumps.get(step, [])
        tr["trained_prompts"] = sorted(s["prompt"] for s in samples)
        trained = collections.defaultdict(list)
        for s in samples:
            trained[tuple(s["prompt"])].append(s["response"])
        tr["kept_data_equal"] = all(
            responses_checksum(trained[tuple(g["prompt"])][:n]) == g["checksum"]
            or len(trained[tuple(g["prompt"])]) > n  # the prompt text drawn twice: checked by count only
            for g in tr["journaled"]
        )


def compare(conduit: list[dict[str, Any]], verl: list[dict[str, Any]], n: int) -> None:
    """Lost / duplicated prompts and the generation time lost, against verl's resumed steps."""
    ref = {tr["step"]: tr for tr in verl}
    for tr in [*conduit, *verl]:
        base = ref.get(tr["step"])
        want = collections.Counter(map(tuple, base["trained_prompts"])) if base else collections.Counter()
        got = collections.Counter(map(tuple, tr["trained_prompts"]))
        tr["prompts_lost"] = sum(max(0, want[p] - got[p]) for p in want) // n
        tr["prompts_duplicated"] = sum(max(0, got[p] - want[p]) for p in got) // n
        ref_gen = base["resumed_gen_s"] if base else None
        if ref_gen is None or tr["resumed_gen_s"] is None:
            tr["lost_gen_s"] = None
        else:
            tr["lost_gen_s"] = tr["elapsed_gen_s"] - (ref_gen - tr["resumed_gen_s"])


def lag_stats(work: Path) -> dict[str, Any]:
    from conduit_verl.journal import journal_root

    lags = sorted(x for line in lines(journal_root(work / "ckpt") / "lag.jsonl") for x in line["lag_s"])
    if not lags:
        return {"groups": 0}
    return {
        "groups": len(lags),
        "median_s": statistics.median(lags),
        "p95_s": lags[min(len(lags) - 1, int(0.95 * len(lags)))],
        "max_s": lags[-1],
    }


def summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str) -> float | None:
        vals = [tr[key] for tr in trials if tr.get(key) is not None]
        return statistics.median(vals) if vals else None

    return {
        "trials": len(trials),
        "median_lost_gen_s": med("lost_gen_s"),
        "median_work_lost_s": med("work_lost_s"),
        "median_requests_lost": med("requests_lost"),
        "median_elapsed_gen_s": med("elapsed_gen_s"),
        "median_resumed_gen_s": med("resumed_gen_s"),
        "median_kept_groups": med("kept_groups"),
        "kept_groups_total": sum(tr["kept_groups"] for tr in trials),
        "regenerated_requests_total": sum(tr["requests_regenerated"] for tr in trials),
        "prompts_lost_total": sum(tr["prompts_lost"] for tr in trials),
        "prompts_duplicated_total": sum(tr["prompts_duplicated"] for tr in trials),
        "kept_data_equal_all": all(tr["kept_data_equal"] for tr in trials),
        "trained_before_kill": sum(tr["trained_before_kill"] for tr in trials),
    }


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in (
        (axes[0], "lost_gen_s", "generation wall time lost per crash (s)"),
        (axes[1], "work_lost_s", "generation work lost per crash (request-s)"),
    ):
        for system, marker in (("verl", "s"), ("conduit", "o")):
            rows = [tr for tr in doc["systems"][system]["trials"] if tr.get(key) is not None]
            xs = [tr["elapsed_gen_s"] for tr in rows]
            ax.scatter(xs, [tr[key] for tr in rows], marker=marker, label=system)
        ax.set_xlabel("generation time of the step before the kill (s)")
        ax.set_ylabel(label)
        ax.axhline(0, color="grey", lw=0.5)
        ax.legend()
    fig.suptitle("verl SIGKILL + resume, paced rollout (modelled generation times)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 trial per system (checks the benchmark works)")
    p.add_argument("--trials", type=int, default=20, help="kills per system (one per step)")
    p.add_argument("--batch-size", type=int, default=8, help="prompt groups per step")
    p.add_argument("--n", type=int, default=2, help="responses per prompt")
    p.add_argument("--pace-scale", type=float, default=6.0, help="paced rollout time scale (longer steps)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--step-timeout", type=float, default=900.0, help="seconds a launch may take to finish a step"
    )
    p.add_argument("--out", type=Path, default=RESULTS / "verl_crash_resume.json")
    args = p.parse_args(argv)
    if args.quick:
        args.trials = 1
    if args.trials < 1:
        p.error("--trials must be >= 1")
    tok = provenance.start()
    rng = random.Random(args.seed)
    fractions = [round(rng.uniform(0.1, 0.9), 3) for _ in range(args.trials)]
    t0 = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = {}
    lag: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="verl_crash_") as tmp:
        for system in ("verl", "conduit"):
            work = Path(tmp) / system / "run"
            work.mkdir(parents=True)
            runs[system] = run_system(system, work, args, fractions)
            measure(system, work, runs[system], args.n)
            if system == "conduit":
                lag = lag_stats(work)
    compare(runs["conduit"], runs["verl"], args.n)
    work_keys = ("step", "kill_fraction")
    late = [tr["trial"] for s in runs.values() for tr in s if tr["trained_before_kill"]]
    same_work = not late and [tuple(tr[k] for k in work_keys) for tr in runs["conduit"]] == [
        tuple(tr[k] for k in work_keys) for tr in runs["verl"]
    ]
    sums = {s: summary(runs[s]) for s in runs}
    lost_c, lost_v = sums["conduit"]["median_lost_gen_s"], sums["verl"]["median_lost_gen_s"]
    ratio = None
    if same_work and lost_c is not None and lost_v is not None and lost_c > 0:
        ratio = lost_v / lost_c
    work_c, work_v = sums["conduit"]["median_work_lost_s"], sums["verl"]["median_work_lost_s"]
    work_ratio = work_v / work_c if same_work and work_c and work_v is not None else None
    doc = {
        "benchmark": "verl_crash_resume",
        "config": {
            "trials": args.trials,
            "batch_size": args.batch_size,
            "n": args.n,
            "pace_scale": args.pace_scale,
            "seed": args.seed,
            "rollout": "paced (generation times modelled, pace.py)",
            "kill": "SIGKILL of the whole job (launcher, Ray, workers) at a random moment of a step",
        },
        "work": {
            "per_trial": [dict(zip(work_keys, (tr[k] for k in work_keys))) for tr in runs["verl"]],
            "same_work": same_work,
            "prompts_per_step": args.batch_size,
            "responses_per_prompt": args.n,
        },
        "systems": {s: {"summary": sums[s], "trials": runs[s]} for s in runs},
        "lost_gen_ratio_verl_over_conduit": ratio,
        "lost_work_ratio_verl_over_conduit": work_ratio,
        "ratio_refused": None
        if same_work
        else f"the two systems' trials differ (steps, kill fractions, or kills after the step trained: {late})",
        "durability_lag": lag,
        "wall_s": round(time.monotonic() - t0, 1),
        "machine": {"cpus": os.cpu_count(), **provenance.finish(tok)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    plot(doc, args.out.with_suffix(".png"))
    print(f"verl crash + resume, {args.trials} trial(s) per system, paced rollout (modelled times)")
    head = (
        "system",
        "gen wall lost s",
        "gen work lost s",
        "req lost",
        "kept grp",
        "regen req",
        "lost",
        "dup",
        "data ok",
    )
    print("{:8} {:>15} {:>15} {:>8} {:>8} {:>9} {:>5} {:>4} {:>7}".format(*head))

    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2f}"

    for s in ("verl", "conduit"):
        m = sums[s]
        print(
            f"{s:8} {fmt(m['median_lost_gen_s']):>15} {fmt(m['median_work_lost_s']):>15} "
            f"{fmt(m['median_requests_lost']):>8} {fmt(m['median_kept_groups']):>8} "
            f"{m['regenerated_requests_total']:>9} {m['prompts_lost_total']:>5} "
            f"{m['prompts_duplicated_total']:>4} {m['kept_data_equal_all']!s:>7}"
        )
    print("medians per crash; lost/dup: prompts lost or duplicated in all trials (must be 0)")
    for name, r in (("generation wall time", ratio), ("generation work (request-s)", work_ratio)):
        print(f"{name} lost, verl / conduit: {'refused or n/a' if r is None else f'{r:.2f}x'}")
    if lag.get("groups"):
        print(
            f"durability lag (finished -> fsynced): median {lag['median_s']:.3f}s, p95 {lag['p95_s']:.3f}s, max {lag['max_s']:.3f}s"
        )
    print(f"wrote {args.out} ({doc['wall_s']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
