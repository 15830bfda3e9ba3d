"""Frame-once storage against RLlib's own frame stacking, on episodes recorded from ALE Qbert.

Episodes come from RLlib's env runner on ``wrap_atari_for_new_api_stack`` (grayscale 64x64, frameskip
4, normalized float32 frames; life loss ends an episode) with ``FrameStackingEnvToModule`` in its
pipeline, two envs per runner and short fragments, so chunks of several episodes interleave. The
reference stacks are RLlib's connectors run on each whole episode: ``FrameStackingLearner`` for
observations 0..T-1 and ``FrameStackingEnvToModule`` for the last one (a stack at T, the n-step next
observation of a terminal transition). Conduit must deliver the same bits, in both overlap modes (async:
frames encoded and appended on the ingestion worker).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

pytest.importorskip("ale_py")

NUM_FRAMES, N_STEP, GAMMA = 4, 3, 0.99
MID = "default_policy"


def _record():
    import ale_py
    import gymnasium as gym
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.connectors.env_to_module.frame_stacking import FrameStackingEnvToModule
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
    from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack
    from ray.tune.registry import register_env

    gym.register_envs(ale_py)
    register_env(
        "conduit-test-qbert",
        lambda cfg: wrap_atari_for_new_api_stack(gym.make("ale_py:ALE/Qbert-v5", **cfg), dim=64),
    )
    config = (
        DQNConfig()
        .environment(
            "conduit-test-qbert",
            env_config={"frameskip": 1, "full_action_space": False, "repeat_action_probability": 0.0},
        )
        .env_runners(
            num_env_runners=0,
            num_envs_per_env_runner=2,
            rollout_fragment_length=5,
            env_to_module_connector=lambda env, spaces, device: FrameStackingEnvToModule(
                num_frames=NUM_FRAMES
            ),
        )
        .debugging(seed=3)
    )
    runner = SingleAgentEnvRunner(config=config)
    rounds, done = [], 0
    while done < 4:
        chunks = runner.sample(num_timesteps=10, random_actions=True)
        rounds.append(chunks)
        done += sum(c.is_done for c in chunks)
    runner.stop()
    return rounds


@pytest.fixture(scope="module")
def rounds():
    torch.set_num_threads(1)
    return _record()


@pytest.fixture(params=["sync", "async"])
def overlap(request):
    return request.param


def _whole_episodes(rounds):
    """Chunks joined per episode: observations, actions, rewards, done, terminated, spaces."""
    eps = {}
    for chunks in rounds:
        for c in chunks:
            obs, act, rew = (np.asarray(x) for x in (c.get_observations(), c.get_actions(), c.get_rewards()))
            if c.id_ not in eps:
                eps[c.id_] = [obs, act, rew, False, False, c.observation_space, c.action_space]
            else:
                e = eps[c.id_]
                e[0] = np.concatenate([e[0], obs[1:]])
                e[1], e[2] = np.concatenate([e[1], act]), np.concatenate([e[2], rew])
            eps[c.id_][3], eps[c.id_][4] = c.is_done, c.is_terminated
    return eps


def _rllib_stacks(obs, act, rew, obs_space, act_space):
    """RLlib's stacked observations 0..T of one whole episode, from RLlib's two FrameStacking connectors."""
    from ray.rllib.connectors.env_to_module.frame_stacking import FrameStackingEnvToModule
    from ray.rllib.connectors.learner.frame_stacking import FrameStackingLearner
    from ray.rllib.core.columns import Columns
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    def episode():
        return SingleAgentEpisode(
            observations=list(obs),
            actions=list(act),
            rewards=list(rew),
            observation_space=obs_space,
            action_space=act_space,
            len_lookback_buffer=0,
        )

    learner = FrameStackingLearner(num_frames=NUM_FRAMES)(
        rl_module=None, batch={}, episodes=[episode().to_numpy()], shared_data={}
    )
    (first_t,) = learner[Columns.OBS].values()
    env_to_module = FrameStackingEnvToModule(num_frames=NUM_FRAMES)(
        rl_module=None, batch={}, episodes=[episode()], shared_data={}
    )
    ((last,),) = env_to_module[Columns.OBS].values()  # one item: the stack at T
    stacks = np.concatenate([np.concatenate(first_t), np.asarray(last)[None]])
    assert stacks.shape == (len(obs), 64, 64, NUM_FRAMES) and stacks.dtype == np.float32
    return stacks


def _reference(rounds):
    """Counter of (obs, new_obs, action, n-step return, terminated, n_step) of every transition Conduit stores,
    with RLlib's stacks; plus how many start an episode and how many have a terminal next obs."""
    rows, starts, terminal = Counter(), 0, 0
    for obs, act, rew, done, terminated, o_space, a_space in _whole_episodes(rounds).values():
        stacks = _rllib_stacks(obs, act, rew, o_space, a_space)
        T = len(act)
        for t in range(T):
            k = min(N_STEP, T - t)
            if not done and k < N_STEP:
                continue  # held back until the episode's next chunk
            ret = round(sum(GAMMA**j * float(rew[t + j]) for j in range(k)), 4)
            term = bool(done and terminated and t + k == T)
            rows[(stacks[t].tobytes(), stacks[t + k].tobytes(), int(act[t]), ret, term, k)] += 1
            starts += t == 0
            terminal += term
    return rows, starts, terminal


def _row_keys(batch):
    obs, new_obs = batch["obs"].numpy(), batch["new_obs"].numpy()
    out = Counter()
    for i in range(len(obs)):
        out[
            (
                obs[i].tobytes(),
                new_obs[i].tobytes(),
                int(batch["actions"][i]),
                round(float(batch["rewards"][i]), 4),  # float32 sums: compared to 4 decimals
                bool(batch["terminateds"][i]),
                int(batch["n_step"][i]),
            )
        ] += 1
    return out


def _replay(rounds, capacity=10_000, overlap="sync", **settings):
    from conduit_rllib.replay import ConduitReplay
    from conduit_rllib.settings import ConduitSettings

    from conduit import BufferConfig

    replay = ConduitReplay(
        ConduitSettings(overlap=overlap, **settings),
        BufferConfig.prioritized_replay(capacity, alpha=0.6, beta=0.4),
        n_step=N_STEP,
        gamma=GAMMA,
        device="cpu",
        num_learners=0,
        seed=0,
        frame_stack=NUM_FRAMES,
    )
    for chunks in rounds:
        replay.add(chunks, version=0)
    assert replay.ready() or not rounds
    replay.settle()  # async: every frame and row handed over is stored
    return replay


def test_stored_transitions_are_rllibs_stacks(rounds, overlap):
    """Every stored transition, stacked at delivery, is bit-identical to RLlib's connectors' output."""
    from conduit_rllib.frames import frame_stack_operator

    want, starts, terminal = _reference(rounds)
    assert starts >= 4 and terminal >= 4  # episode starts (padded stacks) and terminal n-step next obs
    replay = _replay(rounds, overlap=overlap)
    assert replay.packers[MID].deferred == (overlap == "async")
    c = replay.conduits["default_policy"]
    stored = c.buffer.storage.read(torch.arange(c.buffer.inserted))
    delivered = frame_stack_operator(replay.packers["default_policy"].store)(stored)
    assert delivered["obs"].dtype == torch.float32 and tuple(delivered["obs"].shape[1:]) == (64, 64, 4)
    assert _row_keys(delivered) == want
    replay.close()


def test_sampled_batches_are_rllibs_stacks(rounds, overlap):
    """Batches sampled through the replay (prioritized, with weights) hold only RLlib's transitions."""
    want, _, _ = _reference(rounds)
    replay = _replay(rounds, overlap=overlap)
    for _ in range(3):
        train = replay.sample(32)
        sb = train.kwargs["batch"].policy_batches["default_policy"]
        got = _row_keys(sb)
        assert sum(got.values()) == 32 and set(got) <= set(want)
        td = {"default_policy": np.full(32, 2.0, np.float32)}
        replay.update_priorities(train, td)
    replay.close()


def test_frames_stored_once_as_uint8(rounds, overlap):
    """One uint8 frame per observation: frames appended = observations across all chunks, once each."""
    eps = _whole_episodes(rounds)
    replay = _replay(rounds, overlap=overlap)
    store = replay.packers["default_policy"].store
    assert store.storage.data["frame"].dtype == torch.uint8
    assert store.appended == sum(len(e[0]) for e in eps.values())
    per_transition = replay.conduits["default_policy"].buffer.storage.schema.nbytes_per_item
    assert per_transition < 200  # references and scalars only; a stacked float32 pair is 131072 bytes
    replay.close()


def _all_rows(replay):
    from conduit_rllib.frames import frame_stack_operator

    c = replay.conduits["default_policy"]
    stored = c.buffer.storage.read(torch.arange(c.buffer.inserted))
    return _row_keys(frame_stack_operator(replay.packers["default_policy"].store)(stored))


def test_state_dict_round_trip_keeps_frames(rounds, overlap):
    """A reconfigure round trip (state_dict → new replay) delivers the same transitions."""
    replay = _replay(rounds, overlap=overlap)
    other = _replay([], overlap=overlap)
    other.load_state_dict(replay.state_dict())
    assert _all_rows(other) == _all_rows(replay)
    replay.close()
    other.close()


def test_checkpoint_on_disk_restores_the_same_transitions(rounds, overlap, tmp_path):
    """The plugin's checkpoint path (``save_tree`` / ``load_tree``, as ``save_to_path`` and
    ``restore_from_path`` call them), taken while episodes run: after the restore, their next chunks
    give the same transitions as in the replay never saved (frames, references, held-back steps)."""
    from conduit.persist.tree import load_tree, save_tree

    cut = len(rounds) - 3
    replay = _replay(rounds[:cut], overlap=overlap)
    save_tree(replay.state_dict(), replay.conduits, tmp_path / "ckpt")
    other = _replay([], overlap=overlap)
    other.load_state_dict(load_tree(tmp_path / "ckpt", lambda mid: other.conduits[mid]))
    assert _all_rows(other) == _all_rows(replay)
    for r in (replay, other):
        for chunks in rounds[cut:]:
            r.add(chunks, version=1)
        r.settle()
    assert _all_rows(other) == _all_rows(replay) == _reference(rounds)[0]
    replay.close()
    other.close()


def _columns(sample_batch):
    return {k: torch.as_tensor(np.asarray(sample_batch[k])) for k in sorted(sample_batch.keys())}


def test_async_frame_add_delivers_the_sync_batches(rounds):
    """At equal staging and draws (8 steps per put, one batch per draw), the async add (frames encoded
    and appended on the ingestion worker, after ``add`` returned) stores the same frames under the same
    ids and the same transition rows slot by slot, and delivers the same batches as the sync add."""
    sync = _replay(rounds, overlap="sync", stage_steps=8, g_del=1)
    lazy = _replay(rounds, overlap="async", stage_steps=8, g_del=1)
    assert lazy.packers[MID].deferred and not sync.packers[MID].deferred
    s_store, l_store = sync.packers[MID].store, lazy.packers[MID].store
    assert s_store.appended == l_store.appended > 0
    n = s_store.appended
    assert torch.equal(s_store.storage.data["frame"][:n], l_store.storage.data["frame"][:n])
    s_buf, l_buf = sync.conduits[MID].buffer, lazy.conduits[MID].buffer
    assert s_buf.inserted == l_buf.inserted > 0
    rows = torch.arange(s_buf.inserted)
    s_rows, l_rows = s_buf.storage.read(rows), l_buf.storage.read(rows)
    for k in s_rows.columns:
        assert torch.equal(s_rows[k], l_rows[k]), k
    for _ in range(6):
        a = _columns(sync.sample(32).kwargs["batch"].policy_batches[MID])
        b = _columns(lazy.sample(32).kwargs["batch"].policy_batches[MID])
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), [
            k for k in a if not torch.equal(a[k], b[k])
        ]
    sync.close()
    lazy.close()
