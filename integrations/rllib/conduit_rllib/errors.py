"""Errors of the RLlib plugin: each names what RLlib asked for that Conduit cannot do."""

from __future__ import annotations

from conduit.errors import ConduitError


class RLlibIntegrationError(ConduitError):
    """Base class of every error the RLlib plugin raises on purpose."""


class UnsupportedAlgorithmError(RLlibIntegrationError):
    """The config belongs to an algorithm the plugin does not route through Conduit."""


class OldAPIStackError(RLlibIntegrationError):
    """The config runs on RLlib's old API stack (RolloutWorker/Policy); only the new stack is supported."""


class UnsupportedSpaceError(RLlibIntegrationError):
    """An observation or action space that Conduit cannot store as fixed-shape columns."""


class ActionFormatError(RLlibIntegrationError):
    """Actions, log-probabilities or action-distribution inputs that do not fit the module's action space
    or PPO's loss (the message names the module, the column, what it holds and what was expected)."""


class ReplayConfigError(RLlibIntegrationError):
    """A replay or training setting the Conduit path cannot honour (the message names the key)."""


class RLlibVersionError(RLlibIntegrationError):
    """The installed RLlib lacks something conduit_rllib relies on (the message names it and the version)."""


class FrameFormatError(RLlibIntegrationError):
    """A frame that frame-once storage cannot store exactly (wrong dtype, shape or values; the message says)."""


class FramesEvictedError(RLlibIntegrationError):
    """A sampled transition's frame was overwritten in the frame store (its capacity is too small)."""


class FrameStoreError(RLlibIntegrationError):
    """The frame store failed to store frames whose references were already handed out (async ingestion):
    the message names the module, the frames and the cause; its transitions are refused from then on."""
