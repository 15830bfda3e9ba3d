"""verl crash trials: SIGKILL a ``conduit``-mode trainer mid-step, resume, count what the resume kept.

    .venv/bin/python benchmarks/verl_crash_resume.py [--quick | --trials N] [--out PATH]

Real verl in CPU mode, GRPO, a checkpoint every step, paced rollout (generation times modelled). Two
systems, both verl trainer mode ``conduit``: ``conduit_journal_on`` (the rollout journal restores the
interrupted step's finished groups) and ``conduit_journal_off``, the baseline, which resumes as verl does
(the step generated again). One long run per system; trial ``t`` kills the whole job ``kill_s[t]`` seconds
after step ``t + 1`` began (a schedule drawn once and shared) and relaunches it. Degenerate trials (killed
after the checkpoint, or before any request) are counted and left out. Per trial: groups kept and
regenerated, prompts lost or duplicated, generation work lost and generation time lost::

    lost_gen_s = elapsed_gen_s - (ref_gen_s - resumed_gen_s)  # ref: the baseline's resumed step

Ratios are baseline over journal per pair of clean trials of equal work, their median reported
(``verl_crash_analysis.py``). Method: ``benchmarks/notes/verl_crash_resume.md``. Writes
``benchmarks/results/verl_crash_resume.json`` (with provenance) and ``.png``; prints its table.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
import report_verl  # noqa: E402
import script  # noqa: E402
from conduit_verl_cpu.crash import kill_session  # noqa: E402
from verl_crash_analysis import (  # noqa: E402
    BASELINE,
    JOURNAL,
    KILL_TOLERANCE_S,
    compare,
    journaled,
    lag_stats,
    lines,
    measure,
    paired_ratios,
    resumed_metrics,
    step_metrics,
    summary,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
#: system -> --journal; both are Conduit's trainer (mode ``conduit``), the baseline first
SYSTEMS = {BASELINE: "off", JOURNAL: "on"}
LABELS = {
    BASELINE: "Conduit's trainer, journal off (resumes as verl: the step generated again)",
    JOURNAL: "Conduit's trainer, journal on",
}
#: the kill schedule's default window, seconds after a step began: inside most steps' generation
#: (5-13 s at the default shape); a kill after a short step was checkpointed is a degenerate trial
KILL_WINDOW = (0.5, 6.5)
STEP_TIMEOUT_S = 900.0  # a launch that takes longer to finish a step has failed


def command(work: Path, steps: int, args: argparse.Namespace, journal: str) -> list[str]:
    flags = {"--trainer-mode": "conduit", "--steps": steps, "--rollout": "paced", "--pace-scale": args.pace_scale,
             "--batch-size": args.batch_size, "--n": args.n, "--seed": args.seed, "--save-freq": 1,
             "--journal": journal, "--work-dir": work}  # fmt: skip
    run = [sys.executable, "-m", "conduit_verl_cpu.run"]
    return [*run, *(str(x) for kv in flags.items() for x in kv), "--dump-samples"]


def env() -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "tools/verl_cpu"), out.get("PYTHONPATH")) if p)
    return out


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
                wait_for_step(work, step, proc, STEP_TIMEOUT_S, what)
                events = len(lines(work / "gen_events.jsonl"))
                trials.append(
                    {"trial": t, "step": step, "kill_s": kill_s, "skipped": SKIPPED, "events_at_kill": events}
                )
                continue
            prev, t_start = wait_for_step(work, step - 1, proc, STEP_TIMEOUT_S, what)
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
        proc.wait(timeout=STEP_TIMEOUT_S * 2)
        if proc.returncode != 0:
            raise RuntimeError(f"{what}: the last resumed run failed (rc {proc.returncode})")
        if not trials[-1].get("skipped"):
            trials[-1]["resumed"] = resumed_metrics(step_metrics(work, trials[-1]["step"]) or {})
    finally:
        if proc.poll() is None:
            kill_session(proc)
        log.close()
    return trials


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
        "machine": script.machine(tok),
    }
    script.write_result("verl_crash_resume", args, doc, lambda png: plot(doc, png), report_verl.crash_resume)
    return 0


if __name__ == "__main__":
    sys.exit(main())
