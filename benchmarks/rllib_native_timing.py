"""Per-iteration timing of RLlib's native experience path (kept in ``conduit_rllib.timing``).

Experience path = replay-buffer add + sample + priority update + learner connector + minibatch
iteration. Re-exported here for the benchmarks.
"""

from conduit_rllib.timing import PathTimer, install, timed_train

__all__ = ["PathTimer", "install", "timed_train"]
