"""Discovery: this machine's memory tiers, their free capacity, and every link measured by a short calibration.

Capacities come from the OS (``/proc/meminfo``, ``statvfs``) and CUDA; each link's bandwidth and latency
from timed torch copies (a small copy for the latency, a large one past the CPU caches for the
bandwidth), cached as JSON per machine fingerprint so a second call does not measure again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from conduit.errors import ConfigError
from conduit.topology import Link, Tier, Topology

log = logging.getLogger(__name__)

HOST_HEADROOM_FRACTION = 0.10  # of MemTotal, left to the process and the OS when reporting host capacity
# The large copy of a calibration rep: memory tiers copy 64 MiB, more than a server CPU's last-level cache
# (a 4 MiB copy stays in L3 and reads several times DRAM bandwidth); pairs with disk copy 8 MiB.
CALIBRATION_BYTES, DISK_CALIBRATION_BYTES = 64 << 20, 8 << 20
SMALL_BYTES = 4096  # the small copy whose time is the link's latency
MIN_REPS, MAX_REPS = 3, 7


def _meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes (empty where there is none)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out[key] = int(parts[0]) * (1024 if parts[-1] == "kB" else 1)
    except OSError:
        pass
    return out


def _free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _discover_tiers(node: str = "node0") -> tuple[Tier, ...]:
    mem = _meminfo()
    total = mem.get("MemTotal") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    host = max(0, mem.get("MemAvailable", total) - int(HOST_HEADROOM_FRACTION * total))
    tiers: list[Tier] = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            free, _total = torch.cuda.mem_get_info(i)
            tiers.append(Tier(f"{node}/cuda:{i}", "hbm", node, int(free), device=f"cuda:{i}"))
        tiers.append(Tier(f"{node}/pinned", "pinned", node, host))  # page-locked host memory: same DRAM
    tiers.append(Tier(f"{node}/host", "host", node, host))
    if os.path.isdir("/dev/shm"):  # tmpfs pages are host DRAM too: never more than host can give
        tiers.append(Tier(f"{node}/shm", "shm", node, min(_free_bytes("/dev/shm"), host)))
    tiers.append(Tier(f"{node}/disk", "disk", node, _free_bytes(tempfile.gettempdir())))
    return tuple(tiers)


class _Buffer:
    """A calibration buffer on one tier. A disk buffer is a file; reading it first drops the file from
    the page cache (so reads come from the device) and writing it ends with fsync."""

    def __init__(self, tier: Tier, nbytes: int, path: str) -> None:
        self.tier, self.nbytes, self.path = tier, nbytes, path
        self.data: torch.Tensor | None = None
        if tier.kind == "disk":
            torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8).fill_(1)
            self.flush()
        elif tier.kind == "hbm":
            self.data = torch.ones(nbytes, dtype=torch.uint8, device=tier.device)
        else:
            self.data = torch.ones(nbytes, dtype=torch.uint8)
            if tier.kind == "pinned":
                self.data = self.data.pin_memory()
            elif tier.kind == "shm":
                self.data.share_memory_()

    def tensor(self, for_read: bool) -> torch.Tensor:
        if self.tier.kind == "disk":
            self.data = None  # unmap, so the pages can be dropped
            if for_read and hasattr(os, "posix_fadvise"):
                fd = os.open(self.path, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
            self.data = torch.from_file(self.path, shared=True, size=self.nbytes, dtype=torch.uint8)
        assert self.data is not None
        return self.data

    def flush(self) -> None:
        """Wait until what was written here has landed (disk: on the device)."""
        if self.tier.kind == "disk":
            fd = os.open(self.path, os.O_RDWR)
            os.fsync(fd)
            os.close(fd)
        self.sync()

    def sync(self) -> None:
        if self.tier.kind == "hbm":
            torch.cuda.synchronize(self.tier.device)


def _time_copy(src: _Buffer, dst: _Buffer, nbytes: int) -> float:
    s, d = src.tensor(for_read=True), dst.tensor(for_read=False)
    src.sync()
    dst.sync()
    t0 = time.perf_counter()
    d[:nbytes].copy_(s[:nbytes])
    dst.flush()
    src.sync()
    return time.perf_counter() - t0


def _reps(src: _Buffer, dst: _Buffer, nbytes: int, start: float, budget: float) -> list[float]:
    """Times of one copy repeated (after a warm-up: page faults, CUDA peer setup) MIN_REPS..MAX_REPS times
    within ``budget`` seconds from ``start`` (at least one; at most 3x budget)."""
    _time_copy(src, dst, nbytes)
    times: list[float] = []
    while True:
        times.append(_time_copy(src, dst, nbytes))
        spent = time.perf_counter() - start
        if len(times) >= MAX_REPS or (len(times) >= MIN_REPS and spent >= budget) or spent >= 3 * budget:
            return times


def _calibration_bytes(a: Tier, b: Tier) -> int:
    return DISK_CALIBRATION_BYTES if "disk" in (a.kind, b.kind) else CALIBRATION_BYTES


def _calibrate(tiers: tuple[Tier, ...], seconds: float) -> tuple[Link, ...]:
    """Measure every ordered tier pair (self pairs too) within about ``seconds``: per pair, the median
    time of a small copy is the latency, and the large copy's extra time gives the bandwidth."""
    pairs = [(a, b) for a in tiers for b in tiers]
    deadline = time.perf_counter() + seconds
    links: list[Link] = []
    with tempfile.TemporaryDirectory(prefix="conduit-calibration-") as workdir:
        bufs = {
            (t.name, side): _Buffer(t, _calibration_bytes(t, t), os.path.join(workdir, f"{i}-{side}.bin"))
            for i, t in enumerate(tiers)
            for side in ("src", "dst")
        }
        for i, (a, b) in enumerate(pairs):
            budget = max(0.0, deadline - time.perf_counter()) / (len(pairs) - i)
            src, dst, n = bufs[(a.name, "src")], bufs[(b.name, "dst")], _calibration_bytes(a, b)
            start = time.perf_counter()
            # small copies first, then large ones: right after a large parallel copy, CPU worker threads
            # still spin and would inflate a small copy's time
            small = _reps(src, dst, SMALL_BYTES, start, budget / 4)
            big = _reps(src, dst, n, start, budget)
            t_small, t_big = statistics.median(small), statistics.median(big)
            # t(n) = latency + n / bandwidth through both points, unless the latency is too close to the
            # large copy's time for the difference to be more than noise
            bandwidth = (n - SMALL_BYTES) / (t_big - t_small) if t_big >= 2 * t_small else n / t_big
            links.append(Link(a.name, b.name, bandwidth / 1e9, t_small * 1e6))
    del bufs
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # hand the calibration buffers back: GPU free memory is a tier's capacity
    return tuple(links)


def _fingerprint_fields() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else []
    )
    return {
        "hostname": socket.gethostname(),
        "cpu": cpu,
        "mem_total": _meminfo().get("MemTotal", 0),
        "torch": torch.__version__,
        "gpus": gpus,
        "disk_dir": tempfile.gettempdir(),
    }


def fingerprint(fields: dict[str, Any] | None = None) -> str:
    """This machine's calibration-cache key: hostname, CPU model, total RAM, torch version, GPU names
    (and the temporary directory, where the disk tier lives)."""
    fields = _fingerprint_fields() if fields is None else fields
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def _cached_links(path: Path, tiers: tuple[Tier, ...]) -> tuple[Link, ...] | None:
    try:
        cached = Topology.from_dict(json.loads(path.read_text())["topology"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:  # ConfigError is a ValueError
        log.warning("ignoring the unreadable topology cache %s (%s); recalibrating", path, e)
        return None
    if [t.name for t in cached.tiers] != [t.name for t in tiers] or cached.missing_links():
        log.warning("topology cache %s describes other tiers than this machine has; recalibrating", path)
        return None
    return cached.links


def discover(cache_dir: str | None = None, recalibrate: bool = False, seconds: float = 3.0) -> Topology:
    """This machine's tiers (free capacity now) and links (measured, or from the cache for this
    machine's fingerprint; ``recalibrate=True`` measures again). The node is ``node0``."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise ConfigError(f"seconds must be a number > 0, got {seconds!r}")
    fields = _fingerprint_fields()
    key = fingerprint(fields)
    directory = Path(cache_dir) if cache_dir is not None else Path.home() / ".cache" / "conduit"
    path = directory / f"topology-{key}.json"
    tiers = _discover_tiers()
    where = f"this machine ({fields['hostname']})"
    if not recalibrate:
        links = _cached_links(path, tiers)
        if links is not None:
            return Topology(tiers, links, f"{where}; links from the calibration cache {path}")
    links = _calibrate(tiers, seconds)
    topo = Topology(tiers, links, f"{where}; links calibrated now, cached in {path}")
    record = {"fingerprint": key, "fields": fields, "calibrated_at": time.time(), "seconds": seconds}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**record, "topology": topo.to_dict()}, indent=1))
        os.replace(tmp, path)
    except OSError as e:
        log.warning("could not write the topology cache %s: %s", path, e)
    return topo


_LOCAL: Topology | None = None
_LOCAL_LOCK = threading.Lock()


def local_topology() -> Topology:
    """This machine's topology for planning now: links measured once per process (:func:`discover`,
    cached per machine), tiers' free capacities read again at every call (cheap: meminfo, statvfs,
    CUDA's free memory), so each new buffer plans against what earlier ones left."""
    global _LOCAL
    with _LOCAL_LOCK:
        tiers = _discover_tiers()
        if _LOCAL is None or [t.name for t in _LOCAL.tiers] != [t.name for t in tiers]:
            _LOCAL = discover()
            return _LOCAL
        return Topology(tiers, _LOCAL.links, _LOCAL.source)
