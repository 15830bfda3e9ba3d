"""DQN's staged packer + n-step operator against a per-step reference loop, on real RLlib episode chunks."""

import numpy as np
import pytest
import torch
from conduit_rllib.fragments import TransitionPacker, chunk_arrays
from conduit_rllib.nstep import nstep_transitions
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from rllib_reference import nstep_reference


def _episodes(rng, n_eps):
    """Whole episodes plus their chunks, cut at random points (as env runners return them)."""
    wholes, chunk_lists = [], []
    for _ in range(n_eps):
        T = int(rng.integers(1, 12))
        obs = rng.standard_normal((T + 1, 3)).astype(np.float32)
        act = rng.integers(0, 4, T)
        rew = rng.standard_normal(T)
        terminated = bool(rng.integers(0, 2))
        done = bool(rng.integers(0, 4))  # mostly finished; some still running at the end
        ep = SingleAgentEpisode()
        ep.add_env_reset(observation=obs[0])
        chunks = []
        for t in range(T):
            last = t == T - 1 and done
            ep.add_env_step(
                obs[t + 1],
                int(act[t]),
                float(rew[t]),
                terminated=last and terminated,
                truncated=last and not terminated,
            )
            if not last and rng.random() < 0.4:
                nxt = ep.cut()
                chunks.append(ep.to_numpy())
                ep = nxt
        if len(ep) > 0:
            chunks.append(ep.to_numpy())
        wholes.append((obs, act, rew, done, terminated))
        chunk_lists.append(chunks)
    return wholes, chunk_lists


@pytest.mark.parametrize("n_step", [1, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_staged_packing_matches_reference(n_step, seed):
    rng = np.random.default_rng(seed)
    wholes, chunk_lists = _episodes(rng, 8)
    # Interleave the episodes' chunks in order, packing at random moments.
    queues = [list(c) for c in chunk_lists]
    packer = TransitionPacker(n_step)
    outs = []
    while any(queues):
        live = [q for q in queues if q]
        q = live[int(rng.integers(0, len(live)))]
        packer.stage([q.pop(0)])
        if rng.random() < 0.3:
            b = packer.pack()
            if b is not None:
                outs.append(nstep_transitions(b, n_step, 0.9))
    b = packer.pack()
    if b is not None:
        outs.append(nstep_transitions(b, n_step, 0.9))
    got = {}
    for o in outs:
        for i in range(o.size):
            key = (o["obs"][i].numpy().tobytes(), int(o["actions"][i]))
            assert key not in got, "a transition was emitted twice"
            got[key] = (
                float(o["rewards"][i]),
                o["new_obs"][i].numpy(),
                bool(o["terminateds"][i]),
                int(o["n_step"][i]),
            )
    ref = nstep_reference(wholes, n_step, 0.9)
    assert set(got) == set(ref)
    for key, (ret, new_obs, term, k) in ref.items():
        g = got[key]
        assert abs(g[0] - ret) < 1e-5 and np.array_equal(g[1], new_obs) and g[2] == term and g[3] == k


def test_chunk_arrays_match_rllib_getters():
    rng = np.random.default_rng(0)
    _, chunk_lists = _episodes(rng, 4)
    for chunks in chunk_lists:
        for ep in chunks:
            o, a, r = chunk_arrays(ep)
            assert np.array_equal(o, ep.get_observations())
            assert np.array_equal(a, ep.get_actions()) and np.array_equal(r, ep.get_rewards())


def test_packer_state_round_trip():
    rng = np.random.default_rng(3)
    _, chunk_lists = _episodes(rng, 3)
    p = TransitionPacker(3)
    p.stage(chunk_lists[0][:1])
    q = TransitionPacker(3)
    q.load_state_dict(p.state_dict())
    a, b = p.pack(), q.pack()
    assert (a is None) == (b is None)
    if a is not None:
        assert all(torch.equal(a[k], b[k]) for k in a.columns)
