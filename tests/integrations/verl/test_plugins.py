"""The ``verl.plugins`` entry points: conduit_verl registers the trainer mode and nothing else; the
CPU harness (``tools/verl_cpu``) is its own plugin and changes nothing unless asked to."""

from __future__ import annotations

import importlib.abc
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

pytest.importorskip("verl")

from conduit_verl import plugin  # noqa: E402
from conduit_verl.errors import VerlCompatError  # noqa: E402

_LIST = "print(json.dumps(sorted(m for m in sys.modules if m.startswith('conduit'))), flush=True)"


class _Fresh:
    """Fresh interpreters, all started at once (each imports verl: ~8 s of one core; together they use
    every core). Each runs its steps in order and lists the ``conduit*`` modules loaded after each."""

    def __init__(self, cases: dict[str, tuple[list[str], dict[str, str] | None]]) -> None:
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("CONDUIT_VERL", "VERL_"))}
        self.procs = {
            name: subprocess.Popen(
                [sys.executable, "-c", "\n".join(["import json, sys", *(f"{s}\n{_LIST}" for s in steps)])],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**environ, **(env or {})},
            )
            for name, (steps, env) in cases.items()
        }
        self.done: dict[str, list[list[str]]] = {}

    def loaded(self, name: str, step: int = 0) -> list[str]:
        """The ``conduit*`` modules loaded after step ``step`` of case ``name``."""
        if name not in self.done:
            proc = self.procs[name]
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-3000:]
            self.done[name] = [json.loads(line) for line in out.splitlines() if line.startswith("[")]
        return self.done[name][step]

    def close(self) -> None:
        for proc in self.procs.values():
            proc.kill()
            proc.wait()


#: modules that may import verl first; the default run starts the trainer's own (its registration meets a
#: half-imported ``conduit_verl.trainer``), the slow run the others (each defers through compat.py alike)
_REGISTER_FIRST = ("conduit_verl.trainer",)
_REGISTER_FIRST_SLOW = ("conduit_verl.piece_writes", "conduit_verl.streaming")
_CPU_PLUGIN = ("conduit_verl_cpu.plugin", "conduit_verl_cpu.patches")


def _registers(first: str) -> tuple[list[str], None]:
    """The case: import ``first`` (which imports verl), then verl finds trainer mode "conduit"."""
    return (
        [
            f"import {first}\nfrom verl.trainer.ppo.v1 import get_trainer_cls\n"
            "assert get_trainer_cls('conduit').__name__ == 'ConduitTrainer'"
        ],
        None,
    )


@pytest.fixture(scope="module")
def fresh() -> Iterator[_Fresh]:
    """Every fresh-interpreter case of this module; a test waits for its own."""
    cases: dict[str, tuple[list[str], dict[str, str] | None]] = {
        # then TransferQueue in the same interpreter: what ``import verl`` loaded is listed before
        "verl": (
            [
                "import verl",
                "import transfer_queue\n"
                "from transfer_queue.storage.managers.base import StorageManagerFactory\n"
                "assert 'Conduit' in StorageManagerFactory._registry",
            ],
            None,
        ),
        "verl_cpu": (["import verl"], {"CONDUIT_VERL_CPU": "1"}),
    }
    runs = _Fresh({**cases, **{first: _registers(first) for first in _REGISTER_FIRST}})
    yield runs
    runs.close()


def test_import_verl_loads_no_cpu_harness_and_no_core(fresh) -> None:
    loaded = fresh.loaded("verl")
    assert "conduit_verl.plugin" in loaded
    assert not [m for m in loaded if m.startswith("conduit_verl_cpu.") and m not in _CPU_PLUGIN], loaded
    assert "conduit" not in loaded and "conduit_verl.trainer" not in loaded  # nothing heavy up front


def test_cpu_plugin_applies_only_when_asked(fresh) -> None:
    pytest.importorskip("conduit_verl_cpu")
    loaded = fresh.loaded("verl_cpu")
    assert "conduit_verl_cpu.platform" in loaded and "conduit_verl_cpu.registration" in loaded


def test_trainer_registers_when_its_own_module_imports_verl_first(fresh) -> None:
    # compat.py imports verl's trainer package, whose import hook registers the trainer, which
    # needs compat.py: the registration waits until compat.py is imported
    for first in _REGISTER_FIRST:
        assert "conduit_verl.trainer" in fresh.loaded(first), first


@pytest.mark.slow
def test_trainer_registers_whichever_other_module_imports_verl_first() -> None:
    runs = _Fresh({first: _registers(first) for first in _REGISTER_FIRST_SLOW})
    try:
        for first in _REGISTER_FIRST_SLOW:
            assert "conduit_verl.trainer" in runs.loaded(first), first
    finally:
        runs.close()


class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):  # noqa: ANN001
        if fullname == "conduit_verl.trainer":
            raise VerlCompatError("verl 0.10.0: trainer method `_step_once` not found")
        return None


def test_incompatible_verl_leaves_verl_working(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delitem(sys.modules, "conduit_verl.trainer", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_Refuse(), *sys.meta_path])
    with caplog.at_level(logging.WARNING, logger="conduit_verl.plugin"):
        plugin._register_trainer()  # logs, does not raise: verl's own trainer modes keep working
    assert "trainer mode 'conduit' is not available: verl 0.10.0: trainer method `_step_once`" in caplog.text


def test_import_transfer_queue_registers_the_backend_without_loading_it(fresh) -> None:
    loaded = fresh.loaded("verl", step=1)
    assert "conduit_verl.tq_store.registration" in loaded
    assert "conduit_verl.tq_store.backend" not in loaded and "conduit" not in loaded
