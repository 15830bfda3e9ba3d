"""What a modelled-scale result of ``scaling.py`` must pass before it is called one (issue 47).

Validation: the model's between-system ratio (Conduit ÷ SimpleStorage data path per iteration) at the
held-out node counts (2 and 4 Ray nodes: measured, not fitted to) must lie within ``RATIO_TOLERANCE``
of the measured ratio at each, and that tolerance must be smaller than the effect the model claims at
its largest scale (|1 - its ratio there|): a model cannot resolve at scale a difference smaller than it
was checked to. Per-call and per-iteration errors of each system are reported beside it; only this
decides "validated".

Extrapolation: the modelled cluster runs on exactly the calibration that was validated, every term
kept. A term that acts only through a mechanism the cluster lacks would be dropped there unseen, so
such a term may not be in the validated calibration at all: ``offpath_s`` acts only through shared
host cores (``Cluster.host_cores``), which the cluster's nodes do not have, so the validation is made
without it (``check_carried`` refuses a calibration that has it on such a cluster).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scaling_config import Calibration, Cluster
from scaling_measure import NODE_COUNTS
from scaling_validate import FIT_NODES

from conduit.errors import ConfigError

#: the absolute tolerance on the ratio at a held-out node count (a twentieth; assumed, not measured)
RATIO_TOLERANCE = 0.05
#: the measured node counts not fitted to
HELD_OUT = tuple(n for n in NODE_COUNTS if n not in FIT_NODES)
#: calibration terms that act only through ``Cluster.host_cores`` (nodes sharing one host's cores)
HOST_CORE_TERMS = ("offpath_s",)
RULE = (
    "validated only if, at every held-out node count, the modelled Conduit ÷ SimpleStorage iteration "
    "ratio lies within the tolerance of the measured one, and the tolerance is smaller than the effect "
    "claimed at the largest modelled scale (|1 - modelled ratio|)"
)


def check_carried(validated: Calibration, used: Calibration, cluster: Cluster) -> None:
    """``ConfigError`` unless ``used`` (what the model runs on at scale) is ``validated`` term for term
    (``source`` aside) and every term of it acts on ``cluster``: a host-core term (``HOST_CORE_TERMS``)
    above 0 on a cluster without shared host cores would be dropped there."""
    a, b = validated.to_dict(), used.to_dict()
    changed = sorted(k for k in a if k != "source" and a[k] != b[k])
    if changed:
        raise ConfigError(f"extrapolation: the calibration differs from the validated one in {changed}")
    if cluster.host_cores == 0:
        dropped = [t for t in HOST_CORE_TERMS if getattr(used, t) > 0]
        if dropped:
            raise ConfigError(
                f"extrapolation: {dropped} act only through shared host cores, which {cluster.source} "
                "lacks: the cluster would drop a term of the validated calibration; validate without it"
            )


def _ratio(by: Mapping[tuple[str, int], float], nodes: int) -> float | None:
    c, t = by.get(("conduit", nodes)), by.get(("tq_simplestorage", nodes))
    return None if c is None or not t else c / t


def ratio_validation(
    per_iteration: list[Mapping[str, Any]],
    measured: Mapping[str, Mapping[str, Any]],
    claimed_ratio: float | None,
    claimed_at_gpus: int | None,
    tolerance: float = RATIO_TOLERANCE,
    held_out: tuple[int, ...] = HELD_OUT,
) -> dict[str, Any]:
    """The between-system check: ``per_iteration`` the model's iterations on the measured configurations
    (``system``, ``nodes``, ``predicted_s``: the validated calibration's), ``measured`` the measured
    ratios by node count (``scaling_measure.backend_ratios``), ``claimed_ratio`` the model's Conduit ÷
    SimpleStorage iteration at ``claimed_at_gpus``, its largest scale. A held-out count without both
    ratios fails (never a silent pass)."""
    by = {(str(r["system"]), int(r["nodes"])): float(r["predicted_s"]) for r in per_iteration}
    rows = []
    for n in held_out:
        got = (measured.get(str(n)) or {}).get("ratio")
        model = _ratio(by, n)
        diff = None if got is None or model is None else model - float(got)
        rows.append(
            {
                "nodes": n,
                "measured_ratio": got,
                "modelled_ratio": None if model is None else round(model, 3),
                "difference": None if diff is None else round(diff, 3),
                "within": diff is not None and abs(diff) <= tolerance,
            }
        )
    effect = None if claimed_ratio is None else round(abs(1 - claimed_ratio), 3)
    below = effect is not None and tolerance < effect
    ok = below and all(r["within"] for r in rows)
    absent = [r["nodes"] for r in rows if r["difference"] is None]
    off = [r["nodes"] for r in rows if r["difference"] is not None and not r["within"]]
    reasons = [
        "no modelled ratio at the largest scale (unequal work)" if effect is None else "",
        f"the tolerance {tolerance} is not below the claimed effect {effect}"
        if effect is not None and not below
        else "",
        f"no measured or modelled ratio at {absent} node(s) (scaling.py --measure on 1, 2, 4 and 8 nodes)"
        if absent
        else "",
        f"the modelled ratio is off by more than {tolerance} at {off} node(s)" if off else "",
    ]
    why = (
        "; ".join(x for x in reasons if x)
        or "every held-out ratio within the tolerance, below the claimed effect"
    )
    return {
        "rule": RULE,
        "held_out": rows,
        "tolerance": tolerance,
        "claimed_ratio": claimed_ratio,
        "claimed_at_gpus": claimed_at_gpus,
        "claimed_effect": effect,
        "tolerance_below_effect": below,
        "validated": ok,
        "verdict": "validated" if ok else "not validated",
        "why": why,
    }
