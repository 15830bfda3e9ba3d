"""What the RLlib recipes (``rllib_dqn.py``, ``rllib_ppo.py``) share: flags from an ``Args`` dataclass,
the settings and Conduit switch every recipe's config gets, and the training loop that prints and
returns one row per iteration. Not a recipe itself."""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from typing import Any, TypeVar

A = TypeVar("A")


def parse_args(cls: type[A], doc: str | None, argv: list[str] | None = None) -> A:
    """One ``--flag`` per field of the dataclass ``cls`` (``--x/--no-x`` for a bool), defaults its own."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            p.add_argument(flag, type=type(f.default), default=f.default)
    return cls(**vars(p.parse_args(argv)))


def build_algo(config: Any, args: Any, **enable: Any) -> Any:
    """Finish an RLlib ``config`` with what the recipes share (``args.env``, one local env runner,
    ``args.seed``), route it through Conduit when ``args.conduit`` (``enable``: the plugin's keywords),
    and build the algorithm."""
    config = config.environment(args.env).env_runners(num_env_runners=0).debugging(seed=args.seed)
    if args.conduit:
        import conduit_rllib

        config = conduit_rllib.enable(config, **enable)
    return config.build_algo()


def train(build: Callable[[], Any], iters: int) -> list[dict]:
    """Start a local Ray, build the algorithm, train ``iters`` iterations; a row per iteration."""
    import torch
    from conduit_rllib.local_ray import init_local_ray

    torch.set_num_threads(1)
    init_local_ray(ignore_reinit_error=True)
    algo = build()
    history = []
    try:
        for it in range(iters):
            t0 = time.perf_counter()
            result = algo.train()
            wall = time.perf_counter() - t0
            row = {
                "iteration": it,
                "env_steps": result["env_runners"].get("num_env_steps_sampled_lifetime"),
                "return_mean": result["env_runners"].get("episode_return_mean"),
                "wall_s": wall,
                "exposed_s": result.get("conduit", {}).get("exposed_s"),
            }
            history.append(row)
            print(
                " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                flush=True,
            )
    finally:
        algo.stop()
    return history
