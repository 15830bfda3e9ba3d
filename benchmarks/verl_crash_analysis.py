"""``verl_crash_resume.py``'s analysis: what each trial kept and lost (from the run's logs), which
trials are degenerate, the paired baseline-over-journal ratios and the summary."""

from __future__ import annotations

import collections
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conduit_verl_cpu.crash import responses_checksum  # noqa: E402
from verl_analysis import jsonl  # noqa: E402

#: system -> --journal; both are Conduit's trainer (mode ``conduit``), the baseline first
BASELINE, JOURNAL = "conduit_journal_off", "conduit_journal_on"
#: a pair of trials whose kills landed further apart than this (s after the step began) is unequal work
KILL_TOLERANCE_S = 0.25


def lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (a line torn by a kill is skipped)."""
    return jsonl(path, torn=True)


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
