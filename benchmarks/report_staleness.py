"""Staleness renderers for ``report.py``: ``verl_staleness.py``'s runs (Conduit's ``max_staleness=k``
beside verl's async trainers) and its reward curves (``--reward-only``)."""

from __future__ import annotations

from typing import Any

from report_fmt import DASH, Refusals, get, ms, num, table, targets, verdict
from report_headline import headline_lines
from report_verl import Doc, bound_by, error_lines, pair_cell
from report_vllm import reward as reward_table


def _ratio_pairs(r: dict[str, Any]) -> list[tuple[str, str]]:
    """Every ``(X, Y)`` of a ``wall/X_over_Y``, ``refused/X_over_Y`` or ``backend/...`` key, in order."""
    out: list[tuple[str, str]] = []
    for key in r:
        parts = key.split("/")
        if parts[0] in ("wall", "refused", "backend") and "_over_" in parts[-1]:
            x, y = parts[-1].split("_over_", 1)
            if (x, y) not in out:
                out.append((x, y))
    return out


def staleness(docs: dict[str, Doc]) -> list[str]:
    """``verl_staleness.py``'s runs (GRPO, PPO): per system the bound, the measured staleness (median /
    max and where it came from), work and median wall / exposed / weight-push time; then every ratio
    the JSON holds (conduit k ÷ verl's async trainers only at equal measured staleness, else the
    refusal; the storage backend alone; conduit_k0 ÷ verl_sync_tuned), the targets, the reward curves.
    Files whose summary carries the two-resource bound add "wall ÷ bound", "bound by" and the seconds
    per response token (the comparison that holds where two systems' work differs)."""
    refusals = Refusals()
    rows, pair_rows, lines = [], [], []
    bound = any("wall_over_bound" in s for d in docs.values() if d for s in d.get("summary") or [])
    for name, d in docs.items():
        if not d:
            continue
        label = str(d.get("algo") or get(d, "summary", 0, "algo") or name).upper()
        for s in d.get("summary") or []:
            hist = s.get("lag_histogram")
            rows.append(
                [
                    label,
                    num(s.get("system")),
                    num(s.get("tq_backend")),
                    "none"
                    if s.get("system") and s.get("max_staleness") is None
                    else num(s.get("max_staleness")),
                    f"{num(s.get('staleness_median'))} / {num(s.get('staleness_max'))}",
                    num(s.get("staleness_source")),
                    ", ".join(f"{k}: {num(v)}" for k, v in hist.items()) if isinstance(hist, dict) else DASH,
                    f"{num(s.get('iterations'))} ({num(s.get('rounds'))})",
                    f"{num(s.get('responses'))} / {num(s.get('response_tokens'))}",
                    f"{num(s.get('prompts_generated'))} / {num(s.get('stale_dropped'))}",
                    num(s.get("wall_s"), 3),
                    num(s.get("exposed_s"), 3),
                    num(s.get("ingest_busy_s"), 3),
                    num(s.get("update_weights_s"), 3),
                    *(
                        [
                            num(s.get("wall_over_bound"), 2),
                            bound_by(s.get("bound_by")),
                            ms(s.get("s_per_token"), 3),
                        ]
                        if bound
                        else []
                    ),
                ]
            )
        r = d.get("ratios") or {}
        for x, y in _ratio_pairs(r):
            kind = (
                "storage backend"
                if r.get(f"backend/wall/{x}_over_{y}") is not None or r.get(f"refused/backend/{x}_over_{y}")
                else (
                    "Conduit no staler"
                    if x.startswith("conduit_k") and not x.startswith("conduit_k0")
                    else "on-policy"
                )
            )
            work = r.get(f"work/{x}_vs_{y}")
            pair_rows.append(
                [label, f"{x} ÷ {y}", kind, pair_cell(r, x, y, refusals) or DASH, num(work) if work else DASH]
            )
        lines += [f"- {label}: {line.removeprefix('- ')}" for line in targets(d.get("targets"))]
        lines += headline_lines(label, d)
        rc = d.get("reward_curve") or {}
        if rc:
            final = rc.get("final_score") or {}
            per = "; ".join(
                f"{s} {', '.join(num(v, 3) for v in (f or {}).values()) or DASH}" for s, f in final.items()
            )
            lines.append(
                f"- {label}: reward, mean score of the last {num(rc.get('final_over_last'))} of "
                f"{num(rc.get('iterations'))} iterations per seed: {per or DASH}; conduit_k1 within "
                f"verl_colocate_async's seed-to-seed spread: {verdict(rc.get('k1_within_spread'))}."
            )
        lines += error_lines(f"- {label}", d, ".")
    head = [
        "algo",
        "system",
        "TQ backend",
        "bound k",
        "staleness median / max",
        "staleness from",
        "groups by lag",
        "iterations (rounds)",
        "responses / response tokens",
        "prompts generated / dropped stale",
        "wall s",
        "exposed s",
        "ingestion busy s",
        "update_weights s",
        *(["wall ÷ bound", "bound by", "ms per response token"] if bound else []),
    ]
    out = table(head, rows) + [""]
    if pair_rows:
        out += table(["algo", "ratio", "compared", "wall / exposed", "generated work"], pair_rows) + [""]
    return out + refusals.lines() + lines


def reward(d: Doc) -> list[str]:
    """``verl_staleness.py --reward-only``: per system and seed the final score, verl_colocate_async's
    seed-to-seed spread and whether conduit_k1's mean lies within it (``report_vllm.reward``), then the
    rollout and shape the runs had."""
    lines = reward_table(
        d, ("verl_colocate_async", "verl_colocate_async_spread"), ("conduit_k1", "k1_within_spread")
    )
    return lines + [f"- Rollout {num(d.get('rollout'))}; {num(get(d, 'method', 'shape'))}."]
