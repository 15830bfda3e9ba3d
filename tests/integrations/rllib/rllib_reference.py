"""Plain per-step reference computations (loops on purpose) that the vectorised plugin is checked against."""

from __future__ import annotations

import numpy as np


def nstep_reference(episodes, n_step, gamma, only_full_open=True):
    """{(obs bytes, action): (n-step return, new_obs, terminated, k)} from whole episodes.

    ``episodes``: list of (obs [T+1, ...], actions [T], rewards [T], done, terminated). Transitions of an
    unfinished episode are listed only when their full n-step window is known (the packer holds the rest).
    """
    out = {}
    for obs, act, rew, done, terminated in episodes:
        T = len(act)
        for t in range(T):
            k = min(n_step, T - t)
            if not done and only_full_open and k < n_step:
                continue
            ret = 0.0
            for j in range(k):
                ret += gamma**j * float(rew[t + j])
            term = bool(done and terminated and t + k == T)
            key = (np.asarray(obs[t], np.float32).tobytes(), int(act[t]))
            out[key] = (ret, np.asarray(obs[t + k], np.float32), term, k)
    return out


def gae_reference(values, rewards, terminated_last, bootstrap, gamma, lambda_):
    """Advantages of one chunk: ``values[t]``, ``rewards[t]``; ``bootstrap`` = V(last next obs)."""
    T = len(rewards)
    adv = np.zeros(T, np.float64)
    last = 0.0
    for t in reversed(range(T)):
        if t == T - 1:
            next_v = 0.0 if terminated_last else bootstrap
        else:
            next_v = values[t + 1]
        delta = rewards[t] + gamma * next_v - values[t]
        last = delta + gamma * lambda_ * (last if t < T - 1 else 0.0)
        adv[t] = last
    return adv
