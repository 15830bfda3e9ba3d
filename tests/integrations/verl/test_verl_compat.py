"""``conduit_verl.compat``: every seam into verl / TransferQueue exists in the installed versions.

One test per seam (``test_seam_present[...]``), so a verl release that renames or reshapes one
fails here by name; then the checker itself on fakes (a missing seam is a clear error naming it and
the verl version; another version with every seam only warns).
"""

from __future__ import annotations

import logging
import sys
import types

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

from conduit_verl import compat  # noqa: E402
from conduit_verl.compat import Seam, check_seams, seam_problem  # noqa: E402
from conduit_verl.errors import VerlCompatError, VerlIntegrationError  # noqa: E402

from conduit.errors import ConduitError  # noqa: E402


@pytest.mark.parametrize("seam", compat.SEAMS, ids=lambda s: s.what)
def test_seam_present(seam: Seam) -> None:
    assert seam_problem(seam) is None


def _cpu_seams() -> tuple[Seam, ...]:
    try:
        from conduit_verl_cpu.seams import SEAMS
    except ImportError:  # the CPU harness is not installed
        return ()
    return SEAMS


@pytest.mark.parametrize("seam", _cpu_seams(), ids=lambda s: s.what)
def test_cpu_harness_seam_present(seam: Seam) -> None:
    assert seam_problem(seam) is None


def test_installed_versions_pass_the_import_check() -> None:
    check_seams()  # what compat.py ran at import: no error


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A module ``fake_verl`` shaped like a later verl that changed things."""
    mod = types.ModuleType("fake_verl")

    class Trainer:
        def __init__(self) -> None:
            self.replay_buffer = None

        def _compute_values(self, data, metrics):  # renamed parameter
            return data

    def remote_less() -> None:
        return None

    mod.Trainer = Trainer  # type: ignore[attr-defined]
    mod.AgentLoopWorker = Trainer  # type: ignore[attr-defined]  (no longer a Ray actor class)
    mod.compute_advantage = remote_less  # type: ignore[attr-defined]
    mod.__file__ = __file__  # inspect.getsource of the module: this file
    monkeypatch.setitem(sys.modules, "fake_verl", mod)
    return mod


def test_missing_method_names_the_seam_and_version(fake: types.ModuleType) -> None:
    seam = Seam("trainer method `_compute_old_log_prob`", "fake_verl", "Trainer._compute_old_log_prob")
    with pytest.raises(VerlCompatError) as info:
        check_seams([seam], verl_version="0.10.0", tq_version="0.1.11")
    msg = str(info.value)
    assert msg.startswith("verl 0.10.0: trainer method `_compute_old_log_prob` not found")
    assert "conduit_verl supports verl 0.9.1" in msg
    assert isinstance(info.value, VerlIntegrationError) and isinstance(info.value, ConduitError)


def test_every_kind_of_change_is_reported(fake: types.ModuleType) -> None:
    seams = [
        Seam(
            "trainer method `_compute_values`",
            "fake_verl",
            "Trainer._compute_values",
            params=("batch", "metrics"),
        ),
        Seam("agent-loop actor class", "fake_verl", "AgentLoopWorker", actor=True),
        Seam("trainer attribute `use_critic`", "fake_verl", assigns="use_critic"),
        Seam(
            "GAE lookup", "fake_verl", "compute_advantage", source="core_algos.compute_gae_advantage_return("
        ),
        Seam("a module", "fake_verl_not_there"),
    ]
    problems = [seam_problem(s) for s in seams]
    assert "takes (data, metrics), conduit_verl calls it with (batch, metrics)" in str(problems[0])
    assert "no longer a Ray actor class" in str(problems[1])
    assert "sets `self.use_critic`" in str(problems[2])
    assert "no longer has `core_algos.compute_gae_advantage_return(`" in str(problems[3])
    assert "cannot be imported" in str(problems[4])
    with pytest.raises(VerlCompatError, match=r"(?s)`_compute_values`.*actor class.*use_critic.*GAE.*module"):
        check_seams(seams, verl_version="0.10.0")
    # what the fake does have passes
    assert (
        seam_problem(Seam("trainer attribute `replay_buffer`", "fake_verl", assigns="replay_buffer")) is None
    )


def test_other_version_with_every_seam_only_warns(
    fake: types.ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    seam = Seam("trainer method `_compute_values`", "fake_verl", "Trainer._compute_values")
    with caplog.at_level(logging.WARNING, logger="conduit_verl.compat"):
        check_seams([seam], verl_version="0.10.0", tq_version="0.1.11")
    assert "tested with verl 0.9.1" in caplog.text and "verl 0.10.0" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="conduit_verl.compat"):
        check_seams([seam], verl_version="0.9.1", tq_version="0.1.10")
    assert caplog.text == ""
