"""Frame-once storage's own logic on hand-made frames: codes, padding, references, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conduit_rllib.errors import FrameFormatError, FramesEvictedError
from conduit_rllib.frame_packer import FramePacker
from conduit_rllib.frames import FrameCodec, FrameStore
from frame_replays import episode_chunk, frame_replay
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from conduit.errors import ConduitError


def _frames(codes: np.ndarray) -> np.ndarray:
    """RLlib's normalized float32 frames ``[T, 2, 3, 1]`` with every pixel of frame t = codes[t] / 128 - 1."""
    c = np.asarray(codes, np.float32).reshape(-1, 1, 1, 1)
    return np.broadcast_to(c / np.float32(128.0) - np.float32(1.0), (len(c), 2, 3, 1)).copy()


def _chunk(obs: np.ndarray, done: bool, ep: SingleAgentEpisode | None = None):
    """A finalized chunk with observations ``obs`` (continuing ``ep`` when given)."""
    if ep is None:
        ep = SingleAgentEpisode()
        ep.add_env_reset(observation=obs[0])
        obs = obs[1:]
    for t, o in enumerate(obs):
        last = done and t == len(obs) - 1
        ep.add_env_step(o, 0, 1.0, terminated=last)
    nxt = None if done else ep.cut()
    return ep.to_numpy(), nxt


def test_codec_round_trip_is_exact():
    u = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1)
    x = u.astype(np.float32) / 128.0 - 1.0  # NormalizedImageEnv's arithmetic
    codec = FrameCodec.of(x)
    assert codec.normalized and codec.fill_code == 128
    codes = codec.encode(x)
    assert codes.dtype == np.uint8 and np.array_equal(codes, u)
    assert torch.equal(codec.decode(torch.from_numpy(codes)), torch.from_numpy(x))
    assert float(codec.decode(torch.tensor([codec.fill_code], dtype=torch.uint8))) == 0.0  # RLlib's fill


def test_stacks_pad_before_the_episode_start_and_follow_references():
    store = FrameStore(2, 3, capacity=16, codec=FrameCodec(normalized=True))
    assert store.append(_frames([10, 11, 12])) == 0
    assert store.append(_frames([20, 21])) == 3
    refs = torch.tensor([[-1, -1, -1, 0], [-1, 0, 1, 2], [0, 1, 2, 4], [-1, -1, 3, 4]])
    out = store.stacks(refs)
    assert out.shape == (4, 2, 3, 4) and out.dtype == torch.float32
    want = np.array([[128, 128, 128, 10], [128, 10, 11, 12], [10, 11, 12, 21], [128, 128, 20, 21]])
    assert torch.equal(out[:, 1, 2, :], torch.from_numpy(want / np.float32(128.0) - np.float32(1.0)))


def test_packer_references_cross_chunks_never_episodes():
    packer = FramePacker(n_step=1, num_frames=3, capacity=64)
    c1, rest = _chunk(_frames([1, 2, 3]), done=False)
    c2, _ = _chunk(_frames([4, 5]), done=True, ep=rest)
    c3, _ = _chunk(_frames([7, 8]), done=True)  # a new episode: padded again
    packer.stage([c1])
    packer.stage([c2, c3])
    batch = packer.pack()
    assert batch is not None
    stacks = packer.store.stacks(batch["obs"])[:, 0, 0, :]
    codes = torch.round((stacks + 1) * 128).to(torch.int64)
    assert codes.tolist() == [[128, 128, 1], [128, 1, 2], [1, 2, 3], [2, 3, 4], [128, 128, 7]]
    assert packer.store.appended == 5 + 2  # each observation once


def test_wrong_dtype_is_refused_by_name():
    with pytest.raises(FrameFormatError, match="int16"):
        FrameCodec.of(np.zeros((1, 2, 3, 1), np.int16))
    codec = FrameCodec.of(np.zeros((1, 2, 3, 1), np.uint8))
    with pytest.raises(FrameFormatError, match="float32.*earlier frames were uint8"):
        codec.encode(np.zeros((1, 2, 3, 1), np.float32))


def test_float_frames_off_the_uint8_grid_are_refused():
    x = _frames([3, 4])
    x[1, 0, 0, 0] += 1e-3
    with pytest.raises(FrameFormatError, match="u / 128 - 1"):
        FrameCodec.of(x).encode(x)
    with pytest.raises(FrameFormatError, match="u / 128 - 1"):
        FrameCodec.of(x).encode(np.full((1, 2, 3, 1), 1.5, np.float32))  # code 320 > 255


def test_wrong_shape_is_refused_by_name():
    packer = FramePacker(n_step=1, num_frames=4, capacity=64)
    chunk, _ = _chunk(np.zeros((3, 4), np.float32), done=True)  # CartPole-like vectors
    with pytest.raises(FrameFormatError, match=r"shape \(4,\).*\(H, W, 1\)"):
        packer.stage([chunk])
    store = FrameStore(2, 3, capacity=8, codec=FrameCodec(normalized=True))
    with pytest.raises(FrameFormatError, match=r"\(2, 3, 3\) where this module's frames are \(2, 3, 1\)"):
        store.append(np.zeros((1, 2, 3, 3), np.float32))


def test_overwritten_frames_raise_instead_of_delivering_others():
    store = FrameStore(2, 3, capacity=4, codec=FrameCodec(normalized=True))
    store.append(_frames(range(3)))
    store.append(_frames(range(3, 6)))  # ids 0..5: 0 and 1 overwritten by 4 and 5
    assert store.stacks(torch.tensor([[-1, 2, 3, 5]])).shape == (1, 2, 3, 4)
    with pytest.raises(FramesEvictedError, match="frame store"):
        store.stacks(torch.tensor([[0, 1, 2, 3]]))


def test_frame_errors_are_conduit_errors():
    assert issubclass(FrameFormatError, ConduitError) and issubclass(FramesEvictedError, ConduitError)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_stack_kernel_equals_torch_gather_pad_transpose(dtype):
    from conduit_rllib.frame_kernels import stack_frames

    g = torch.Generator().manual_seed(0)
    src = torch.randint(0, 256, (50, 12), dtype=torch.uint8, generator=g)
    slots = torch.randint(0, 50, (7, 4), generator=g)
    pad = torch.rand(7, 4, generator=g) < 0.3
    table = (torch.arange(257) * 3 % 251).to(dtype)
    want = table[src[slots].to(torch.int64)]  # [B, F, P]
    want[pad] = table[256]
    assert torch.equal(stack_frames(src, slots, pad, table), want.permute(0, 2, 1))
    with pytest.raises(IndexError, match="out of range"):
        stack_frames(src, torch.full((1, 4), 50), torch.zeros(1, 4, dtype=torch.bool), table)


def test_uint8_frames_are_delivered_as_uint8_padded_with_zero():
    store = FrameStore(2, 3, capacity=8, codec=FrameCodec.of(np.zeros((1, 2, 3, 1), np.uint8)))
    store.append(np.full((2, 2, 3, 1), 7, np.uint8))
    out = store.stacks(torch.tensor([[-1, 0, 1]]))
    assert out.dtype == torch.uint8 and out[0, 0, 0].tolist() == [0, 7, 7]


def _interleaved_chunks(rng, steps: int):
    """Rounds of 4-step chunks of two episodes at a time; frame pixels: 1 + episode % 100, t % 256, t // 256."""
    import gymnasium as gym

    space = gym.spaces.Box(-1.0, 1.0, (2, 3, 1), np.float32)
    running: list[list] = []  # [id, number, length, t]
    made = 0
    while made < steps:
        while len(running) < 2:
            n = len(running) + made
            running.append([f"ep{n}-{made}", n, int(rng.integers(1, 40)), 0])
        chunks = []
        for ep in running:
            eid, n, length, t0 = ep
            t1 = min(length, t0 + 4)
            codes = np.zeros((t1 - t0 + 1, 2, 3, 1), np.uint8)
            ts = np.arange(t0, t1 + 1)
            codes[:, 0, 0, 0], codes[:, 0, 1, 0], codes[:, 0, 2, 0] = 1 + n % 100, ts % 256, ts // 256
            frames = codes.astype(np.float32) / np.float32(128) - np.float32(1)
            actions, rewards = rng.integers(0, 3, t1 - t0), np.ones(t1 - t0, np.float32)
            chunks.append(episode_chunk(eid, frames, actions, rewards, t1 == length, space, t0))
            ep[3] = t1
            made += t1 - t0
        running = [ep for ep in running if ep[3] < ep[2]]
        yield chunks


def _check_stacks(obs: torch.Tensor, new_obs: torch.Tensor, n_step: torch.Tensor) -> None:
    """Each stack is one episode's frames t-3..t (padding exactly before t = 0); next obs at t + n_step."""
    for stack, shift in ((obs, torch.zeros_like(n_step)), (new_obs, n_step.to(torch.int64))):
        codes = torch.round((stack[:, 0] + 1) * 128).to(torch.int64)  # [B, W=3, F]
        ep, t = codes[:, 0, :], codes[:, 1, :] + 256 * codes[:, 2, :]
        last_t = t[:, -1]
        for f in range(3):
            want_pad = last_t - (3 - f) < 0
            assert torch.equal(ep[:, f] == 128, want_pad)
            real = ~want_pad
            assert torch.equal(ep[real, f], ep[real, -1]) and torch.equal(t[real, f], last_t[real] - (3 - f))
        if shift.any():
            assert torch.equal(
                last_t - shift,
                torch.round((obs[:, 0, 1, -1] + 1) * 128).to(torch.int64)
                + 256 * torch.round((obs[:, 0, 2, -1] + 1) * 128).to(torch.int64),
            )


def test_replay_rings_wrap_and_stacks_stay_exact():
    """Transitions (capacity 64) and frames wrap their rings many times over interleaved episodes;
    every sampled and every stored transition is still its own episode's frames."""
    from conduit_rllib.frames import frame_stack_operator

    replay = frame_replay(64)
    for chunks in _interleaved_chunks(np.random.default_rng(0), 1500):
        replay.add(chunks, version=0)
    store = replay.packers["default_policy"].store
    assert store.appended > 2 * store.capacity  # the frame ring wrapped
    for _ in range(10):
        sb = replay.sample(32).kwargs["batch"].policy_batches["default_policy"]
        _check_stacks(sb["obs"], sb["new_obs"], sb["n_step"])
    c = replay.conduits["default_policy"]
    stored = frame_stack_operator(store)(c.buffer.storage.read(torch.arange(64)))
    _check_stacks(stored["obs"], stored["new_obs"], stored["n_step"])
    replay.close()
