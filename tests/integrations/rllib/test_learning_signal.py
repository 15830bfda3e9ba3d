"""The learning signal on Conduit's path equals an independent reference computation (sync mode).

DQN: the sampled slots equal a seeded uniform draw, every sampled row's n-step columns equal a plain
loop over the recorded episodes, and the learner's loss equals the DQN loss computed here from the
RLModule (as it was before the update) and those reference columns. PPO: the first minibatch's loss
equals the PPO loss computed from reference GAE (a loop per episode chunk) and the module. Async:
losses stay finite and priorities reach the buffer.
"""

import copy

import conduit_rllib
import numpy as np
import pytest
import torch
from benchmark_modules import cartpole_dqn
from conduit_rllib.compat import local_learner
from ray.rllib.algorithms.ppo import PPOConfig
from rllib_reference import gae_reference, nstep_reference

pytestmark = pytest.mark.ray
MID = "default_policy"


def _record_chunks(path, store):
    """Wrap ``path.add`` to keep a copy of every episode chunk, read with RLlib's own getters."""
    orig = path.add

    def add(episodes, version):
        for ep in episodes:
            store.append(
                {
                    "id": ep.id_,
                    "obs": np.array(ep.get_observations()),
                    "act": np.array(ep.get_actions()),
                    "rew": np.array(ep.get_rewards()),
                    "done": ep.is_done,
                    "terminated": ep.is_terminated,
                    "logp": _extra(ep, "action_logp"),
                    "dist": _extra(ep, "action_dist_inputs"),
                }
            )
        return orig(episodes, version)

    path.add = add


def _extra(ep, key):
    return np.array(ep.get_extra_model_outputs(key)) if key in ep.extra_model_outputs else None


def _whole_episodes(chunks):
    eps = {}
    for c in chunks:
        e = eps.get(c["id"])
        if e is None:
            eps[c["id"]] = [c["obs"], c["act"], c["rew"], c["done"], c["terminated"]]
        else:
            e[0] = np.concatenate([e[0], c["obs"][1:]])
            e[1] = np.concatenate([e[1], c["act"]])
            e[2] = np.concatenate([e[2], c["rew"]])
            e[3], e[4] = c["done"], c["terminated"]
    return [tuple(e) for e in eps.values()]


def _record_updates(learner, n_keep):
    """Per ``_update`` call (first ``n_keep``): a copy of the module before it, the batch and the loss."""
    records = []
    orig_update, orig_loss = learner._update, learner.compute_loss_for_module

    def _update(batch, **kw):
        if len(records) < n_keep:
            records.append({"module": copy.deepcopy(learner.module[MID]), "batch": dict(batch[MID])})
        return orig_update(batch, **kw)

    def compute_loss_for_module(**kw):
        loss = orig_loss(**kw)
        if records and "loss" not in records[-1]:
            records[-1]["loss"] = float(loss.detach())
        return loss

    learner._update = _update
    learner.compute_loss_for_module = compute_loss_for_module
    return records


def _huber(x):
    a = x.abs()
    return torch.where(a < 1.0, 0.5 * x * x, a - 0.5)


def test_dqn_sync_learning_signal_equals_reference(ray_local):
    seed, n_step, gamma = 7, 3, 0.99
    replay_buffer = {"type": "EpisodeReplayBuffer", "capacity": 50_000}
    cfg = cartpole_dqn(steps=40, seed=seed, n_step=n_step, gamma=gamma, replay_buffer_config=replay_buffer)
    algo = conduit_rllib.enable(cfg, overlap="sync").build_algo()
    replay = algo.conduit_path
    chunks, draws = [], []
    _record_chunks(replay, chunks)
    orig_sample = replay.sample

    def sample(n):
        size = replay.conduits[MID].buffer.sampler.size
        out = orig_sample(n)
        draws.append((size, out.deliveries[MID].slots.clone()))
        return out

    replay.sample = sample
    records = _record_updates(local_learner(algo.learner_group), n_keep=3)
    try:
        algo.train()
    finally:
        algo.stop()
    assert len(records) == 3 and len(draws) >= 3

    # Sampled slots: the seeded uniform draw over the transitions stored at that moment.
    g = torch.Generator().manual_seed(seed)
    for size, slots in draws:
        assert torch.equal(slots, torch.randint(0, size, (16,), generator=g))

    ref = nstep_reference(_whole_episodes(chunks), n_step, gamma)
    for rec in records:
        b = rec["batch"]
        rows = [ref[(b["obs"][i].numpy().tobytes(), int(b["actions"][i]))] for i in range(16)]
        rew = torch.tensor([r[0] for r in rows], dtype=torch.float32)
        new_obs = torch.from_numpy(np.stack([r[1] for r in rows]))
        term = torch.tensor([r[2] for r in rows])
        k = torch.tensor([r[3] for r in rows], dtype=torch.float32)
        assert torch.allclose(b["rewards"], rew, atol=1e-5)
        assert torch.equal(b["new_obs"], new_obs) and torch.equal(b["terminateds"], term)
        assert torch.equal(b["n_step"], k) and torch.equal(b["weights"], torch.ones(16))
        # DQN's double-Q Huber loss, from the module as it was before this update.
        with torch.no_grad():
            out = rec["module"].forward_train({"obs": b["obs"], "new_obs": new_obs})
            q = out["qf_preds"].gather(1, b["actions"].view(-1, 1)).squeeze(1)
            best = out["qf_next_preds"].argmax(1, keepdim=True)
            q_next = out["qf_target_next_preds"].gather(1, best).squeeze(1)
            target = rew + gamma**k * (1.0 - term.float()) * q_next
            loss = float(_huber(q - target).mean())
        assert rec["loss"] == pytest.approx(loss, rel=1e-5, abs=1e-6)


def test_ppo_first_minibatch_loss_equals_reference(ray_local):
    gamma, lambda_ = 0.99, 0.95
    cfg = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .training(train_batch_size=128, minibatch_size=64, num_epochs=1, gamma=gamma, lambda_=lambda_)
        .debugging(seed=3)
    )
    algo = conduit_rllib.enable(cfg).build_algo()
    chunks = []
    _record_chunks(algo.conduit_path, chunks)
    learner = local_learner(algo.learner_group)
    module0 = copy.deepcopy(learner.module[MID])
    records = _record_updates(learner, n_keep=1)
    try:
        algo.train()
        conf = algo.config
    finally:
        algo.stop()
    # Reference GAE per chunk (bootstrapping unfinished chunks), normalised over the train batch.
    keys, advs, vts, logps, dists = [], [], [], [], []
    with torch.no_grad():
        for c in chunks:
            obs = torch.from_numpy(c["obs"].astype(np.float32))
            v = module0.compute_values({"obs": obs}).numpy().astype(np.float64)
            adv = gae_reference(v[:-1], c["rew"], c["terminated"], v[-1], gamma, lambda_)
            advs.append(adv)
            vts.append(adv + v[:-1])
            logps.append(c["logp"])
            dists.append(c["dist"])
            keys += [
                (c["obs"][t].astype(np.float32).tobytes(), int(c["act"][t])) for t in range(len(c["act"]))
            ]
    adv_all = np.concatenate(advs)
    adv_all = (adv_all - adv_all.mean()) / max(1e-4, adv_all.std())
    ref = dict(
        zip(
            keys,
            zip(adv_all, np.concatenate(vts), np.concatenate(logps), np.concatenate(dists), strict=True),
            strict=True,
        )
    )
    assert len(ref) == 128

    rec = records[0]
    b = rec["batch"]
    n = len(b["obs"])
    assert n == 64
    rows = [ref[(b["obs"][i].numpy().tobytes(), int(b["actions"][i]))] for i in range(n)]
    adv = torch.tensor([r[0] for r in rows], dtype=torch.float32)
    vt = torch.tensor([r[1] for r in rows], dtype=torch.float32)
    old_logp = torch.tensor(np.array([r[2] for r in rows]), dtype=torch.float32)
    old_logits = torch.tensor(np.stack([r[3] for r in rows]), dtype=torch.float32)
    assert torch.allclose(b["advantages"], adv, atol=1e-4)
    assert torch.allclose(b["value_targets"], vt, atol=1e-4)
    with torch.no_grad():
        m = rec["module"]
        logits = m.forward_train({"obs": b["obs"]})["action_dist_inputs"]
        logp_all = torch.log_softmax(logits, -1)
        ratio = torch.exp(logp_all.gather(1, b["actions"].view(-1, 1)).squeeze(1) - old_logp)
        surrogate = torch.min(adv * ratio, adv * ratio.clamp(1 - conf.clip_param, 1 + conf.clip_param))
        vf = m.compute_values({"obs": b["obs"]})
        vf_loss = ((vf - vt) ** 2).clamp(0, conf.vf_clip_param)
        old_lp = torch.log_softmax(old_logits, -1)
        kl = (old_lp.exp() * (old_lp - logp_all)).sum(-1)
        loss = (-surrogate + conf.vf_loss_coeff * vf_loss).mean() + conf.kl_coeff * kl.mean()
    assert rec["loss"] == pytest.approx(float(loss), rel=1e-4, abs=1e-5)


def test_dqn_async_is_sane(ray_local):
    cfg = cartpole_dqn(steps=96, seed=1)
    algo = conduit_rllib.enable(cfg, overlap="async", stage_steps=8).build_algo()
    sent = []
    try:
        r = algo.train()
        c = algo.conduit_path.conduits[MID]
        orig = c.update_priorities_at

        def update_priorities_at(slots, generations, priorities):
            assert slots.shape == generations.shape == priorities.shape and torch.isfinite(priorities).all()
            sent.append(priorities.clone())
            return orig(slots, generations, priorities)

        c.update_priorities_at = update_priorities_at
        r = algo.train()
        assert np.isfinite(r["learners"][MID]["qf_loss"])
        algo.conduit_path.flush()
        c.flush()
        c.get(16)  # the delivery worker applies queued priorities before its next sample
        assert sent
        assert c.buffer.sampler.max_priority >= float(torch.cat(sent).abs().max())
    finally:
        algo.stop()
