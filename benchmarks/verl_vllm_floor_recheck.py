"""One-off re-analysis (issue 47): mark whether each committed vLLM run's ingestion floor is a floor.

    python benchmarks/verl_vllm_floor_recheck.py   # rewrites the two files' ``ingestion_floor`` in place

The runs at 4c6563b (GRPO) and 0ca5c5e (PPO) predate :func:`verl_vllm_analysis.floor_holds`. Their rows
and floor figures are in the JSON, so this adds ``is_bound`` and ``undercut_by`` to ``ingestion_floor``
from the file's own rows and records a ``reanalysis`` entry; nothing else changes and nothing is re-run.
Idempotent: run again, it recomputes from the rows and records the new re-analysis. Standard library only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
from poll_check import poll_findings  # noqa: E402
from verl_vllm_analysis import floor_holds  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FILES = ("verl_iteration_vllm_grpo.json", "verl_iteration_vllm_ppo.json")
#: files from before issue 47's poll rule: they get ``poll_check`` from their own rows
POLL_FILES = (
    *FILES,
    "verl_iteration_paced_grpo.json",
    "verl_iteration_paced_ppo.json",
    "verl_staleness_vllm_grpo.json",
)
WHAT = (
    "from the file's own rows (verl_vllm_floor_recheck.py): ingestion_floor.is_bound and .undercut_by where "
    "it has a floor; poll_check (poll_check.poll_findings)"
)


def recheck(doc: dict[str, Any], system: str = "conduit") -> dict[str, Any]:
    """``doc`` with ``ingestion_floor`` checked against ``system``'s rows and the re-analysis recorded."""
    floor = doc.get("ingestion_floor") or {}
    out = dict(doc)
    if "per_iteration" in floor:
        out["ingestion_floor"] = floor | floor_holds(doc.get("rows") or [], floor, system)
    out["poll_check"] = poll_findings(doc.get("rows") or [])
    token = provenance.start()
    out["reanalysis"] = {"what": WHAT, **provenance.finish(token)}
    return out


def main() -> int:
    paths = [RESULTS / name for name in POLL_FILES]
    docs = [
        recheck(json.loads(p.read_text())) for p in paths
    ]  # every file read on a clean tree, then written
    for path, doc in zip(paths, docs, strict=True):
        path.write_text(json.dumps(doc, indent=1))
        f = doc.get("ingestion_floor") or {}
        print(
            f"{path.name}: is_bound={f.get('is_bound')}, undercut_by={f.get('undercut_by')}, polls={doc['poll_check']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
