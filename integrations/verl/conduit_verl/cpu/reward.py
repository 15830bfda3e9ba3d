"""Rule-based reward for the arithmetic task (verl ``custom_reward_function`` file).

Exact answer: 1.0. Otherwise partial credit for digits in the right place, so a tiny random
policy gets a learning signal: 0.5 * (matching leading characters) / len(answer).
"""

from __future__ import annotations

from typing import Any


def _answer(solution_str: str) -> str:
    text = solution_str.replace("<eos>", "").replace("<pad>", "")
    return text.strip().split("\n", 1)[0].strip()


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **_kwargs: Any
) -> float:
    """Score one response against the ground-truth sum."""
    answer, truth = _answer(solution_str), str(ground_truth).strip()
    if answer == truth:
        return 1.0
    prefix = 0
    for got, want in zip(answer, truth):
        if got != want:
            break
        prefix += 1
    return 0.5 * prefix / max(len(truth), 1)
