"""PPO (GAE with a critic) with verl 0.9.1's real V1 trainer on a CPU-only machine, in one command.

    python recipes/verl_ppo_cpu.py --steps 20 [--trainer-mode sync|conduit] [--seed 0] [hydra overrides]
        [--tq-backend conduit|simple] [--tq-placement values=host,...]

Like ``verl_grpo_cpu.py`` plus a critic (the same tiny Qwen2 with a value head, FSDP2 on gloo):
``algorithm.adv_estimator=gae``; in ``conduit`` mode the critic's values and GAE run per streamed
piece and ``update_critic`` runs on the whole batch before the actor's mini-batches.
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
    argv = sys.argv[1:]
    sys.exit(main(argv if "--algo" in argv else ["--algo", "ppo", *argv]))
