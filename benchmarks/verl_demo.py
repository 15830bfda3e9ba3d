"""``./dev demo verl``: verl 0.9.1 GRPO on CPU with a paced rollout, verl sync vs Conduit's mode.

    python benchmarks/verl_demo.py [--steps 4] [--out demo_results/] [--poll S]

Runs, one after another with the same seed and data: a calibration run (sets the paced rollout's
time scale: generation = 4x the measured ingestion), a short poll-period sweep for verl's sync
trainer, verl ``sync`` with that period (``verl_sync_tuned``) and the ``conduit`` trainer mode.
Prints the per-iteration table (wall, exposed, loss) and writes ``verl_demo.json`` and
``verl_demo.png`` (stages per iteration). A few minutes on 2 idle cores, most of it Ray/verl start-up.

PACED: the tiny model generates every token, but each response is released when a modelled
inference server on separate hardware would finish it (``conduit_verl_cpu/pace.py``). It shows the
case of separate rollout GPUs with long-tail response lengths; it is not a GPU measurement.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import verl_iteration  # noqa: E402

SYSTEMS = ("verl_sync_tuned", "conduit")


def per_iteration(rows: list[dict[str, Any]]) -> str:
    """One line per iteration: each system's wall, exposed time and actor loss."""
    its = sorted({r["iteration"] for r in rows})
    head = f"{'iter':>4}" + "".join(f" | {s + ' wall':>21} {'exposed':>8} {'loss':>10}" for s in SYSTEMS)
    lines = [head]
    for it in its:
        line = f"{it:>4}"
        for s in SYSTEMS:
            r = next((r for r in rows if r["system"] == s and r["iteration"] == it), None)
            if r is None:
                line += f" | {'-':>21} {'-':>8} {'-':>10}"
            else:
                loss = r["actor_loss"]
                line += f" | {r['wall_s']:>21.3f} {r['exposed_s']:>8.3f} {loss if loss is None else f'{loss:.6f}':>10}"
        lines.append(line)
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10, help="measured iterations per system (+1 warm-up)")
    p.add_argument("--out", default="demo_results", help="folder for verl_demo.json and verl_demo.png")
    p.add_argument("--poll", type=float, default=None, help="verl sync's poll period (s); default: swept")
    a = p.parse_args()
    argv = ["--rollout", "paced", "--quick", "--systems", ",".join(SYSTEMS), "--steps", str(a.steps)]
    argv += ["--out", str(Path(a.out) / "verl_demo.json")]
    argv += ["--poll", str(a.poll)] if a.poll is not None else []
    args = verl_iteration.parse(argv)
    result, out = verl_iteration.bench(args)
    rows = result["rows"]
    print("verl 0.9.1 GRPO on CPU, PACED rollout (modelled separate rollout hardware, not a GPU measurement)")
    print(
        f"verl_sync_tuned: verl's sync trainer, replay-buffer poll {result.get('sweep', {}).get('chosen', args.poll)} s"
    )
    print(per_iteration(rows))
    r = result["ratios"]
    for key in ("wall", "exposed"):
        ratio = r.get(f"{key}/conduit_over_verl_sync_tuned")
        print(f"{key:>8}: conduit / verl_sync_tuned = {ratio} (medians)")
    print(f"same loss every iteration: {r.get('losses_equal/conduit_vs_verl_sync_tuned')}")
    if result["errors"]:
        print(f"errors: {sorted(result['errors'])}")
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 1 if result["errors"] or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
