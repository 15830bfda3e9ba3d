"""A benchmark peer in its own subprocess, driven one JSON line at a time (standard library only).

Driver side, :class:`Child`: the command runs in its own session (killing the session ends what the
child started), its stderr goes to a log file, and :meth:`Child.call` writes one JSON line and waits,
with a timeout, for the next line the child writes. Child side, :func:`serve`: the original stdout
carries the protocol only (everything else printed there goes to stderr, the log), one reply per
request until ``{"cmd": "exit"}``; a request that raises is answered ``{"error", "traceback"}``.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

Reply = Callable[[dict[str, Any]], None]


class Child:
    """One subprocess peer: ``call`` sends a request and returns its reply."""

    def __init__(self, name: str, cmd: list[str], log_path: Path, env: dict[str, str], cwd: Path) -> None:
        self.name, self.log_path = name, log_path
        self.log = open(log_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, env=env, cwd=str(cwd), start_new_session=True)  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def receive(self, timeout: float) -> dict[str, Any]:
        """The child's next JSON line; TimeoutError if none comes in time, RuntimeError if it exited."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{self.name} worker did not answer within {timeout:.0f}s") from None
        if line is None:
            raise RuntimeError(f"{self.name} worker exited (rc {self.proc.poll()}); log: {self.log_path}")
        return json.loads(line)

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def call(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.send(msg)  # OSError (a broken pipe) where the child has gone
        return self.receive(timeout)

    def close(self, wait_s: float = 90) -> None:
        """Ask the child to exit, wait up to ``wait_s``, then end its session."""
        if self.proc.poll() is None:
            try:
                self.send({"cmd": "exit"})
                self.proc.wait(timeout=wait_s)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def kill(self) -> None:
        """End the child's session (SIGTERM, then SIGKILL) and close its log."""
        if self.proc.poll() is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.proc.pid, sig)  # the child's own session: it and what it started
                    self.proc.wait(timeout=20)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
        self.log.close()


def failure(e: BaseException) -> dict[str, Any]:
    """The reply to a request that raised ``e``."""
    return {"error": f"{type(e).__name__}: {e}"[:2000], "traceback": traceback.format_exc()[-6000:]}


def protocol_reply() -> Reply:
    """Keep this process's stdout for the protocol; from now on what is printed there goes to stderr."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def reply(obj: dict[str, Any]) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    return reply


def serve(reply: Reply, handle: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Answer each request on stdin with ``handle(request)`` until ``{"cmd": "exit"}`` or end of input."""
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "exit":
            break
        try:
            reply(handle(msg))
        except BaseException as e:  # noqa: BLE001 — the driver records it and carries on
            reply(failure(e))
