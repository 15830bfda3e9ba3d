"""``autotune.py --refit FILE``: a recorded run re-predicted with the current equations (no measurement)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from autotune_calibration import Calibration, describe_overlap, fit_overlap
from autotune_loop import SyntheticLoop
from autotune_rank import kendall

from conduit.costmodel import Knobs, OperatorCost, OverlapCosts


def refit(path: Path, device: str) -> list[dict[str, Any]]:
    """Re-predict a recorded run (``path``) with the current equations, no new measurement.

    The operator costs are the recorded calibration's. The overlap costs are refitted on the recorded
    calibration runs where the file has them; an older file without them gets, per size, overlap costs
    fitted on the async grid rows of the *other* sizes (a hold-out by size)."""
    record = json.loads(path.read_text())
    c = record["calibration"]
    rows = record["rows"]
    base = Calibration(OperatorCost(**c["ingest"]), OperatorCost(**c["deliver"]), c["call_s"], OverlapCosts(),
                       record["machine"]["bandwidth_host_to_consumer"], c.get("runs", []))  # fmt: skip
    batch = rows[0]["batch"]
    if base.runs:
        fit_overlap(base, batch, device)
    out = []
    for row in rows:
        cal = base
        if not base.runs:  # hold-out by size: the other sizes' async grid rows calibrate
            runs = [{"dim": o["dim"], "knobs": k, "wall_s": m, "producer_s": o["producer_s"],
                     "consumer_s": o["consumer_s"]}
                    for o in rows if o is not row
                    for k, m in zip(o["configs"], o["measured_s"], strict=True) if k["overlap"] == "async"]  # fmt: skip
            cal = dataclasses.replace(base, runs=runs)
            fit_overlap(cal, batch, device)
        model = cal.model(SyntheticLoop(row["dim"], batch, device), row["producer_s"], row["consumer_s"])
        predicted = [model.predict(Knobs(**k)).wall_s for k in row["configs"]]
        measured = row["measured_s"]
        best_p = min(range(len(predicted)), key=predicted.__getitem__)
        out.append(
            {
                "item_bytes": row["item_bytes"],
                "overlap_costs": dataclasses.asdict(cal.overlap),
                "overlap_costs_fitted_on": "calibration runs"
                if base.runs
                else "other sizes' async grid rows",
                "kendall_tau_recorded_model": kendall(row["predicted_s"], measured),
                "kendall_tau_current_model": kendall(predicted, measured),
                "kendall_tau_between_rounds": row.get("kendall_tau_between_rounds"),
                "predicted_best_gap_to_best": measured[best_p] / min(measured) - 1,
            }
        )
        r = out[-1]
        print(
            f"{r['item_bytes']:>6} B/item  tau recorded model {r['kendall_tau_recorded_model']:.2f}  "
            f"current model {r['kendall_tau_current_model']:.2f}  predicted best is "
            f"{r['predicted_best_gap_to_best']:+.1%} off the best measured  ({describe_overlap(cal.overlap)})"
        )
    return out
