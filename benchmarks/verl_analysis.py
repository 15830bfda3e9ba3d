"""Per-iteration rows of the verl CPU benchmark: wall, exposed experience-path time, stages.

Exposed time (DESIGN.md §4), same definition for every system, from verl's ``timing_s/*`` and the
CPU rollout server's generation log (``gen_events.jsonl``: wall-clock start/end of every request,
by weight version; step ``s`` generates with version ``s``; with the paced rollout the end is the
response's release at its modelled time):

* every system: ``max(0, gen - gen_busy)``: the part of verl's ``gen`` stage (step start → the
  trainer holds the last group) not spent generating (``gen_busy`` = first request start → last
  request end): rollout start-up, the replay buffer's poll, and in conduit mode ingestion of an
  earlier piece still running when the last group finished;
* plus, verl trainers: old_log_prob + ref + values + adv (whole batch, after sampling);
  conduit: Conduit ``Metrics`` exposed time (ingestion of the last piece and delivery; with PPO
  also the whole-batch whitening of the GAE advantages; ingestion of the earlier pieces overlaps
  generation and is not exposed).

PPO adds ``values`` (critic forward: an ingestion stage, per piece in conduit mode) and
``update_critic`` (whole batch, like ``update_actor`` not part of the exposed time, in every system).

The two-resource bound (DESIGN.md §9, :func:`two_resource_bound`): a step is no shorter than the larger
of generation's busy time on the rollout's hardware and the trainer core's busy time (its stages summed;
verl's timer adds every call, so a conduit step's timers hold every streamed piece's stages too).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

INGEST = ("old_log_prob", "ref", "values", "adv")
STAGES = ("gen", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "update_weights")
#: the trainer core's stages: a colocated reward (verl's ``timing_s/reward``, only where it ran), ingestion,
#: the updates and the weight push
TRAINER = (
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "update_weights",
)
#: two systems whose median response tokens per iteration lie further apart than this (relative) trained
#: different work: their per-iteration times are not compared (``tokens_differ``)
WORK_TOLERANCE = 0.02


def jsonl(path: Path, torn: bool = False) -> list[dict[str, Any]]:
    """The JSON lines of one of a run's logs (``[]`` where it has none; blank lines skipped). ``torn``:
    a line a kill cut short is skipped too (a crashed run's logs); otherwise it raises."""
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if not torn:
                raise
    return out


def gen_events(path: Path) -> list[dict[str, Any]]:
    """The rollout server's request log (``gen_events.jsonl``: one response a line, its weight
    ``version``, ``t0`` / ``t1`` wall clock, ``length``); empty when the run has none."""
    return jsonl(path)


def gen_stats(path: Path) -> dict[int, dict[str, float]]:
    """Weight version -> the rollout server's log for that step: ``start`` / ``end`` (first request
    start, last request end, wall clock), ``responses``, ``response_tokens`` (the work counters),
    and for a paced rollout ``model_gen_s`` (unscaled modelled time of the step's generation) and
    ``late_s`` (most a response came after its modelled time)."""
    out: dict[int, dict[str, float]] = {}
    for e in gen_events(path):
        v, t0, t1 = int(e["version"]), float(e["t0"]), float(e["t1"])
        s = out.setdefault(v, {"start": t0, "end": t1, "responses": 0, "response_tokens": 0})
        s["start"], s["end"] = min(s["start"], t0), max(s["end"], t1)
        s["responses"] += 1
        s["response_tokens"] += int(e.get("length", 0))
        if "model_s" in e:
            s["model_gen_s"] = max(s.get("model_gen_s", 0.0), float(e["model_s"]))
            s["late_s"] = max(s.get("late_s", 0.0), float(e["late_s"]))
    return out


def rows_for_run(
    work: Path, algo: str, system: str, skip: int, extra: dict[str, Any]
) -> list[dict[str, Any]]:
    """One row per measured iteration (the first ``skip`` iterations are warm-up)."""
    gen = gen_stats(work / "gen_events.jsonl")
    rows = []
    for line in (work / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        step, m = int(rec["step"]), rec["data"]
        if step <= skip:
            continue
        t = {k.removeprefix("timing_s/"): float(v) for k, v in m.items() if k.startswith("timing_s/")}
        g = gen.get(step, {})
        gen_busy = g.get("end", 0.0) - g.get("start", 0.0)
        stages = {k: round(t.get(k, 0.0), 4) for k in STAGES}
        if "reward" in t:  # verl times a colocated reward only where it runs one
            stages["reward"] = round(t["reward"], 4)
        wait = max(0.0, t.get("gen", 0.0) - gen_busy)
        if system.startswith("conduit"):
            ingest = float(m.get("conduit/exposed_s", 0.0))
            stages["overlapped_ingest"] = round(sum(t.get(k, 0.0) for k in INGEST) - ingest, 4)
        else:
            ingest = sum(t.get(k, 0.0) for k in INGEST)
        stages.update(
            gen_busy=round(gen_busy, 4), gen_wait_exposed=round(wait, 4), ingest_exposed=round(ingest, 4)
        )
        row_extra = {"conduit": conduit_view(m)} if system.startswith("conduit") else {}
        row: dict[str, Any] = {
            "algo": algo,
            "system": system,
            "iteration": step,
            "wall_s": round(t.get("step", 0.0), 4),
            "exposed_s": round(wait + ingest, 4),
            "actor_loss": m.get("actor/pg_loss"),
            "critic_loss": m.get("critic/vf_loss"),
            "g_ing": m.get("conduit/piece_groups", m.get("conduit/g_ing")),  # result key kept
            "score": m.get("critic/score/mean"),
            "work": {k: int(g.get(k, 0)) for k in ("responses", "response_tokens")},
            "ingest_s": round(sum(t.get(k, 0.0) for k in INGEST), 4),
            # busy time of the ingestion stages, summed over the step (a piece's stages included
            # where Conduit streams them): work moved off the path is still work
            "ingest_busy_s": round(sum(t.get(k, 0.0) for k in INGEST), 4),
            "model_gen_s": g.get("model_gen_s"),
            "late_s": g.get("late_s"),
            "stages": stages,
            **row_extra,
            **extra,
        }
        row.update(two_resource_bound(row), s_per_token=s_per_token(row))
        rows.append(row)
    return rows


def two_resource_bound(row: dict[str, Any]) -> dict[str, Any]:
    """The least ``row``'s step could take with generation and the trainer each on hardware of its
    own (DESIGN.md §9): ``bound_s`` = max(``gen_busy_s``, generation's busy time, first request start ->
    last request end on the rollout's hardware: ``stages["gen_busy"]``; ``trainer_busy_s``, the
    ``TRAINER`` stages summed), which of the two it is (``bound_by``: "trainer" on a tie) and
    ``wall_over_bound``. It bounds the steady state: an async step's generation may have begun in
    the step before, so one step can fall under it. Where the rollout shares the trainer's cores it
    is looser still (the two cannot both run at full speed).
    Every field None for a row without stage timers or without a generation log (an old row). E.g.
    wall 5 s, gen_busy 2 s, old_log_prob 1 s + update_actor 3 s: bound 4 s by the trainer, 1.25x.
    """
    stages = row.get("stages") or {}
    gen = stages.get("gen_busy")
    if not gen or gen <= 0:  # no stages, or no request logged for this weight version
        return dict.fromkeys(("trainer_busy_s", "gen_busy_s", "bound_s", "bound_by", "wall_over_bound"))
    trainer = round(sum(float(stages.get(k) or 0.0) for k in TRAINER), 4)
    bound = max(float(gen), trainer)
    wall = row.get("wall_s")
    return {
        "trainer_busy_s": trainer,
        "gen_busy_s": round(float(gen), 4),
        "bound_s": round(bound, 4),
        "bound_by": "trainer" if trainer >= gen else "generation",
        "wall_over_bound": round(float(wall) / bound, 3) if wall is not None else None,
    }


def s_per_token(row: dict[str, Any]) -> float | None:
    """Seconds of the step's wall per response token it trained (``wall_s`` / ``work.response_tokens``):
    comparable between systems that trained different amounts of work; None without a token count."""
    tokens, wall = (row.get("work") or {}).get("response_tokens"), row.get("wall_s")
    return round(float(wall) / tokens, 7) if tokens and wall is not None else None


def conduit_view(m: dict[str, Any]) -> dict[str, float]:
    """Where a conduit iteration's exposed time went (its ``conduit/*`` metrics): pieces, the last
    piece's ingestion, delivery, whitening, and the piece policy's state."""
    keys = {
        "pieces": "conduit/pieces",
        "streamed": "conduit/streamed",
        "ingest_tail_s": "conduit/op/ingest_tail_s",
        "overlapped_ingest_s": "conduit/op/ingest_s",
        "deliver_s": "conduit/op/deliver_s",
        "whiten_s": "conduit/op/whiten_s",
        "policy_probing": "conduit/policy/probing",
        "contention": "conduit/policy/contention",
        "predicted_gain_s": "conduit/policy/predicted_gain_s",
    }
    return {name: round(float(m[key]), 4) for name, key in keys.items() if key in m}


def exposed_profile(rows: list[dict[str, Any]], system: str) -> dict[str, Any]:
    """Medians of where ``system``'s exposed time went: rollout start-up / wait, the last piece,
    delivery; and how many iterations ran one whole-batch piece (the policy's probes) with their
    median exposed time against the streamed iterations'."""
    mine = [r for r in rows if r["system"] == system and "conduit" in r]
    if not mine:
        return {}

    def med(values: list[float]) -> float | None:
        return round(statistics.median(values), 4) if values else None

    streamed = [r for r in mine if r["conduit"].get("streamed")]
    whole = [r for r in mine if not r["conduit"].get("streamed")]
    return {
        "iterations": len(mine),
        "gen_wait_exposed_s": med([r["stages"]["gen_wait_exposed"] for r in mine]),
        "last_piece_s": med([r["conduit"].get("ingest_tail_s", 0.0) for r in mine]),
        "deliver_s": med([r["conduit"].get("deliver_s", 0.0) for r in mine]),
        "whole_batch_iterations": len(whole),
        "exposed_s_whole_batch": med([r["exposed_s"] for r in whole]),
        "exposed_s_streamed": med([r["exposed_s"] for r in streamed]),
        "pieces_streamed": med([r["conduit"].get("pieces", 0.0) for r in streamed]),
        "contention_last": mine[-1]["conduit"].get("contention"),
    }


#: conduit (``piece_groups=auto``) measures its options over the first iterations after the warm-up one; the
#: "steady" ratios take iterations from this one on, for every system alike
STEADY_FROM = 8


def measured(rows: list[dict[str, Any]], system: str, first: int = 0) -> list[dict[str, Any]]:
    """``system``'s rows from iteration ``first`` on: the one rule that picks the iterations every
    median and ratio uses, whatever the system (the warm-up iteration is dropped by ``rows_for_run``)."""
    return [r for r in rows if r["system"] == system and r["iteration"] >= first]


def median(rows: list[dict[str, Any]], system: str, key: str, first: int = 0) -> float | None:
    vals = [float(r[key]) for r in measured(rows, system, first) if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def median_ratios(rows: list[dict[str, Any]], a: str, b: str) -> dict[str, float]:
    """``wall/<a>_over_<b>`` and ``exposed/<a>_over_<b>``: the ratios of the two systems' medians."""
    out: dict[str, float] = {}
    for key in ("wall_s", "exposed_s"):
        x, y = median(rows, a, key), median(rows, b, key)
        if x is not None and y:
            out[f"{key.removesuffix('_s')}/{a}_over_{b}"] = round(x / y, 3)
    return out


def bound_medians(rows: list[dict[str, Any]], systems: list[str]) -> dict[str, Any]:
    """Per system, over its measured rows that have a bound (``two_resource_bound`` of each row's stages,
    so rows from before the fields count too): ``median_bound_s/``, ``median_trainer_busy_s/``,
    ``median_gen_busy_s/``, ``median_wall_over_bound/<system>`` and ``bound_by/<system>`` (how many
    of its iterations each resource bounded); nothing for a system with no such row."""
    out: dict[str, Any] = {}
    for system in systems:
        bounds = [b for r in measured(rows, system) if (b := two_resource_bound(r))["bound_s"]]
        if not bounds:
            continue
        for key in ("bound_s", "trainer_busy_s", "gen_busy_s"):
            out[f"median_{key}/{system}"] = round(statistics.median(b[key] for b in bounds), 4)
        walls = [b["wall_over_bound"] for b in bounds if b.get("wall_over_bound") is not None]
        out[f"median_wall_over_bound/{system}"] = round(statistics.median(walls), 3) if walls else None
        out[f"bound_by/{system}"] = {
            k: sum(b["bound_by"] == k for b in bounds) for k in ("trainer", "generation")
        }
    return out


def _closed(rows: list[dict[str, Any]], system: str, open_last: bool) -> list[dict[str, Any]]:
    """``system``'s measured rows; ``open_last``: without its last iteration, whose count stops wherever
    the run ended for a trainer that generates ahead (``work_differs``)."""
    mine = measured(rows, system)
    last = max((r["iteration"] for r in mine), default=None)
    return [r for r in mine if not (open_last and r["iteration"] == last)]


def _tokens(rows: list[dict[str, Any]], system: str, open_last: bool = False) -> float | None:
    """``system``'s median response tokens per measured iteration (None: no token count)."""
    mine = _closed(rows, system, open_last)
    vals = [t for r in mine if (t := (r.get("work") or {}).get("response_tokens"))]
    return statistics.median(vals) if vals else None


def tokens_differ(
    rows: list[dict[str, Any]], a: str, b: str, rel: float = WORK_TOLERANCE, open_last: bool = False
) -> str | None:
    """Why ``a``'s and ``b``'s per-iteration times cannot be compared: their median response tokens
    per iteration lie more than ``rel`` apart (async trainers' response lengths drift with the policy
    and the timing, so at one seed they train different work; ``--fixed-length`` holds it fixed); or
    None (equal within ``rel``, or a count missing). ``open_last`` as in ``work_differs``. Beside the
    refusal: ``per_token``."""
    ta, tb = _tokens(rows, a, open_last), _tokens(rows, b, open_last)
    if ta is None or tb is None or abs(ta - tb) <= rel * max(ta, tb):
        return None
    return (
        f"trained work differs: median response tokens per iteration {a} {ta:g}, {b} {tb:g} "
        f"({abs(ta - tb) / max(ta, tb):.1%} apart, over {rel:.0%}); compare seconds per response token"
    )


def per_token(
    rows: list[dict[str, Any]], a: str, b: str, prefix: str = "", open_last: bool = False
) -> dict[str, Any]:
    """``<prefix>s_per_token/<a>_over_<b>``: the ratio of the two systems' median seconds per trained
    response token (``s_per_token``), the comparison that holds where their work differs; empty where
    either has no token count. ``open_last`` as in ``work_differs``."""
    x, y = median_per_token(rows, a, open_last), median_per_token(rows, b, open_last)
    return {f"{prefix}s_per_token/{a}_over_{b}": round(x / y, 3)} if x is not None and y else {}


def median_per_token(rows: list[dict[str, Any]], system: str, open_last: bool = False) -> float | None:
    """``system``'s median ``s_per_token`` over its measured rows (from each row's wall and work, so
    rows from before the field count too; ``open_last``: not its last iteration)."""
    vals = [v for r in _closed(rows, system, open_last) if (v := s_per_token(r)) is not None]
    return statistics.median(vals) if vals else None


def work_differs(rows: list[dict[str, Any]], a: str, b: str, open_last: bool = False) -> str | None:
    """Why systems ``a`` and ``b`` did different work (responses and response tokens per
    iteration, by iteration number, over the iterations both have), or None if the same.
    ``open_last``: the last iteration is not compared — a trainer that generates ahead generates
    the last weight version's responses during the step after it, which the run never reaches, so
    that version's count stops wherever the run ended."""
    wa = {r["iteration"]: r.get("work") for r in rows if r["system"] == a}
    wb = {r["iteration"]: r.get("work") for r in rows if r["system"] == b}
    both = sorted(set(wa) & set(wb))
    for it in both[:-1] if open_last else both:
        if wa[it] != wb[it]:
            return f"iteration {it}: {a} did {wa[it]}, {b} did {wb[it]}"
    return None


def _same(x: float, y: float, rel: float) -> bool:
    return abs(x - y) <= rel * max(abs(x), abs(y)) + 1e-6


def _by_iteration(rows: list[dict[str, Any]], system: str, key: str) -> dict[int, list[float]]:
    """``system``'s values of ``key`` by iteration, one per round that has it."""
    by: dict[int, list[float]] = {}
    for r in rows:
        if r["system"] == system and r.get(key) is not None:
            by.setdefault(r["iteration"], []).append(r[key])
    return by


def losses_equal(
    rows: list[dict[str, Any]], a: str, b: str, rel: float = 1e-4, key: str = "actor_loss"
) -> bool | None:
    """Whether every loss ``key`` of ``a`` (each round, each iteration) equals a loss ``b`` produced
    at that iteration in one of its rounds (None: no common iteration). PPO's actor loss is ~1e-8
    (whitened advantages at ratio 1) and equal to anything within the absolute tolerance: PPO is
    judged by the critic's loss too (``key="critic_loss"``).

    Several values of ``b`` count because verl's own runs differ between rounds at a few iterations
    (the order in which finished samples reach a batch follows arrival; the next iteration agrees
    again): ``b`` is held to no more than what it repeats itself (:func:`baseline_repeats`).
    """
    lb = _by_iteration(rows, b, key)
    pairs = [
        (r[key], lb[r["iteration"]])
        for r in rows
        if r["system"] == a and r["iteration"] in lb and r.get(key) is not None
    ]
    if not pairs:
        return None
    return all(any(_same(x, y, rel) for y in ys) for x, ys in pairs)


def baseline_repeats(rows: list[dict[str, Any]], system: str, rel: float = 1e-4) -> dict[str, int]:
    """How many iterations ``system``'s rounds agree on, and at how many they differ (its loss)."""
    by = _by_iteration(rows, system, "actor_loss")
    repeated = [it for it, ys in by.items() if len(ys) > 1]
    differ = [it for it in repeated if not all(_same(by[it][0], y, rel) for y in by[it][1:])]
    return {"iterations_repeated": len(repeated), "iterations_differing": len(differ)}


def ratios(
    rows: list[dict[str, Any]],
    baselines: list[str],
    steady_from: int = 0,
    off_policy: list[str] | tuple[str, ...] = (),
) -> dict[str, Any]:
    """Each conduit system ÷ each baseline, medians, for wall and exposed time, every system's median
    over the same iterations (``measured``: all measured ones).

    A ratio is refused (``refused/<system>_over_<base>``: the reason) when the two did different
    work (``work_differs``). ``steady_from``: also ``<key>/conduit_steady_over_<base>``, both
    systems' iterations from that one on (after ``piece_groups=auto`` has measured its options). A system
    on the other storage backend of a trainer that also ran (``verl_sync_tuned+tq_conduit`` beside
    ``verl_sync_tuned``) gets ``backend/<key>/<system>_over_<trainer>``: the backend alone.
    A baseline in ``off_policy`` (verl's async trainers: they train on responses of the previous
    weights) gets no ratio against Conduit's on-policy mode: ``refused/...`` says why; its medians
    are still reported.
    """
    out: dict[str, Any] = {}
    systems = sorted({r["system"] for r in rows})
    mine = [s for s in systems if s.startswith("conduit")]
    for base in baselines:
        allowed = []
        for system in mine:
            if base in off_policy:
                out[f"refused/{system}_over_{base}"] = (
                    f"semantics differ: {base} trains on responses of the previous weights (off-policy), "
                    f"{system} on the current ones"
                )
            elif why := work_differs(rows, system, base):
                out[f"refused/{system}_over_{base}"] = why
                out.update(per_token(rows, system, base))
            else:
                allowed.append(system)
        for key in ("wall_s", "exposed_s"):
            b = median(rows, base, key)
            for system in allowed:
                c = median(rows, system, key)
                if c is not None and b:
                    out[f"{key.removesuffix('_s')}/{system}_over_{base}"] = round(c / b, 3)
            if steady_from and "conduit" in allowed:
                c, bs = median(rows, "conduit", key, steady_from), median(rows, base, key, steady_from)
                if c is not None and bs:
                    out[f"{key.removesuffix('_s')}/conduit_steady_over_{base}"] = round(c / bs, 3)
        for system in mine:
            out[f"losses_equal/{system}_vs_{base}"] = losses_equal(rows, system, base)
            critic = losses_equal(rows, system, base, key="critic_loss")
            if critic is not None:
                out[f"critic_losses_equal/{system}_vs_{base}"] = critic
        out[f"repeats/{base}"] = baseline_repeats(rows, base)
    for system in systems:
        trainer, sep, _ = system.partition("+tq_")
        if sep and trainer in systems and not trainer.startswith("conduit"):
            if why := work_differs(rows, system, trainer, open_last="async" in trainer):
                out[f"refused/backend/{system}_over_{trainer}"] = why
                out.update(per_token(rows, system, trainer, "backend/", open_last="async" in trainer))
            else:
                for key in ("wall_s", "exposed_s"):
                    c, b = median(rows, system, key), median(rows, trainer, key)
                    if c is not None and b:
                        out[f"backend/{key.removesuffix('_s')}/{system}_over_{trainer}"] = round(c / b, 3)
    for system in systems:
        out[f"median_wall_s/{system}"] = median(rows, system, "wall_s")
        out[f"median_exposed_s/{system}"] = median(rows, system, "exposed_s")
        out[f"median_ingest_busy_s/{system}"] = median(rows, system, "ingest_busy_s")
        ua = [
            r["stages"]["update_actor"]
            for r in measured(rows, system)
            if "update_actor" in r.get("stages", {})
        ]
        if ua:  # identical work in every system: a difference here is the machine, not the data path
            out[f"median_update_actor_s/{system}"] = round(statistics.median(ua), 4)
        if (spt := median_per_token(rows, system)) is not None:
            out[f"median_s_per_token/{system}"] = round(spt, 7)
    out.update(bound_medians(rows, systems))
    return out


def choose_poll(walls: dict[float, list[float]]) -> tuple[float, dict[str, Any]]:
    """The tuned baseline's poll period: the one with the lowest median wall in the sweep (the most
    favourable for verl, whatever the noise). Also says whether the sweep could order the periods:
    ``resolved`` when the best median is below every other one by more than ``noise_s``, the median
    absolute deviation of the steps around their own period's median (pooled over periods)."""
    med = {p: statistics.median(v) for p, v in walls.items() if v}
    chosen = min(med, key=lambda p: (med[p], p))
    noise = statistics.median(abs(w - med[p]) for p, v in walls.items() if v for w in v)
    gap = min((m - med[chosen] for p, m in med.items() if p != chosen), default=None)
    return chosen, {
        "rule": "the period with the lowest median wall in the sweep",
        "chosen": chosen,
        "median_wall_s_by_poll_s": {str(p): round(w, 4) for p, w in med.items()},
        "noise_s": round(noise, 4),
        "gap_to_next_best_s": None if gap is None else round(gap, 4),
        "resolved": gap is not None and gap > noise,
    }


def calibration(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The paced rollout's time scale per unit of ``R`` from a calibration run (paced with scale 0,
    so nothing waits): medians of the measured ingestion stages and of the unscaled modelled
    generation per iteration. ``time_scale = R * time_scale_per_R`` makes a step's modelled
    generation ``R`` times its ingestion."""
    ingest = statistics.median(row["ingest_s"] for row in rows)
    model = statistics.median(row["model_gen_s"] for row in rows)
    return {"ingest_s": round(ingest, 4), "model_gen_s": round(model, 4), "time_scale_per_R": ingest / model}


def targets(ratio: dict[str, Any], sweep_ratios: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets against ``verl_sync_tuned`` (paced): met or not, from the measured ratios,
    both systems over all their measured iterations (``measured``; the steady ratios are reported
    beside, not used). ``vs_control``: the same ratios against verl's sync trainer on Conduit's
    storage backend (``verl_sync_tuned+tq_conduit``), the trainer mode alone, where it ran."""
    base = "conduit_over_verl_sync_tuned"
    wall, exposed = ratio.get(f"wall/{base}"), ratio.get(f"exposed/{base}")
    control = "conduit_over_verl_sync_tuned+tq_conduit"
    out: dict[str, Any] = {
        "ratios_used": base,
        "iterations": "every measured iteration (after the warm-up one) of both systems",
        "exposed<=0.3x": exposed is not None and exposed <= 0.3,
        "wall<=0.85x": wall is not None and wall <= 0.85,
        "losses_equal": ratio.get("losses_equal/conduit_vs_verl_sync_tuned") is True
        and ratio.get("critic_losses_equal/conduit_vs_verl_sync_tuned") is not False,
    }
    if f"wall/{control}" in ratio:
        out["vs_control"] = {"wall": ratio[f"wall/{control}"], "exposed": ratio.get(f"exposed/{control}")}
    if sweep_ratios:
        walls = {k: r.get("wall/conduit_over_verl_sync_tuned") for k, r in sweep_ratios.items()}
        out["never_slower_in_sweep"] = all(w is not None and w <= 1.0 for w in walls.values())
    return out


def sweep_table(sweep_ratios: dict[str, dict[str, Any]]) -> str:
    """The paced sweep: conduit / verl_sync_tuned per (tail, R)."""
    lines = [f"{'point (paced)':<16} {'wall':>6} {'exposed':>8} {'losses_equal':>13}"]
    for point, r in sweep_ratios.items():
        wall = r.get("wall/conduit_over_verl_sync_tuned")
        exposed = r.get("exposed/conduit_over_verl_sync_tuned")
        eq = r.get("losses_equal/conduit_vs_verl_sync_tuned")
        cells = [f"{v:.3f}" if v is not None else "-" for v in (wall, exposed)]
        lines.append(f"{point:<16} {cells[0]:>6} {cells[1]:>8} {eq!s:>13}")
    return "\n".join(lines)
