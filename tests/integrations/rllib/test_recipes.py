"""The RLlib recipes run on a tiny budget, with and without Conduit."""

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray
RECIPES = Path(__file__).resolve().parents[3] / "recipes"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, RECIPES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("conduit", ["--conduit", "--no-conduit"])
def test_dqn_recipe(ray_local, conduit):
    hist = _load("rllib_dqn").main(
        [
            "--iters",
            "2",
            "--steps-per-iter",
            "64",
            "--learning-starts",
            "32",
            "--train-batch-size",
            "16",
            conduit,
        ]
    )
    assert len(hist) == 2 and hist[-1]["env_steps"] >= 128
    assert (hist[-1]["exposed_s"] is not None) == (conduit == "--conduit")


def test_ppo_recipe(ray_local):
    hist = _load("rllib_ppo").main(
        ["--iters", "1", "--train-batch-size", "200", "--minibatch-size", "50", "--num-epochs", "2"]
    )
    assert hist[0]["exposed_s"] is not None
