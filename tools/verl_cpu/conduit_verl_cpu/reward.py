"""Rule-based reward for the arithmetic task (a verl ``custom_reward_function`` file).

Exact answer: 1.0. Otherwise dense partial credit so a tiny random policy gets a learning signal:
0.2 × (share of the first ``len(answer)`` characters that are digits)
+ 0.3 × (share of the answer's leading characters that are right).
"""

from __future__ import annotations

from typing import Any


def _answer(solution_str: str) -> str:
    text = solution_str.replace("<eos>", "").replace("<pad>", "")
    return text.strip().split("\n", 1)[0].strip()


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **_kwargs: Any
) -> float:
    """Score one response against the ground-truth sum (in [0, 1])."""
    answer, truth = _answer(solution_str), str(ground_truth).strip()
    if answer == truth:
        return 1.0
    width = max(len(truth), 1)
    digits = sum(ch.isdigit() for ch in answer[:width]) / width
    prefix = 0
    for got, want in zip(answer, truth):
        if got != want:
            break
        prefix += 1
    return 0.2 * digits + 0.3 * prefix / width
