"""Everything the project starts listens on loopback only.

Ray 2.60 turns ``ray.init(_node_ip_address="127.0.0.1")`` into the machine's routable address
(``ray._private.services.resolve_ip_for_localhost``), so with our usual settings alone its gRPC
servers (GCS, raylet, every worker) listen on all interfaces and its agents on the routable
address; TransferQueue's ZMQ and metrics sockets follow Ray's node address. With
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` in the environment before Ray is imported, Ray takes
127.0.0.1 as the node address and binds every server there (the verl CPU launcher sets it, and binds
torch's TCPStore in verl's FSDP worker to MASTER_ADDR: ``conduit_verl_cpu.patches.rendezvous_store``). Each case runs in a fresh process
(the setting is read when Ray is imported) and lists the listening sockets of its whole process
tree with psutil.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

psutil = pytest.importorskip("psutil")
pytest.importorskip("ray")

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}

CHILD = r"""
import json, os, sys
import psutil, ray

if os.environ.get("LOOPBACK_VIA_HELPER") == "1":  # what our recipes and benchmarks call
    from conduit_rllib.local_ray import init_local_ray
    init_local_ray(log_to_driver=False)
else:
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
started = ["ray"]
try:  # what the verl side starts on top: TransferQueue with Conduit's storage, the completion channel
    import conduit_verl.tq_store as tq_store
    import torch
    import transfer_queue as tq
    from conduit_verl.completion import CompletionChannel
    from omegaconf import OmegaConf
    from tensordict import TensorDict

    tq_store.register()
    tq.init(OmegaConf.create({"controller": {"polling_mode": True},
                              "backend": {"storage_backend": "Conduit", "Conduit": {"timeout_s": 5}}}))
    tq.kv_batch_put(keys=["a"], partition_id="train", fields=TensorDict({"x": torch.ones(1, 2)}, [1]))
    assert tq.kv_batch_get(keys=["a"], partition_id="train")["x"].sum() == 2
    channel = CompletionChannel.remote()
    ray.get(channel.finished.remote("train"))
    started += ["transfer_queue", "conduit_storage", "completion_channel"]
except ImportError:
    pass
pid = ray.remote(lambda: os.getpid())
ray.get([pid.remote() for _ in range(2)])
me = psutil.Process()
tree = {p.pid: p.name() for p in [me, *me.children(recursive=True)]}
listening = [(c.laddr.ip, c.laddr.port, tree[c.pid]) for c in psutil.net_connections(kind="inet")
             if c.status == psutil.CONN_LISTEN and c.pid in tree]
print("RESULT " + json.dumps({"started": started, "listening": listening}), flush=True)
"""


def is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def listening_sockets(env: dict[str, str]) -> tuple[list[str], list[tuple[str, int, str]]]:
    """(what was started, the (ip, port, process) listening) in a fresh process started with ``env``."""
    base = {k: v for k, v in os.environ.items() if k not in LOOPBACK_ENV}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300, env={**base, **env}
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout + proc.stderr)[-4000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    return result["started"], [tuple(x) for x in result["listening"]]


def test_is_loopback() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "::1", "::ffff:127.0.0.1"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "192.0.2.2", "::ffff:192.0.2.2"]))


@pytest.mark.ray
@pytest.mark.timeout(400)
@pytest.mark.slow  # ~30 s each (a fresh Ray); fast counterpart: the same listing on the tests' shared Ray,
# which init_local_ray starts (tests/integrations/verl/test_tq_store_ray.py)
@pytest.mark.parametrize("how", ["env", "init_local_ray"])
def test_ray_and_what_we_start_on_it_listen_on_loopback_only(how: str) -> None:
    # env: the setting in the environment (the verl CPU launcher); init_local_ray: nothing preset,
    # conduit_rllib.local_ray.init_local_ray (the RLlib recipes and benchmarks) applies it after importing ray
    env = LOOPBACK_ENV if how == "env" else {"LOOPBACK_VIA_HELPER": "1"}
    started, listening = listening_sockets(env)
    assert len(listening) >= 3, listening  # GCS, raylet, workers at least: the listing works
    exposed = [sock for sock in listening if not is_loopback(sock[0])]
    assert not exposed, f"listening beyond loopback (started: {started}): {exposed}"


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_without_the_setting_ray_listens_on_all_interfaces() -> None:
    """Why the setting exists: if this fails, Ray honours ``_node_ip_address`` and it can go."""
    _, listening = listening_sockets({})
    assert any(not is_loopback(ip) for ip, _, _ in listening), listening


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_verl_cpu_harness_listens_on_loopback_only(tmp_path: Path) -> None:
    """A real verl CPU run (sync mode, one step), its process tree's listening sockets sampled
    every 2 s while it runs; the launcher must apply the loopback setting itself. Ray, TransferQueue,
    Conduit and torch's TCPStore in verl's worker stay on loopback."""
    pytest.importorskip("conduit_verl_cpu")
    base = {k: v for k, v in os.environ.items() if k not in LOOPBACK_ENV}
    cmd = [sys.executable, "-m", "conduit_verl_cpu.run", "--steps", "1", "--work-dir", str(tmp_path / "run")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=base)
    seen: set[tuple[str, int, str]] = set()

    def sample() -> None:
        while proc.poll() is None:
            try:
                root = psutil.Process(proc.pid)
                tree = {p.pid: p.name() for p in [root, *root.children(recursive=True)]}
                for c in psutil.net_connections(kind="inet"):
                    if c.status == psutil.CONN_LISTEN and c.pid in tree:
                        seen.add((c.laddr.ip, c.laddr.port, tree[c.pid]))
            except psutil.Error:
                pass
            time.sleep(2.0)

    sampler = threading.Thread(target=sample)
    sampler.start()
    out, _ = proc.communicate(timeout=840)
    sampler.join()
    assert proc.returncode == 0, out[-4000:]
    assert len(seen) >= 3, seen
    exposed = sorted(sock for sock in seen if not is_loopback(sock[0]))
    # torch.distributed's TCPStore (the gloo rendezvous at MASTER_PORT of verl's FSDP worker) listened
    # on the wildcard address; the harness's init_process_group patch binds it to MASTER_ADDR
    assert not exposed, f"the harness listened beyond loopback: {exposed}"


LAUNCHER_CHILD = r"""
import sys
import conduit_verl_cpu.run as run
run.parse_args(["--rollout", "vllm", "--core-split", "0:1", "--steps", "1"])
print("RAY_IMPORTED", "ray" in sys.modules)
import ray._private.ray_constants as rc
print("RESULT", rc.ENABLE_RAY_CLUSTER)
"""


def test_the_verl_launcher_sets_loopback_before_anything_imports_ray() -> None:
    """The fast counterpart of the run above. Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once, at
    import; parsing ``--core-split`` imports TransferQueue and with it Ray, so the launcher must set
    it when it is imported. (It was set later, in ``set_cpu_env``, and from the core split on every
    harness run's Ray bound all interfaces; the slow run above caught it.)"""
    pytest.importorskip("conduit_verl_cpu")
    pytest.importorskip("vllm")
    base = {k: v for k, v in os.environ.items() if k not in LOOPBACK_ENV}
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCHER_CHILD], capture_output=True, text=True, timeout=300, env=base
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    lines = proc.stdout.splitlines()
    assert "RAY_IMPORTED True" in lines  # the premise: parsing imports Ray
    assert "RESULT False" in lines, proc.stdout[-2000:]
