"""vLLM renderers for ``report.py``: ``verl_iteration.py --rollout vllm`` (the iteration table, what
generation cost, the share of identical responses) and its reward curves (``--reward-only``)."""

from __future__ import annotations

from typing import Any

from report_fmt import DASH, get, num, pct, table, verdict
from report_verl import Doc, error_lines, in_order, iteration


def _vllm_engine(rows: list[dict[str, Any]], key: str) -> Any:
    """The median of vLLM's own per-iteration counter ``key`` over rows that have it (or None)."""
    vals = sorted(float(v) for x in rows if (v := get(x, "vllm", key)) is not None)
    return vals[len(vals) // 2] if vals else None


def vllm(docs: list[tuple[str, Doc]]) -> list[str]:
    """``--rollout vllm``: the iteration table, then per run what generation cost (vLLM's own
    counters, R), how the cores were split and the share of identical responses."""
    out = iteration(docs)
    head = [
        "algo",
        "system",
        "cores vLLM : trainer",
        "gen busy s",
        "response tokens / s",
        "ingest s",
        "R = gen / ingest",
        "vLLM engine steps",
        "TTFT s",
        "inter-token s",
    ]
    rows = []
    for label, d in docs:
        gen = d.get("generation") or {}
        for s in in_order(set(gen)):
            g = gen[s]
            mine = [x for x in d.get("rows") or [] if x.get("system") == s]
            cores = next((x.get("cores") for x in mine if x.get("cores")), None)
            split = f"{cores.get('vllm')} : {cores.get('trainer')}" if isinstance(cores, dict) else DASH
            rows.append(
                [
                    label,
                    s,
                    split,
                    num(g.get("gen_busy_s"), 3),
                    num(g.get("response_tokens_per_s"), 0),
                    num(g.get("ingest_s"), 3),
                    num(g.get("R"), 2),
                    num(_vllm_engine(mine, "engine_steps"), 0),
                    num(_vllm_engine(mine, "ttft_s"), 4),
                    num(_vllm_engine(mine, "inter_token_s"), 4),
                ]
            )
    out += ["", *table(head, rows), ""]
    for label, d in docs:
        f = d.get("ingestion_floor") or {}
        if "exposed_ratio_floor" in f:
            out.append(floor_line(label, f))
        for pair, e in (d.get("equivalence") or {}).items():
            out.append(
                f"- {label}: identical responses, {pair.replace('_vs_', ' vs ')}: "
                f"{num(e.get('identical'), 0)} of {num(e.get('responses'), 0)} "
                f"({pct(e.get('share_identical'))}; target ≥ 95%: {verdict(e.get('target>=0.95'))})."
            )
    return out


def floor_line(label: str, f: dict[str, Any]) -> str:
    """The ingestion floor (``verl_vllm_analysis.ingestion_floor``) as the JSON says it is: a floor only
    where ``is_bound`` is true (no measured iteration of conduit fell below it), else an estimate, with
    the iterations that undercut it."""
    per_token = f.get("per_token_s")
    bound = f.get("is_bound") is True
    what = (
        f"(every response ingested as it finishes, one after another, at verl_sync_tuned's whole-batch rate, "
        f"{num(per_token * 1e3 if per_token is not None else None, 3)} ms per response token): "
        f"{num(f.get('floor_s'), 3)} s after the last response (median; per iteration "
        f"{', '.join(num(v, 2) for v in (f.get('per_iteration') or {}).values())}), plus verl_sync_tuned's own "
        f"wait for generation's outputs {num(f.get('baseline_gen_wait_s'), 3)} s"
    )
    if bound:
        return (
            f"- {label}: ingestion floor {what}: no on-policy schedule's exposed time gets under "
            f"{num(f.get('exposed_floor_s'), 3)} s here, {num(f.get('exposed_ratio_floor'), 3)}x "
            f"verl_sync_tuned's, and no wall ratio under {num(f.get('wall_ratio_floor'), 3)}x (its wall with "
            "its exposed time cut to that floor); no measured conduit iteration fell below it."
        )
    under = [
        f"iteration {u.get('iteration')} (exposed {num(u.get('exposed_s'), 3)} s against "
        f"{num(u.get('exposed_floor_s'), 3)} s)"
        for u in f.get("undercut_by") or []
    ]
    why = (
        "conduit's exposed time fell below that iteration's estimate at " + ", ".join(under)
        if under
        else "it was not checked against the measured iterations"
    )
    return (
        f"- {label}: ingestion estimate {what}: exposed {num(f.get('exposed_floor_s'), 3)} s, "
        f"{num(f.get('exposed_ratio_floor'), 3)}x verl_sync_tuned's; wall ratio "
        f"{num(f.get('wall_ratio_floor'), 3)}x (its wall with its exposed time cut to that estimate). "
        f"Not a floor: {why}."
    )


def reward(
    d: Doc,
    base: tuple[str, str] = ("verl sync", "verl_sync_spread"),
    mine: tuple[str, str] = ("conduit", "conduit_within_spread"),
) -> list[str]:
    """``verl_iteration.py --reward-only``: per system and seed the final score (mean of the last
    iterations), verl sync's seed-to-seed spread and whether conduit lies within it. ``base`` and
    ``mine``: the two systems' names and their keys in ``reward_curve`` (``verl_staleness.py``'s:
    ``report_staleness.reward``)."""
    rc = d.get("reward_curve") or {}
    final = rc.get("final_score") or {}
    rows = [
        [str(d.get("algo") or DASH).upper(), system, str(seed), num(score, 4)]
        for system, per in final.items()
        for seed, score in (per or {}).items()
    ]
    spread = rc.get(base[1])
    lines = [
        f"- {num(rc.get('iterations'))} iterations per run, lr {DASH if rc.get('lr') is None else format(rc['lr'], 'g')}, final score = mean of the "
        f"last {num(rc.get('final_over_last'))}; {base[0]}'s spread over seeds: "
        f"{' .. '.join(num(x, 4) for x in spread) if spread else DASH}; {mine[0]}'s mean final score within "
        f"it: {verdict(rc.get(mine[1]))}."
    ]
    return (
        table(["algo", "system", "seed", "final score"], rows) + [""] + lines + error_lines("- Runs", d, ".")
    )
