"""Frame-once storage under async overlap: ``add`` hands the frames over and the Conduit's ingestion worker
encodes and appends them before it inserts the rows that reference them (``frame_packer.py``).

Hand-made frames whose pixels say which episode and step they belong to (``test_frames._interleaved_chunks``),
so every delivered stack can be checked on its own (``test_frames._check_stacks``).
"""

from __future__ import annotations

import threading

import gymnasium as gym
import numpy as np
import pytest
import torch
from conduit_rllib.errors import FrameFormatError, FrameStoreError
from conduit_rllib.frames import FrameStore
from conduit_rllib.replay import ConduitReplay
from conduit_rllib.settings import ConduitSettings
from frame_replays import frame_replay
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from test_frames import _check_stacks, _interleaved_chunks

from conduit.errors import ConduitError

MID = "default_policy"


def make_replay(capacity: int = 20_000, **settings) -> ConduitReplay:
    return frame_replay(capacity, **{"overlap": "async", **settings})


def bad_chunk(steps: int = 5) -> SingleAgentEpisode:
    """A whole episode of normalized float32 frames, one of them off the u / 128 - 1 grid."""
    codes = np.full((steps + 1, 2, 3, 1), 200, np.uint8)
    obs = codes.astype(np.float32) / np.float32(128) - np.float32(1)
    obs[2, 0, 0, 0] += np.float32(1e-3)
    return SingleAgentEpisode(
        id_="bad",
        observations=list(obs),
        actions=list(np.zeros(steps, np.int64)),
        rewards=list(np.ones(steps, np.float32)),
        terminated=True,
        observation_space=gym.spaces.Box(-1.0, 1.0, (2, 3, 1), np.float32),
        len_lookback_buffer=0,
    ).to_numpy()


def stored_refs(replay: ConduitReplay) -> torch.Tensor:
    c = replay.conduits[MID]
    rows = c.buffer.storage.read(torch.arange(min(c.buffer.inserted, c.buffer.capacity)))
    return torch.cat([rows["obs"], rows["new_obs"]], 1)


def test_add_hands_frames_over_and_the_worker_stores_them(monkeypatch):
    """An async add queues the frames (no encode on the calling thread); they are in the store, with the
    rows, once the worker ran; a settle stores the frames of steps still held back for n-step."""
    replay = make_replay(stage_steps=8)
    rounds = list(_interleaved_chunks(np.random.default_rng(1), 200))
    frames = 0
    for chunks in rounds:
        for ch in chunks:
            frames += len(ch) + (ch.t_started == 0)  # a later chunk's first frame is its predecessor's last
    encoded = []
    original = FrameStore.append

    def append(store, frames_):
        encoded.append(threading.current_thread().name)
        return original(store, frames_)

    monkeypatch.setattr(FrameStore, "append", append)
    for chunks in rounds:
        replay.add(chunks, version=0)
    packer = replay.packers[MID]
    assert packer.deferred
    replay.settle()
    assert encoded and set(encoded) <= {"conduit-ingest", threading.current_thread().name}
    assert encoded.count("conduit-ingest") > len(encoded) // 2  # the worker did (nearly) all of it
    assert packer.store.appended == frames and packer.pending_frames == 0
    refs = stored_refs(replay)
    assert int(refs.max()) < packer.store.appended
    replay.close()


def test_a_frame_the_worker_cannot_encode_surfaces_on_the_training_thread():
    """Off-grid float frames are found by the worker's encode, not by ``add``: the next call on the
    training thread raises a FrameFormatError (a ConduitError) naming the module, the frames and why;
    the rows using them are never stored, and the runtime goes on with exact stacks."""
    replay = make_replay(stage_steps=8)
    rng = np.random.default_rng(2)
    rounds = _interleaved_chunks(rng, 400)
    for _ in range(5):
        replay.add(next(rounds), version=0)
    replay.settle()
    replay.add([bad_chunk()], version=0)  # handed over: the values are not looked at here
    with pytest.raises(
        FrameFormatError, match=r"module 'default_policy'.*frames \d+\.\.\d+.*u / 128 - 1"
    ) as e:
        replay.settle()
    assert isinstance(e.value, ConduitError)
    for chunks in rounds:  # goes on
        replay.add(chunks, version=0)
    replay.settle()
    (first, end, _why), *_ = replay.packers[MID]._bad
    refs = stored_refs(replay)
    assert end - first == 6 and not bool(((refs >= first) & (refs < end)).any())
    assert int(refs.max()) < replay.packers[MID].store.appended
    for _ in range(5):
        sb = replay.sample(32).kwargs["batch"].policy_batches[MID]
        _check_stacks(sb["obs"], sb["new_obs"], sb["n_step"])  # no stack holds the padding stored instead
    replay.close()


def test_a_failing_frame_store_surfaces_as_a_conduit_error_and_stays_refused(monkeypatch):
    """Any other failure of the worker's append (here an OSError from the store) is raised on the
    training thread as a FrameStoreError naming the store, the frames and the cause; the module's adds
    are refused from then on (the references may no longer match the frames)."""
    replay = make_replay(stage_steps=8)
    rounds = _interleaved_chunks(np.random.default_rng(3), 400)
    replay.add(next(rounds), version=0)
    replay.settle()
    store = replay.packers[MID].store

    def failing(frames):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "append", failing)
    replay.add(next(rounds), version=0)
    with pytest.raises(FrameStoreError, match=r"module 'default_policy'.*frame store failed.*No space left"):
        replay.settle()
    with pytest.raises(FrameStoreError, match="frame store failed"):
        replay.add(next(rounds), version=0)
    replay.close()


def test_samples_right_after_adds_never_see_frames_not_yet_stored(monkeypatch):
    """Two threads sample while the training thread adds, the ingestion worker's frame writes slowed
    down: every delivered stack is its own episode's frames (a row inserted before its frames would read
    unwritten slots: a FramesEvictedError or other frames), and back-pressure bounds the frames handed
    over but not yet stored."""
    depth, stage = 2, 8
    replay = make_replay(stage_steps=stage, depth=depth, g_del=1)
    rounds = _interleaved_chunks(np.random.default_rng(4), 1500)
    replay.add(next(rounds), version=0)
    assert replay.ready()
    store = replay.packers[MID].store
    write = store._write
    done, errors, other_batches = threading.Event(), [], [0]

    def slow_write(codes):
        done.wait(0.002)
        return write(codes)

    monkeypatch.setattr(store, "_write", slow_write)

    def other_getter():
        c = replay.conduits[MID]
        try:
            while not done.is_set():
                d = c.get(32)
                _check_stacks(d.batch["obs"], d.batch["new_obs"], d.batch["n_step"])
                other_batches[0] += 1
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    getter = threading.Thread(target=other_getter, name="test-getter")
    getter.start()
    most_pending, checked = 0, 0
    try:
        for chunks in rounds:
            replay.add(chunks, version=0)
            most_pending = max(most_pending, replay.packers[MID].pending_frames)
            sb = replay.sample(32).kwargs["batch"].policy_batches[MID]
            _check_stacks(sb["obs"], sb["new_obs"], sb["n_step"])
            checked += 1
    finally:
        done.set()
        getter.join(30)
    assert not errors, errors
    assert checked > 100 and other_batches[0] > 10
    # staged (< stage + a round) + queued puts (depth) + the one being ingested, each < stage + a round
    round_frames = 2 * 5
    assert most_pending <= (depth + 2) * (stage + round_frames), most_pending
    assert store.appended > 10 * most_pending
    replay.settle()
    replay.close()


def test_reconfigure_switches_where_frames_are_encoded():
    """``overlap="auto"`` moves a replay between sync and async (``reconfigure``): the packers kept switch
    between appending while staging and handing over, with nothing pending lost at the switch."""
    replay = make_replay(overlap="sync")
    rng = np.random.default_rng(5)
    rounds = _interleaved_chunks(rng, 900)
    packer, pending = None, []
    # the second phase puts nothing (stage_steps): every frame it hands over is pending at the switch
    for settings in ({"overlap": "async", "stage_steps": 10**6}, {"overlap": "sync"}, {"overlap": "async"}):
        for _ in range(30):
            replay.add(next(rounds), version=0)
        packer = replay.packers[MID]
        pending.append(packer.pending_frames)
        replay.reconfigure(ConduitSettings(**settings))
        assert replay.packers[MID] is packer and packer.pending_frames == 0
        assert packer.deferred == (settings["overlap"] == "async")
    assert pending[0] == 0 and pending[1] > 100  # sync appends while staging; async hands over
    for chunks in rounds:
        replay.add(chunks, version=0)
    replay.settle()
    refs = stored_refs(replay)
    assert int(refs.max()) < packer.store.appended
    for _ in range(5):
        sb = replay.sample(32).kwargs["batch"].policy_batches[MID]
        _check_stacks(sb["obs"], sb["new_obs"], sb["n_step"])
    replay.close()
