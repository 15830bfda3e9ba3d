"""The CPU harness's torch.distributed rendezvous listens only at MASTER_ADDR (issue 26, item 2).

torch's ``env://`` rendezvous starts rank 0's TCPStore on the wildcard address; the harness's
``init_process_group`` patch binds it to ``MASTER_ADDR`` through a pre-bound socket. Two real
processes (rank 0 and rank 1) rendezvous and all-reduce over gloo; rank 0 lists its listening sockets.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("conduit_verl_cpu")
psutil = pytest.importorskip("psutil")

RANK = r"""
import json, os, psutil, torch
import torch.distributed as dist
from conduit_verl_cpu.patches import _patch_init_process_group
_patch_init_process_group()
dist.init_process_group(backend="cpu:gloo,cpu:gloo", rank=int(os.environ["RANK"]), world_size=2)
t = torch.full((3,), float(os.environ["RANK"]) + 1)
dist.all_reduce(t)
me = psutil.Process()
listening = [c.laddr.ip for c in psutil.net_connections("inet") if c.pid == me.pid and c.status == "LISTEN"]
port = int(os.environ["MASTER_PORT"])
store = [c.laddr.ip for c in psutil.net_connections("inet")
         if c.pid == me.pid and c.status == "LISTEN" and c.laddr.port == port]
print("RESULT " + json.dumps({"sum": t.tolist(), "store": store, "listening": listening}), flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(120)
def test_rank0_store_listens_only_at_master_addr() -> None:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=100)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)
    results = [json.loads(next(x for x in o.splitlines() if x.startswith("RESULT "))[7:]) for o in outs]
    assert results[0]["sum"] == results[1]["sum"] == [3.0, 3.0, 3.0]  # the collective really ran
    assert results[0]["store"] == ["127.0.0.1"], results[0]  # rank 0 serves the store, at MASTER_ADDR only
    assert results[1]["store"] == []
    assert all(ip == "127.0.0.1" for r in results for ip in r["listening"]), results
