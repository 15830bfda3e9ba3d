"""GRPO with verl 0.9.1's real V1 trainer on a CPU-only machine, in one command.

    python recipes/verl_grpo_cpu.py --steps 20 [--trainer-mode sync|conduit] [--seed 0] [hydra overrides]
        [--tq-backend conduit|simple] [--tq-placement old_log_probs=host,...]

Builds a tiny Qwen2 (hidden 64, 2 layers), a char-level tokenizer and an addition task in a work dir,
then runs ``verl.trainer.main_ppo`` (TaskRunnerV1, TransferQueue, agent loop, FSDP2 on gloo, rollout
"hf" that receives the actor's weights every step). Metrics: ``<work-dir>/metrics.jsonl``.
TransferQueue's storage is Conduit's backend in ``conduit`` mode and verl's SimpleStorage in verl's
modes unless ``--tq-backend`` says otherwise; ``<work-dir>/summary.json`` records which one ran.
See ``integrations/verl/NOTES.md`` for what CPU mode changes and why.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from conduit_verl_cpu.run import main
except ImportError:  # not installed (`pip install --no-deps -e tools/verl_cpu`): use the checkout's copy
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "verl_cpu"))
    from conduit_verl_cpu.run import main

if __name__ == "__main__":
    sys.exit(main())
