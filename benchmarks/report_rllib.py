"""BENCHMARKS.md renderers for issue 31's RLlib workloads: the Atari replay cells, Atari DQN iteration time
on ALE and MuJoCo PPO."""

from __future__ import annotations

from typing import Any

from report_fmt import DASH, num, rows_of, table, targets, times

Doc = dict[str, Any]


#: how the peers' rows read: RLlib's buffer as shipped (env-stacked float32 observations), TorchRL as its DQN
#: recipe lays out a transition (both uint8 stacks), TorchRL's frame-once path (single frames, stacks at sample)
LABELS = {
    "native": "native, as shipped (float32 stacks)",
    "torchrl": "torchrl, recipe layout (both stacks)",
    "torchrl_frames": "torchrl_frames (single frames, stacks at sample)",
}
NATIVE = LABELS["native"]
#: said where the results file has no ``torchrl_frames`` row (a run from before that system)
NOT_COMPARED = (
    "- TorchRL's frame-once path (`CatFrames.make_rb_transform_and_sampler` with a slice sampler, each "
    "frame stored once) is not yet a system here: not yet compared."
)


def _row(d: Doc, system: str, capacity: int, tier: str) -> dict[str, Any]:
    return next(
        (
            r
            for r in rows_of(d)
            if r.get("system") == system and r.get("capacity") == capacity and r.get("frames_tier") == tier
        ),
        {},
    )


def _bytes_stored(d: Doc) -> str:
    """The line that says what the 1M TorchRL ÷ Conduit ratios compare: bytes stored, not speed."""
    torchrl, conduit = _row(d, "torchrl", 1_000_000, "disk"), _row(d, "conduit", 1_000_000, "disk")
    mem = (d.get("machine") or {}).get("mem_total_gib")
    return (
        "- At 1M, TorchRL ÷ Conduit (the ratios below and the 1M target above) is bytes stored vs TorchRL's "
        "DQN recipe layout (both 4-frame stacks per transition), not a speed headline: TorchRL's memmap "
        f"holds {num(torchrl.get('disk_gib'), 2)} GiB, Conduit's frames {num(conduit.get('frames_gib'), 2)} "
        f"GiB, on a machine of {num(mem, 1)} GiB memory; the latency ratios follow from where those bytes "
        "sit (page cache or disk), not from a faster sample path."
    )


def _peer(key: str) -> str:
    """The peer a ``ratios`` key sets against Conduit (``refused/<peer>/...``, ``<m>/<peer>_over_conduit/...``,
    ``<m>/conduit_over_<peer>/...``)."""
    return key.split("/")[1].removesuffix("_over_conduit").removeprefix("conduit_over_")


def _stored(r: dict[str, Any]) -> str:
    """What one frame-once TorchRL cell stored and how it sampled, from its row."""
    if "refused" in r:
        return f"{num(r.get('capacity'), 0)}: refused"
    w, s = r.get("work") or {}, r.get("sampler") or {}
    cached = {True: ", trajectory boundaries cached between writes", False: ", boundaries found per sample"}
    return (
        f"{num(r.get('capacity'), 0)}: {num(w.get('bytes_per_transition'), 0)} bytes stored per transition, "
        f"{w.get('sampler', DASH)} ({s.get('class', DASH)}{cached.get(s.get('cache_values'), '')}), "
        f"{w.get('n_step', DASH)}-step"
    )


def _frames(d: Doc, ratio_lines: list[str]) -> list[str]:
    """Conduit ÷ TorchRL's frame-once path, the speed comparison, with what each of its cells stored and
    sampled; :data:`NOT_COMPARED` where the file has no such row."""
    rows = [r for r in rows_of(d) if r.get("system") == "torchrl_frames"]
    if not rows:
        return [NOT_COMPARED]
    head = (
        "- The speed comparison, Conduit against TorchRL's frame-once path (`torchrl_frames`: "
        "`CatFrames.make_rb_transform_and_sampler`'s transform and a slice sampler, single uint8 frames stored, "
        f"stacks built at sample time): {'; '.join(map(_stored, rows))}."
    )
    return [head, *ratio_lines]


def rllib_atari(d: Doc) -> list[str]:
    """``rllib_atari.py``: per system, capacity and frame tier the memory, insert rate and prioritized
    sample + update latency with its work; then native / TorchRL ÷ Conduit (or why refused) and the
    TorchRL target; the 1M recipe-layout TorchRL ratios apart, as bytes stored (:func:`_bytes_stored`), and
    the frame-once TorchRL ratios last, as the speed comparison (:func:`_frames`)."""
    body = []
    for r in rows_of(d):
        w = r.get("work") or {}
        work = (
            f"{w.get('env_steps', DASH)} / {w.get('samples', DASH)} / {w.get('updates', DASH)}" if w else DASH
        )
        system = LABELS.get(str(r.get("system")), str(r.get("system", DASH)))
        if "refused" in r:
            body.append([system, num(r.get("capacity"), 0), DASH, str(r["refused"]), *[DASH] * 7])
            continue
        body.append(
            [
                system,
                num(r.get("capacity"), 0),
                str(r.get("frames_tier", DASH)),
                f"{num(r.get('rss_gib'), 2)} ({num(r.get('rss_anon_gib'), 2)} / {num(r.get('rss_file_gib'), 2)})",
                num(r.get("peak_rss_gib"), 2),
                num(r.get("disk_gib"), 2),
                num(r.get("frames_gib"), 2),
                num(r.get("insert_steps_per_s"), 0),
                num(r.get("sample_update_p50_ms"), 3),
                num(r.get("sample_update_p99_ms"), 3),
                work,
            ]
        )
    head = [
        "system",
        "capacity",
        "frames on",
        "RSS grown GiB (anon / file)",
        "peak RSS GiB",
        "disk GiB",
        "obs GiB",
        "insert steps/s",
    ]
    head += ["sample+update p50 ms", "p99 ms", "env steps / samples / updates"]
    ratios = d.get("ratios") or {}
    lines = {k: f"- {k}: {times(v) if isinstance(v, (int, float)) else v}" for k, v in ratios.items()}
    at_1m = [k for k in lines if _peer(k) == "torchrl" and "/1000000/" in k]
    frames = [k for k in lines if _peer(k) == "torchrl_frames"]
    out = table(head, body) + [""] + [v for k, v in lines.items() if k not in at_1m + frames]
    out += targets(d.get("targets_met"))
    if at_1m:
        out += [_bytes_stored(d), *(lines[k] for k in at_1m)]
    return out + _frames(d, [lines[k] for k in frames])


def rllib_mujoco(d: Doc, extra: tuple[tuple[str, str, int], ...] = ()) -> list[str]:
    """``rllib_mujoco.py``: medians per iteration of both systems, their work, the ratios and targets;
    ``extra``: more columns, each ``(head, key in ratios after the system's name, decimals)``."""
    r = d.get("ratios") or {}
    body = [
        [
            system,
            num(r.get(f"{system}_wall_s"), 3),
            num(r.get(f"{system}_exposed_s"), 3),
            *[num(r.get(f"{system}_{key}"), nd) for _, key, nd in extra],
            ", ".join(f"{k} {v}" for k, v in (r.get(f"{system}_work") or {}).items()),
        ]
        for system in ("native", "conduit")
    ]
    refused = r.get("ratio_refused")
    lines = [
        f"- Conduit ÷ native: wall {times(r.get('ratio_wall'))}, exposed {times(r.get('ratio_exposed'))}"
        + (f" (refused: {refused})" if refused else "")
        + "."
    ]
    head = ["system", "wall s (median)", "exposed s (median)", *[h for h, _, _ in extra], "work"]
    return table(head, body) + [""] + lines + targets(d.get("targets_met"))


def rllib_atari_iteration(d: Doc) -> list[str]:
    """``rllib_atari_iteration.py``: as :func:`rllib_mujoco`, with the bytes each replay holds at the end and
    the process's resident memory (both systems share the process)."""
    r = d.get("ratios") or {}
    lines = rllib_mujoco(
        d, (("replay GiB (end)", "replay_gib", 3), ("s / update (median)", "wall_s_per_update", 4))
    )
    rss = f"- Process resident memory, both systems together: at most {num(r.get('process_rss_gib'), 2)} GiB."
    return [*lines, rss]


__all__ = ["rllib_atari", "rllib_atari_iteration", "rllib_mujoco"]
