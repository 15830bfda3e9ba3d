"""PPO in the streaming mode: GAE per piece + whole-batch whitening = verl's whole-batch GAE."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")

from conduit_verl.gae import (  # noqa: E402
    check_streamable,
    deferred_whitening,
    gae_without_whitening,
    uses_gae,
)
from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402
from verl.utils import torch_functional as verl_F  # noqa: E402

from conduit.errors import ConfigError  # noqa: E402


def _batch(rows: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(2, length + 1, (rows,), generator=g)
    mask = (torch.arange(length)[None, :] < lens[:, None]).float()
    rewards = torch.zeros(rows, length)
    rewards[torch.arange(rows), lens - 1] = torch.rand(rows, generator=g)  # outcome reward at EOS
    values = torch.randn(rows, length, generator=g) * mask
    return rewards, values, mask


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95)])
def test_pieces_then_whitening_equal_whole_batch(gamma: float, lam: float) -> None:
    rewards, values, mask = _batch(16, 12, seed=3)
    want_adv, want_ret = core_algos.compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    parts = [
        gae_without_whitening(rewards[i : i + 4], values[i : i + 4], mask[i : i + 4], gamma, lam)
        for i in (0, 4, 8, 12)
    ]
    raw = torch.cat([a for a, _ in parts])
    ret = torch.cat([r for _, r in parts])
    adv = verl_F.masked_whiten(raw, mask)
    torch.testing.assert_close(ret * mask, want_ret * mask, rtol=0, atol=1e-6)
    torch.testing.assert_close(adv * mask, want_adv * mask, rtol=0, atol=1e-5)


def test_deferred_whitening_is_scoped() -> None:
    from verl import DataProto

    rewards, values, mask = _batch(8, 6, seed=1)
    data = DataProto.from_dict({"token_level_rewards": rewards, "values": values, "response_mask": mask})
    original = core_algos.compute_gae_advantage_return
    with deferred_whitening():
        out = compute_advantage(data, adv_estimator="gae", gamma=1.0, lam=1.0, config=OmegaConf.create({}))
    assert core_algos.compute_gae_advantage_return is original
    raw, _ = gae_without_whitening(rewards, values, mask, 1.0, 1.0)
    torch.testing.assert_close(out.batch["advantages"], raw)


def test_pf_ppo_cannot_stream() -> None:
    cfg = OmegaConf.create({"algorithm": {"adv_estimator": "gae", "use_pf_ppo": True}})
    assert uses_gae(cfg)
    with pytest.raises(ConfigError, match="use_pf_ppo"):
        check_streamable(cfg)
    check_streamable(OmegaConf.create({"algorithm": {"adv_estimator": "grpo", "use_pf_ppo": True}}))
