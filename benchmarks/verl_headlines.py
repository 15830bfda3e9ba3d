"""``verl_iteration.py``'s headline claims: ``conduit`` ÷ ``verl_sync_tuned`` (both on-policy), wall and
exposed time, each with its interval and verdict (``intervals.headline``). The targets: issue 29's on the
paced rollout (wall <= 0.85x, exposed <= 0.3x), issue 48's on vLLM (wall <= 0.85x, exposed <= 0.35x,
responses identical >= 95%); on the hf rollout, where no target was set,
the claim is only "faster" (<= 1.0x). Refused where the two did different work, their losses differ, or
the baseline waited on a long poll (``poll_check``)."""

from __future__ import annotations

from typing import Any

from intervals import headline

PAIR = ("conduit", "verl_sync_tuned")
#: issue 48 on vLLM: exposed <= 0.35x, and responses identical >= 95% (vLLM batches the requests in
#: flight, so a near-tie can go another way and the losses then differ)
TARGETS = {"paced": (0.85, 0.3), "vllm": (0.85, 0.35), "hf": (1.0, 1.0)}
IDENTICAL_SHARE = 0.95


def iteration_headlines(
    rows: list[dict[str, Any]],
    ratio: dict[str, Any],
    polls: dict[str, str],
    rollout: str,
    identical: float | None = None,
) -> list[dict[str, Any]]:
    """The two headline claims of a ``verl_iteration`` file (module docstring). On vLLM the pair must
    share ``identical`` >= :data:`IDENTICAL_SHARE` of their responses instead of equal losses."""
    a, b = PAIR
    why = ratio.get(f"refused/{a}_over_{b}")
    if rollout == "vllm":
        if why is None and (identical is None or identical < IDENTICAL_SHARE):
            why = f"{a} and {b} share {identical} of their responses (< {IDENTICAL_SHARE})"
    elif why is None and ratio.get(f"losses_equal/{a}_vs_{b}") is False:
        why = f"losses differ between {a} and {b}"
    if why is None and b in polls:
        why = f"{b}: {polls[b]}"
    algo = str(rows[0]["algo"]).upper() if rows else ""
    wall, exposed = TARGETS[rollout]
    return [
        headline(f"verl {algo} {rollout}: {a} ÷ {b}, {what}", rows, PAIR, key, target, refused=why)
        for what, key, target in (("wall", "wall_s", wall), ("exposed", "exposed_s", exposed))
    ]
