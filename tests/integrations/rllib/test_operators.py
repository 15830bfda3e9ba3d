"""The vectorised operators against per-step reference loops (RLlib's own GAE for PPO)."""

import numpy as np
import torch
from conduit_rllib.gae import gae, segment_reverse_discounted_cumsum
from conduit_rllib.nstep import nstep_transitions
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit import ColumnBatch


def _segments(lengths):
    lens = torch.tensor(lengths)
    return torch.repeat_interleave(torch.cumsum(lens, 0), lens)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=6), st.floats(0.0, 1.0), st.integers(0, 2**31))
def test_segment_cumsum_matches_loop(lengths, c, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(lengths), generator=g)
    got = segment_reverse_discounted_cumsum(x, _segments(lengths), c)
    ref, pos = [], 0
    for n in lengths:
        run, out = 0.0, [0.0] * n
        for t in reversed(range(n)):
            run = float(x[pos + t]) + c * run
            out[t] = run
        ref += out
        pos += n
    assert torch.allclose(got, torch.tensor(ref), atol=1e-4)


def test_segment_cumsum_long_fragment_uses_blocks():
    x = torch.ones(20_000)
    got = segment_reverse_discounted_cumsum(x, torch.full((20_000,), 20_000), 0.9)
    assert torch.allclose(got[:100], torch.full((100,), 10.0), atol=1e-3)
    assert abs(float(got[-1]) - 1.0) < 1e-6


@given(st.lists(st.integers(1, 9), min_size=1, max_size=5), st.integers(1, 4), st.integers(0, 2**31))
@settings(max_examples=40, deadline=None)
def test_nstep_matches_loop(lengths, n, seed):
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    seg_end = _segments(lengths)
    term = torch.zeros(total, dtype=torch.bool)
    term[seg_end[-1] - 1] = True
    batch = ColumnBatch(
        {
            "obs": torch.arange(total, dtype=torch.float32).unsqueeze(1),
            "next_obs": torch.arange(1, total + 1, dtype=torch.float32).unsqueeze(1),
            "actions": torch.zeros(total, dtype=torch.int64),
            "rewards": torch.rand(total, generator=g),
            "terminateds": term,
            "seg_end": seg_end,
            "emit": torch.ones(total, dtype=torch.bool),
        }
    )
    out = nstep_transitions(batch, n, 0.9)
    for i in range(total):
        e = int(seg_end[i])
        k = min(n, e - i)
        ret = sum(0.9**j * float(batch["rewards"][i + j]) for j in range(k))
        assert abs(float(out["rewards"][i]) - ret) < 1e-5
        assert float(out["new_obs"][i, 0]) == i + k
        assert bool(out["terminateds"][i]) == bool(term[i + k - 1])
        assert int(out["n_step"][i]) == k


def test_gae_matches_rllib_compute_value_targets():
    from ray.rllib.utils.postprocessing.value_predictions import compute_value_targets

    torch.manual_seed(0)
    lengths, terminated = [5, 3, 7], [True, False, False]
    n = sum(lengths)
    obs = torch.randn(n, 3)
    next_obs = torch.randn(n, 3)
    w = torch.randn(3)

    def value_fn(o):
        return o @ w

    term = torch.zeros(n, dtype=torch.bool)
    ends = np.cumsum(lengths) - 1
    term[torch.tensor(ends[terminated])] = True
    batch = ColumnBatch(
        {
            "obs": obs,
            "next_obs": next_obs,
            "actions": torch.zeros(n, dtype=torch.int64),
            "action_logp": torch.zeros(n),
            "action_dist_inputs": torch.zeros(n, 2),
            "rewards": torch.rand(n),
            "terminateds": term,
            "seg_end": _segments(lengths),
        }
    )
    got = gae(batch, value_fn, 0.99, 0.95)
    # RLlib's layout: every chunk elongated by one phantom step holding the last next-observation.
    vals, rews, terms, truncs, pos = [], [], [], [], 0
    for length, is_term in zip(lengths, terminated):
        v = value_fn(obs[pos : pos + length]).numpy()
        vals += list(v) + [float(value_fn(next_obs[pos + length - 1]))]
        rews += list(batch["rewards"][pos : pos + length].numpy()) + [0.0]
        terms += [0.0] * (length - 1) + [float(is_term), 0.0]
        truncs += [0.0] * (length - 1) + [float(not is_term), 0.0]
        pos += length
    targets = compute_value_targets(
        np.array(vals, np.float32), np.array(rews, np.float32), np.array(terms), np.array(truncs), 0.99, 0.95
    )
    real = np.concatenate(
        [np.arange(s, s + n_) for s, n_ in zip(np.cumsum([0] + [x + 1 for x in lengths[:-1]]), lengths)]
    )
    assert np.allclose(got["value_targets"].numpy(), targets[real], atol=1e-4)
