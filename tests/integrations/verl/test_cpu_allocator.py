"""The CPU harness's allocator setting (obstacle 14): freed activations stay mapped, so a step does not
pay the kernel to zero them again; the launcher sets it for every process and keeps a user's own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("verl")

from conduit_verl_cpu.patches import ALLOCATOR_ENV  # noqa: E402
from conduit_verl_cpu.run import set_cpu_env  # noqa: E402

# Training steps of a small attention stack whose scores ([32, 4, 288, 288] float32, 42 MiB) are over
# glibc's largest heap block (32 MiB), as the harness's whole-batch micro-batch's are, on a thread that
# is not the main one (a Ray actor's calls run on one); prints the minor page faults of steps 5-8.
_STEPS = """
import resource, threading, torch
torch.manual_seed(0)
torch.set_num_threads(1)
B, L, H, D = 32, 288, 4, 16
w = [torch.randn(H * D, 3 * H * D, requires_grad=True) for _ in range(1)]
x0 = torch.randn(B, L, H * D)
def step():
    x = x0
    for wi in w:
        q, k, v = (x @ wi).view(B, L, 3, H, D).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1)
        x = x + (a @ v).transpose(1, 2).reshape(B, L, H * D)
    x.square().mean().backward()
faults = []
def work():
    for _ in range(8):
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
        step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
t = threading.Thread(target=work)
t.start()
t.join()
print(faults[-1] - faults[4])
"""


def _faults(env_extra: dict[str, str]) -> int:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"} | env_extra
    proc = subprocess.run(
        [sys.executable, "-c", _STEPS], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return int(proc.stdout.split()[-1])


def test_freed_activations_are_not_faulted_in_again() -> None:
    plain = _faults({})
    kept = _faults(ALLOCATOR_ENV)
    # glibc's default unmaps each freed score tensor: ~100,000 fresh pages a step
    assert plain > 50_000, f"glibc's default should unmap the 42 MiB blocks: {plain} faults"
    assert kept < plain / 5, f"with {ALLOCATOR_ENV}: {kept} faults vs {plain} without"


def test_the_launcher_sets_the_allocator_and_keeps_a_users_own(tmp_path, monkeypatch) -> None:
    environ = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    monkeypatch.setattr(os, "environ", environ)
    set_cpu_env(tmp_path / "metrics.jsonl")
    assert environ["GLIBC_TUNABLES"] == ALLOCATOR_ENV["GLIBC_TUNABLES"]

    environ["GLIBC_TUNABLES"] = "glibc.malloc.check=0"
    set_cpu_env(tmp_path / "metrics.jsonl")
    assert environ["GLIBC_TUNABLES"] == "glibc.malloc.check=0"
