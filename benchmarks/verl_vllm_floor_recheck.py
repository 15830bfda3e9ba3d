"""One-off re-analysis (issue 47): mark whether each committed vLLM run's ingestion floor is a floor.

    python benchmarks/verl_vllm_floor_recheck.py   # rewrites the two files' ``ingestion_floor`` in place

The runs at 4c6563b (GRPO) and 0ca5c5e (PPO) predate :func:`verl_vllm_analysis.floor_holds`. Their rows
and floor figures are in the JSON, so this adds ``is_bound`` and ``undercut_by`` to ``ingestion_floor``
from the file's own rows and records a ``reanalysis`` entry; nothing else changes and nothing is re-run.
Idempotent. Standard library only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
from verl_vllm_analysis import floor_holds  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FILES = ("verl_iteration_vllm_grpo.json", "verl_iteration_vllm_ppo.json")
WHAT = "ingestion_floor.is_bound and .undercut_by added from the file's own rows (verl_vllm_floor_recheck.py)"


def recheck(doc: dict[str, Any], system: str = "conduit") -> dict[str, Any]:
    """``doc`` with ``ingestion_floor`` checked against ``system``'s rows and the re-analysis recorded."""
    floor = doc.get("ingestion_floor") or {}
    if "per_iteration" not in floor or "is_bound" in floor:
        return doc
    checked = floor | floor_holds(doc.get("rows") or [], floor, system)
    token = provenance.start()
    return doc | {"ingestion_floor": checked, "reanalysis": {"what": WHAT, **provenance.finish(token)}}


def main() -> int:
    for name in FILES:
        path = RESULTS / name
        doc = recheck(json.loads(path.read_text()))
        path.write_text(json.dumps(doc, indent=1))
        f = doc.get("ingestion_floor") or {}
        print(f"{name}: is_bound={f.get('is_bound')}, undercut_by={f.get('undercut_by')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
