"""Conduit's CPU harness for verl 0.9.1: run the real V1 trainer without an accelerator.

A test and benchmark tool, installed apart from ``conduit-rl`` (``pip install --no-deps -e
tools/verl_cpu``): a CPU platform, a ``transformers`` rollout server, a tiny Qwen2 built from a
config, a tokenizer built in code, an arithmetic task and reward, and the launcher
``python -m conduit_verl_cpu.run --help``. Its ``verl.plugins`` entry point (``plugin.py``) applies
the process-wide fixes (:mod:`.patches`) in every verl process when ``CONDUIT_VERL_CPU=1``.
"""
