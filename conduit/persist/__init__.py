"""Durable experience: a safe checkpoint format (no pickle), incremental checkpoints and a journal."""

from conduit.persist.checkpoint import CheckpointReport, load_checkpoint, save_checkpoint
from conduit.persist.journal import Journal, ReplayReport, replay

__all__ = ["CheckpointReport", "Journal", "ReplayReport", "load_checkpoint", "replay", "save_checkpoint"]
