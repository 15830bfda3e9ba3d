"""Conduit's CPU mode for verl 0.9.1: run the real V1 GRPO trainer without an accelerator.

``python -m conduit_verl.cpu.run --help``. The process-wide fixes live in :mod:`.patches`.
"""
