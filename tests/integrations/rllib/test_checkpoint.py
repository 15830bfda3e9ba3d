"""algo.save()/restore() keep Conduit's replay buffer exactly, beside RLlib's files in Conduit's safe
format (occupied slots only, no pickle), and a save killed at any moment leaves a loadable checkpoint.

The kill case with real RLlib algorithms (a fresh process per kill, ~40 s) is slow; its fast counterpart
kills the same ``save_to_path`` (Conduit's mixin, RLlib's own files written by a stand-in) in processes
forked from one that imported everything once.
"""

from __future__ import annotations

import os
import pickle
import random
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import conduit_rllib
import pytest
import torch
from benchmark_modules import cartpole_dqn
from conduit_rllib.common import ConduitAlgorithmMixin, ModuleConduits

from conduit import BufferConfig, Column, ColumnBatch, Conduit, Schema

pytestmark = pytest.mark.ray


def dqn(capacity: int = 100_000):
    config = cartpole_dqn(
        replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": capacity}
    )
    return conduit_rllib.enable(config, overlap="sync").build_algo()


def buffer_state(algo) -> dict:
    return algo.conduit_path.conduits["default_policy"].state_dict()["buffer"]


def test_save_restore_keeps_the_buffer_exactly_and_small(ray_local, tmp_path: Path) -> None:
    algo = dqn()
    try:
        for _ in range(2):
            algo.train()
        algo.save(str(tmp_path / "ck"))
        algo.save(str(tmp_path / "ck"))  # over an existing checkpoint
        saved = buffer_state(algo)
    finally:
        algo.stop()
    files = {
        p.relative_to(tmp_path / "ck").as_posix(): p.stat().st_size
        for p in (tmp_path / "ck").rglob("*")
        if p.is_file()
    }
    with open(tmp_path / "ck" / "algorithm_state.pkl", "rb") as f:
        assert "conduit" not in pickle.load(f)  # the buffer is not in the pickle
    conduit_bytes = sum(v for k, v in files.items() if k.startswith("conduit/"))
    assert conduit_bytes < 2_000_000, files  # occupied slots only (capacity 100k would be ~4 MB)
    fresh = dqn()
    try:
        fresh.restore(str(tmp_path / "ck"))
        got = buffer_state(fresh)
        assert got["inserted"] == saved["inserted"] > 0 and got["sampled"] == saved["sampled"]
        for k, v in saved["storage"].items():
            assert torch.equal(v, got["storage"][k]), k
        assert torch.equal(saved["sampler"]["tree"]["priorities"], got["sampler"]["tree"]["priorities"])
        assert saved["sampler"]["max_priority"] == got["sampler"]["max_priority"]
        fresh.train()  # and it trains on (puts go on from the saved policy version)

    finally:
        fresh.stop()


CHILD = textwrap.dedent(
    """
    import os, sys, ray, torch
    sys.path.insert(0, {tests!r})
    torch.set_num_threads(1)
    ray.init(address={address!r}, log_to_driver=False)
    from test_checkpoint import dqn
    algo = dqn()
    if os.path.isdir({path!r}):
        algo.restore({path!r})  # go on from the last checkpoint
    print("READY", flush=True)
    while True:
        algo.train()
        algo.save({path!r})
        print("SAVED", flush=True)
    """
)


@pytest.mark.slow  # fast counterpart: test_a_killed_save_to_path_leaves_the_old_or_the_new_checkpoint_whole
def test_a_save_killed_at_any_moment_leaves_a_loadable_checkpoint(ray_local, tmp_path: Path) -> None:
    import ray

    path = str(tmp_path / "ck")
    script = CHILD.format(
        tests=str(Path(__file__).parent), path=path, address=ray.get_runtime_context().gcs_address
    )
    rng = random.Random(0)
    algo = dqn()
    seen = []
    try:
        for _ in range(5):
            child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
            try:
                assert child.stdout is not None and child.stdout.readline().startswith("READY")
                assert child.stdout.readline().startswith("SAVED")  # then kill during the next train/save
                time.sleep(rng.uniform(0.0, 2.0))
                os.kill(child.pid, signal.SIGKILL)
            finally:
                child.kill()
                child.wait()
            algo.restore(path)  # the old or the new checkpoint, never a torn one
            seen.append(buffer_state(algo)["inserted"])
    finally:
        algo.stop()
    assert len(seen) == 5 and all(a < b for a, b in zip(seen, seen[1:])) and seen[0] > 0, seen


# -- the fast counterpart: the mixin's save_to_path killed at random moments ----------------------------

SCHEMA = Schema([Column("obs", torch.float32, (4,)), Column("reward", torch.float32)])


class _RLlibSide:
    """What the mixin calls of RLlib's Algorithm: its own file into the directory it is given."""

    conduit_path: _Path

    def save_to_path(self, path: str, **kwargs: object) -> str:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "rllib_state.txt"), "w") as f:
            f.write(str(self.conduit_path.conduits["default_policy"].buffer.inserted))
        return path

    def restore_from_path(self, path: str, *args: object, **kwargs: object) -> None:
        with open(os.path.join(path, "rllib_state.txt")) as f:
            self.rllib_inserted = int(f.read())


class _Path:
    """``conduit_path`` as the mixin uses it (ConduitReplay's state layout)."""

    def __init__(self) -> None:
        self.conduits = {"default_policy": Conduit(SCHEMA, BufferConfig.prioritized_replay(4096), seed=0)}

    def state_dict(self) -> dict:
        for c in self.conduits.values():
            c.flush()
        return {"conduits": {mid: c.state_dict() for mid, c in self.conduits.items()}}

    def load_state_dict(self, state: dict) -> None:
        for mid, c in self.conduits.items():
            c.load_state_dict(state["conduits"][mid])

    disk_state = ModuleConduits.disk_state  # the on-disk layout of every conduit_path
    buffer_named = ModuleConduits.buffer_named


class _StandIn(ConduitAlgorithmMixin, _RLlibSide):
    def __init__(self) -> None:
        self._path = _Path()

    @property
    def conduit_path(self) -> _Path:  # type: ignore[override]
        return self._path


def _put_and_save(algo: _StandIn, path: str) -> None:
    conduit = algo.conduit_path.conduits["default_policy"]
    x = torch.arange(conduit.buffer.inserted, conduit.buffer.inserted + 32, dtype=torch.float32)
    conduit.put(ColumnBatch({"obs": x[:, None].repeat(1, 4), "reward": x}))
    algo.save_to_path(path)


def _save_forever(path: str) -> None:
    """Go on from the checkpoint at ``path`` (if any): put, save, say SAVED, again (until killed)."""
    algo = _StandIn()
    if os.path.isdir(path):
        algo.restore_from_path(path)
    while True:
        _put_and_save(algo, path)
        print("SAVED", flush=True)


FORKER = textwrap.dedent(
    """
    import os, sys, torch
    sys.path.insert(0, {tests!r})
    torch.set_num_threads(1)
    # A SIGKILL leaves the page cache whole, so what this case checks (the old or the new checkpoint,
    # never a torn one) does not depend on fsync; on a loaded CI disk each fsync took seconds and
    # the case ran out of time. Durability to the disk is not what is tested here.
    os.fsync = lambda fd: None
    from test_checkpoint import _StandIn, _put_and_save, _save_forever
    _put_and_save(_StandIn(), {path!r} + ".warm-up")  # what a first save loads lazily, loaded once here
    _StandIn().restore_from_path({path!r} + ".warm-up")
    for _ in sys.stdin:  # one saver per line, forked from here (everything is imported already)
        pid = os.fork()
        if pid == 0:
            try:
                _save_forever({path!r})
            finally:
                os._exit(1)
        print("FORKED", pid, flush=True)
        os.waitpid(pid, 0)  # the test kills it
        print("REAPED", flush=True)
    """
)


class _Lines:
    """Lines from a pipe, each waited for at most ``limit_s``; a clear failure naming the saver's state."""

    def __init__(self, fd: int, limit_s: float = 60.0) -> None:
        self.fd, self.limit_s, self.pending = fd, limit_s, b""

    def next(self, pid: int | None, waiting_for: str) -> str:
        while b"\n" not in self.pending:
            if not select.select([self.fd], [], [], self.limit_s)[0]:
                proc = Path(f"/proc/{pid}")
                state = (proc / "stat").read_text().split()[2] if pid and proc.exists() else "gone"
                wchan = (proc / "wchan").read_text() if pid and proc.exists() else "-"
                pytest.fail(
                    f"nothing from the forker in {self.limit_s} s waiting for {waiting_for}; saver {pid}: state {state}, wchan {wchan}"
                )
            chunk = os.read(self.fd, 4096)
            assert chunk, "the forking process ended"
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode()


@pytest.mark.timeout(300)
def test_a_killed_save_to_path_leaves_the_old_or_the_new_checkpoint_whole(tmp_path: Path) -> None:
    path = str(tmp_path / "ck")
    forker = subprocess.Popen(
        [sys.executable, "-c", FORKER.format(tests=str(Path(__file__).parent), path=path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert forker.stdin is not None and forker.stdout is not None
    lines = _Lines(forker.stdout.fileno())
    rng = random.Random(0)
    seen = []
    try:
        for _ in range(8):
            forker.stdin.write("go\n")
            forker.stdin.flush()
            pid, saved = None, False
            while pid is None or not saved:  # one save done; then kill during a later put or save
                line = lines.next(pid, "the first SAVED")
                if line.startswith("FORKED"):
                    pid = int(line.split()[1])
                saved = saved or line.startswith("SAVED")
            time.sleep(rng.uniform(0.0, 0.03))
            os.kill(pid, signal.SIGKILL)
            while not lines.next(pid, "REAPED after SIGKILL").startswith("REAPED"):
                pass
            algo = _StandIn()
            algo.restore_from_path(path)  # the old or the new checkpoint, never a torn one
            inserted = algo.conduit_path.conduits["default_policy"].buffer.inserted
            assert algo.rllib_inserted == inserted  # RLlib's files and Conduit's from the same save
            seen.append(inserted)
    finally:
        forker.kill()
        forker.wait()
    assert all(a < b for a, b in zip(seen, seen[1:])) and seen[0] > 0, seen
