"""verl crash trials: SIGKILL a ``conduit``-mode trainer mid-step, resume, count what the resume kept.

Real verl in CPU mode (``tools/verl_cpu``), GRPO, a checkpoint after every step, a *paced*
rollout (real tokens released at a modelled inference server's times, ``pace.py``: generation
times are modelled, not measured on a GPU). Two systems, both Conduit's own trainer (verl trainer
mode ``conduit``), the same run config:

- ``conduit_journal_on``: the rollout journal on (``trainer.v1.conduit.journal``): the resume
  restores the interrupted step's journaled groups and generates only the others;
- ``conduit_journal_off`` (the baseline): the journal off, so it resumes as verl does: the
  checkpoint of the previous step, and the interrupted step's generation thrown away (verl keeps
  finished rollouts only in memory). Not verl's own trainer mode.

One long run per system; trial ``t`` kills the whole job (launcher, Ray, workers) ``kill_s[t]``
seconds after step ``t + 1`` began (the previous step's metrics line written: verl logs a step's
metrics after its checkpoint, the last thing the step does) and relaunches the same command, which
resumes; each relaunch is a trial. The kill schedule is drawn once, in seconds, and shared by both
systems (a time relative to a step's own length would kill the system with the shorter steps
earlier). A trial is *degenerate* when its kill came after the step was checkpointed (nothing of it
to lose; the relaunch then starts at the next step, whose start cannot be seen, so the next trial
is skipped and degenerate too) or before any generation request was sent; degenerate trials are
counted and left out of the medians and the ratios. Per trial: the prompt groups kept (restored
from the journal) and regenerated, the requests the rollout server saw again, prompts lost /
duplicated (the resumed step's trained prompts, counted against the baseline's resumed step: must be
zero), whether the kept groups' trained responses are the journaled ones (checksum), the generation
work (request-seconds) done before the kill and lost, and the generation time lost::

    lost_gen_s = elapsed_gen_s - (ref_gen_s - resumed_gen_s)

``elapsed_gen_s``: generation wall time of the step before the kill; ``resumed_gen_s``: the resumed
step's generation time (verl's ``timing_s/gen``); ``ref_gen_s``: the baseline's resumed step's (it
generates the whole step again). For the baseline it is ``elapsed_gen_s``: all of it. Ratios
(baseline over journal) are per trial, over the trials clean in both systems with the same step and
kill time, and their median is reported. The durability lag (group finished → journal fsynced)
comes from the journal's ``lag.jsonl``.

    .venv/bin/python benchmarks/verl_crash_resume.py [--quick | --trials N] [--out PATH]

Writes ``benchmarks/results/verl_crash_resume.json`` (with provenance) and ``.png``; prints a table.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
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
import script  # noqa: E402
from conduit_verl_cpu.crash import kill_session, responses_checksum  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
#: system -> --journal; both are Conduit's trainer (mode ``conduit``), the baseline first
BASELINE, JOURNAL = "conduit_journal_off", "conduit_journal_on"
SYSTEMS = {BASELINE: "off", JOURNAL: "on"}
LABELS = {
    BASELINE: "Conduit's trainer, journal off (resumes as verl: the step generated again)",
    JOURNAL: "Conduit's trainer, journal on",
}
#: the kill schedule's default window, seconds after a step began: inside most steps' generation
#: (5-13 s at the default shape); a kill after a short step was checkpointed is a degenerate trial
KILL_WINDOW = (0.5, 6.5)
#: a pair of trials whose kills landed further apart than this (s after the step began) is unequal work
KILL_TOLERANCE_S = 0.25


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


def kill_schedule(trials: int, seed: int, window: tuple[float, float] = KILL_WINDOW) -> list[float]:
    """When each trial kills, in seconds after its step began: drawn once (uniform in ``window``,
    seeded) and shared by every system, so a system with shorter steps is not killed earlier."""
    rng = random.Random(seed)
    return [round(rng.uniform(*window), 2) for _ in range(trials)]


def checkpointed(work: Path) -> int | None:
    """The last step verl's checkpoint tracker names (None: none yet, or unreadable)."""
    try:
        return int((work / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip())
    except (OSError, ValueError):
        return None


def wait_for_step(
    work: Path, step: int, proc: subprocess.Popen, timeout: float, what: str
) -> tuple[dict[str, Any], float]:
    """The metrics of ``step`` logged by the current launch, and when that line was written (the
    file's mtime: the next step begins right after it)."""
    deadline = time.monotonic() + timeout
    while (found := step_metrics(work, step)) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what}: run ended before step {step} finished")
        time.sleep(0.05)
    return found, min(time.time(), (work / "metrics.jsonl").stat().st_mtime)


SKIPPED = (
    "not killed: the previous kill came after its step was checkpointed, so the relaunch began at this step"
)


def run_system(
    system: str, work: Path, args: argparse.Namespace, schedule: list[float]
) -> list[dict[str, Any]]:
    """One long run of ``system``: trial ``t`` kills step ``t + 1`` ``schedule[t - 1]`` seconds after it
    began; the raw trial records."""
    cmd = command(work, len(schedule) + 1, args, SYSTEMS[system])
    trials: list[dict[str, Any]] = []
    log = open(work.parent / f"{system}.log", "w")  # noqa: SIM115
    launch = lambda: subprocess.Popen(  # noqa: E731
        cmd, cwd=ROOT, env=env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    what = f"{system} (see {log.name})"
    proc = launch()
    try:
        for t, kill_s in enumerate(schedule, start=1):
            step = t + 1
            if trials and trials[-1].get("trained_before_kill"):  # this step's start is not seen: no kill
                wait_for_step(work, step, proc, args.step_timeout, what)
                events = len(lines(work / "gen_events.jsonl"))
                trials.append(
                    {"trial": t, "step": step, "kill_s": kill_s, "skipped": SKIPPED, "events_at_kill": events}
                )
                continue
            prev, t_start = wait_for_step(work, step - 1, proc, args.step_timeout, what)
            if trials and not trials[-1].get("skipped"):  # the previous trial's resumed step
                trials[-1]["resumed"] = resumed_metrics(prev)
            time.sleep(max(0.0, t_start + kill_s - time.time()))
            t_kill = time.time()
            kill_session(proc)
            saved = checkpointed(work)
            trials.append(
                {
                    "trial": t,
                    "step": step,
                    "kill_s": kill_s,
                    "kill_at_s": round(t_kill - t_start, 3),  # as it landed
                    "t_step_start": t_start,
                    "t_kill": t_kill,
                    "events_at_kill": len(lines(work / "gen_events.jsonl")),
                    "trained_before_kill": step_metrics(work, step) is not None
                    or (saved is not None and saved >= step),
                    "journaled": journaled(work, step) if SYSTEMS[system] == "on" else [],
                }
            )
            # verl's file logger truncates the file only once the relaunch is up: move this launch's
            # lines aside, so that no line of it is read as the relaunch's
            metrics = work / "metrics.jsonl"
            if metrics.exists():
                metrics.replace(work / f"metrics.launch{t}.jsonl")
            proc = launch()
        proc.wait(timeout=args.step_timeout * 2)
        if proc.returncode != 0:
            raise RuntimeError(f"{what}: the last resumed run failed (rc {proc.returncode})")
        if not trials[-1].get("skipped"):
            trials[-1]["resumed"] = resumed_metrics(step_metrics(work, trials[-1]["step"]) or {})
    finally:
        if proc.poll() is None:
            kill_session(proc)
        log.close()
    return trials


def degenerate(tr: dict[str, Any]) -> str | None:
    """Why a trial measures nothing of a crash mid-step (None: it does)."""
    if tr.get("skipped"):
        return tr["skipped"]
    if tr["trained_before_kill"]:
        return "killed after its step was checkpointed: nothing of it to lose"
    if tr["requests_before_kill"] == 0:
        return "killed before the step sent any generation request"
    return None


def measure(system: str, work: Path, trials: list[dict[str, Any]], n: int) -> None:
    """Fill each trial's counts from the run's logs (gen events, metrics, sample dump)."""
    events = lines(work / "gen_events.jsonl")
    dumps: dict[int, list[dict[str, Any]]] = {}
    for d in lines(work / "samples.jsonl"):
        dumps[d["step"]] = d["samples"]  # the last dump of a step: the resumed step's
    for i, tr in enumerate(trials):
        if tr.get("skipped"):
            tr["degenerate"] = degenerate(tr)
            continue
        step = tr["step"]
        # the server numbers weight versions per process, so a step's requests are found by time
        # (before the kill: sent after the step began) and by version (after: the relaunch's first)
        seg_start = trials[i - 1]["events_at_kill"] if i else 0
        seg_end = trials[i + 1]["events_at_kill"] if i + 1 < len(trials) else len(events)
        before = [e for e in events[seg_start : tr["events_at_kill"]] if e["t0"] >= tr["t_step_start"]]
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
        tr["degenerate"] = degenerate(tr)


def compare(journal: list[dict[str, Any]], baseline: list[dict[str, Any]], n: int) -> None:
    """Lost / duplicated prompts and the generation time lost, against the baseline's resumed steps."""
    ref = {tr["step"]: tr for tr in baseline if not tr.get("skipped")}
    for tr in [*journal, *baseline]:
        if tr.get("skipped"):
            continue
        base = ref.get(tr["step"])
        if base is None:  # no resumed step of the baseline to hold it against
            tr["prompts_lost"] = tr["prompts_duplicated"] = tr["lost_gen_s"] = None
            continue
        want = collections.Counter(map(tuple, base["trained_prompts"]))
        got = collections.Counter(map(tuple, tr["trained_prompts"]))
        tr["prompts_lost"] = sum(max(0, want[p] - got[p]) for p in want) // n
        tr["prompts_duplicated"] = sum(max(0, got[p] - want[p]) for p in got) // n
        ref_gen = base["resumed_gen_s"]
        if ref_gen is None or tr["resumed_gen_s"] is None:
            tr["lost_gen_s"] = None
        else:
            tr["lost_gen_s"] = tr["elapsed_gen_s"] - (ref_gen - tr["resumed_gen_s"])


def unequal(baseline: dict[str, Any], journal: dict[str, Any] | None) -> str | None:
    """Why a pair of trials is not equal work (None: it is): a degenerate side, another step or
    scheduled kill, or kills that landed more than ``KILL_TOLERANCE_S`` apart."""
    if journal is None:
        return "no trial of the journal run"
    for system, tr in ((BASELINE, baseline), (JOURNAL, journal)):
        if tr.get("degenerate"):
            return f"degenerate ({system}): {tr['degenerate']}"
    if (baseline["step"], baseline["kill_s"]) != (journal["step"], journal["kill_s"]):
        return "another step or scheduled kill"
    apart = abs(baseline["kill_at_s"] - journal["kill_at_s"])
    if apart > KILL_TOLERANCE_S:
        return f"the kills landed {apart:.2f} s apart"
    return None


def paired_ratios(baseline: list[dict[str, Any]], journal: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Per trial, the baseline's ``key`` over the journal run's, on the pairs of equal work
    (:func:`unequal`); their median. A trial where the journal run lost nothing (and the baseline
    something) ranks above every finite ratio (its ``ratio`` is None, ``journal_lost_nothing``)."""
    by_trial = {tr["trial"]: tr for tr in journal}
    per: list[dict[str, Any]] = []
    excluded: list[dict[str, Any]] = []
    values: list[float] = []
    for base in baseline:
        mine = by_trial.get(base["trial"])
        why = unequal(base, mine)
        x, y = base.get(key), (mine or {}).get(key)
        if why is None and (x is None or y is None):
            why = f"{key} not measured"
        if why is None and x <= 0 and y <= 0:
            why = "neither lost anything"
        if why is not None:
            excluded.append({"trial": base["trial"], "why": why})
            continue
        ratio = x / y if y > 0 else math.inf
        values.append(ratio)
        per.append(
            {
                "trial": base["trial"],
                "step": base["step"],
                "kill_s": base["kill_s"],
                BASELINE: x,
                JOURNAL: y,
                "ratio": None if math.isinf(ratio) else ratio,
                "journal_lost_nothing": math.isinf(ratio),
            }
        )
    med = statistics.median(values) if values else None
    return {
        "median": None if med is None or math.isinf(med) else med,
        "pairs": len(per),
        "per_trial": per,
        "excluded": excluded,
    }


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
    """Medians and totals over the clean trials; the degenerate ones counted; the correctness checks
    (prompts lost or duplicated, kept data = journal) over every trial that was killed."""
    clean = [tr for tr in trials if not tr.get("degenerate")]
    killed = [tr for tr in trials if not tr.get("skipped")]

    def med(key: str) -> float | None:
        vals = [tr[key] for tr in clean if tr.get(key) is not None]
        return statistics.median(vals) if vals else None

    return {
        "trials": len(trials),
        "degenerate": len(trials) - len(clean),
        "clean": len(clean),
        "median_kill_at_s": med("kill_at_s"),
        "median_work_before_kill_s": med("work_before_kill_s"),
        "median_lost_gen_s": med("lost_gen_s"),
        "median_work_lost_s": med("work_lost_s"),
        "median_requests_lost": med("requests_lost"),
        "median_elapsed_gen_s": med("elapsed_gen_s"),
        "median_resumed_gen_s": med("resumed_gen_s"),
        "median_kept_groups": med("kept_groups"),
        "kept_groups_total": sum(tr["kept_groups"] for tr in clean),
        "regenerated_requests_total": sum(tr["requests_regenerated"] for tr in clean),
        "prompts_lost_total": sum(tr["prompts_lost"] or 0 for tr in killed),
        "prompts_duplicated_total": sum(tr["prompts_duplicated"] or 0 for tr in killed),
        "kept_data_equal_all": all(tr["kept_data_equal"] for tr in killed),
        "trained_before_kill": sum(tr["trained_before_kill"] for tr in killed),
    }


def plot(doc: dict[str, Any], path: Path) -> None:
    fig, axes = script.pyplot().subplots(1, 2, figsize=(10, 4))
    for ax, key, label in (
        (axes[0], "lost_gen_s", "generation wall time lost per crash (s)"),
        (axes[1], "work_lost_s", "generation work lost per crash (request-s)"),
    ):
        for system, marker in ((BASELINE, "s"), (JOURNAL, "o")):
            rows = [tr for tr in doc["systems"][system]["trials"] if tr.get(key) is not None]
            rows = [tr for tr in rows if not tr.get("degenerate")]
            ax.scatter(
                [tr["kill_at_s"] for tr in rows], [tr[key] for tr in rows], marker=marker, label=system
            )
        ax.set_xlabel("kill, seconds after the step began (shared schedule)")
        ax.set_ylabel(label)
        ax.axhline(0, color="grey", lw=0.5)
        ax.legend(fontsize=7)
    fig.suptitle("SIGKILL + resume, Conduit's trainer in verl, paced rollout (modelled times; clean trials)")
    script.save_figure(fig, path, dpi=120)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    out = RESULTS / "verl_crash_resume.json"
    p = script.parser(__doc__, quick="1 trial per system (a smoke test; --trials N for more)", out=out)
    p.add_argument("--trials", type=int, default=20, help="kills per system (one per step)")
    p.add_argument("--batch-size", type=int, default=8, help="prompt groups per step")
    p.add_argument("--n", type=int, default=2, help="responses per prompt")
    p.add_argument("--pace-scale", type=float, default=6.0, help="paced rollout time scale (longer steps)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--kill-window",
        default=",".join(f"{x:g}" for x in KILL_WINDOW),
        help="LO,HI: kills are drawn uniformly in this many seconds after a step began (shared schedule)",
    )
    p.add_argument(
        "--step-timeout", type=float, default=900.0, help="seconds a launch may take to finish a step"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.trials = 1
    if args.trials < 1:
        p.error("--trials must be >= 1")
    try:
        lo, hi = (float(x) for x in args.kill_window.split(","))
    except ValueError:
        p.error("--kill-window must be LO,HI (seconds)")
    if not 0 <= lo <= hi:
        p.error("--kill-window needs 0 <= LO <= HI")
    args.kill_window = (lo, hi)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    tok = provenance.start()
    schedule = kill_schedule(args.trials, args.seed, args.kill_window)
    t0 = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = {}
    lag: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="verl_crash_") as tmp:
        for system in SYSTEMS:
            work = Path(tmp) / system / "run"
            work.mkdir(parents=True)
            runs[system] = run_system(system, work, args, schedule)
            measure(system, work, runs[system], args.n)
            if system == JOURNAL:
                lag = lag_stats(work)
    compare(runs[JOURNAL], runs[BASELINE], args.n)
    same_schedule = all([tr["kill_s"] for tr in runs[s]] == schedule for s in runs)
    ratios = {key: paired_ratios(runs[BASELINE], runs[JOURNAL], key) for key in ("work_lost_s", "lost_gen_s")}
    sums = {s: summary(runs[s]) for s in runs}
    refused = None
    if not same_schedule:
        refused = "the systems' kill schedules differ"
    elif not ratios["work_lost_s"]["pairs"]:
        refused = "no pair of clean trials of equal work (step, kill time)"
    work_ratio = None if refused else ratios["work_lost_s"]["median"]
    gen_ratio = None if refused else ratios["lost_gen_s"]["median"]
    doc = {
        "config": {
            "trials": args.trials,
            "batch_size": args.batch_size,
            "n": args.n,
            "pace_scale": args.pace_scale,
            "seed": args.seed,
            "rollout": "paced (generation times modelled, pace.py)",
            "kill": "SIGKILL of the whole job (launcher, Ray, workers) kill_s seconds after the step began",
            "trainer": "both systems: verl trainer mode conduit; the baseline with the journal off",
        },
        "kill_schedule": {
            "seconds_after_step_start": schedule,
            "window_s": list(args.kill_window),
            "seed": args.seed,
            "step_start": "when the previous step's metrics line was written (metrics.jsonl mtime): verl logs a "
            "step's metrics after its checkpoint, the last thing the step does",
            "shared": same_schedule,
        },
        "work": {
            "per_trial": [{"trial": t, "step": t + 1, "kill_s": k} for t, k in enumerate(schedule, start=1)],
            "kill_tolerance_s": KILL_TOLERANCE_S,
            "prompts_per_step": args.batch_size,
            "responses_per_prompt": args.n,
        },
        "degenerate": {s: sums[s]["degenerate"] for s in runs},
        "systems": {s: {"label": LABELS[s], "summary": sums[s], "trials": runs[s]} for s in runs},
        "lost_work_ratio_journal_off_over_on": work_ratio,
        "lost_gen_ratio_journal_off_over_on": gen_ratio,
        "ratios": {
            "method": "per trial (baseline over journal), on the trials clean in both systems with the same step and "
            "a kill within kill_tolerance_s; the median of the per-trial ratios",
            **ratios,
        },
        "ratio_refused": refused,
        "durability_lag": lag,
        "wall_s": round(time.monotonic() - t0, 1),
        "machine": {"cpus": os.cpu_count(), **provenance.finish(tok)},
    }
    script.write_result("verl_crash_resume", args, doc, lambda png: plot(doc, png))
    report(doc)
    print(f"wrote {args.out} ({doc['wall_s']:.0f}s)")
    return 0


def report(doc: dict[str, Any]) -> None:
    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2f}"

    print(
        f"crash + resume, {doc['config']['trials']} trial(s) per system, kills at "
        f"{doc['kill_schedule']['seconds_after_step_start']} s after the step began (both systems), paced rollout"
    )
    head = (
        "system",
        "clean/deg",
        "work before",
        "gen wall lost",
        "work lost",
        "req lost",
        "kept",
        "regen",
        "lost",
        "dup",
        "data ok",
    )
    print("{:20} {:>9} {:>11} {:>13} {:>9} {:>8} {:>5} {:>5} {:>4} {:>4} {:>7}".format(*head))
    for s, d in doc["systems"].items():
        m = d["summary"]
        print(
            f"{s:20} {m['clean']:>4}/{m['degenerate']:<4} {fmt(m['median_work_before_kill_s']):>11} "
            f"{fmt(m['median_lost_gen_s']):>13} {fmt(m['median_work_lost_s']):>9} {fmt(m['median_requests_lost']):>8} "
            f"{m['kept_groups_total']:>5} {m['regenerated_requests_total']:>5} {m['prompts_lost_total']:>4} "
            f"{m['prompts_duplicated_total']:>4} {m['kept_data_equal_all']!s:>7}"
        )
    print(
        f"{BASELINE} = {LABELS[BASELINE]}. Medians per crash over the clean trials (work in request-s); "
        "kept/regen totals over them; lost/dup: prompts lost or duplicated in every killed trial (must be 0)"
    )
    for name, key in (("generation work", "work_lost_s"), ("generation wall time", "lost_gen_s")):
        r = doc["ratios"][key]
        value = doc[
            "lost_work_ratio_journal_off_over_on"
            if key == "work_lost_s"
            else "lost_gen_ratio_journal_off_over_on"
        ]
        shown = (
            f"refused: {doc['ratio_refused']}"
            if doc["ratio_refused"]
            else (f"{value:.2f}x" if value else "n/a")
        )
        print(f"{name} lost, journal off / on, median of {r['pairs']} per-trial ratios: {shown}")
    lag = doc["durability_lag"]
    if lag.get("groups"):
        print(
            f"durability lag (finished -> fsynced): median {lag['median_s']:.3f}s, p95 {lag['p95_s']:.3f}s, max {lag['max_s']:.3f}s"
        )


if __name__ == "__main__":
    sys.exit(main())
