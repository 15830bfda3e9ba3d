"""Rate limiting: minimum size before sampling and a samples-per-insert ratio with a tolerance.

The limiter only *decides*; the buffer waits on its condition variable (block mode) or raises
(error mode). With ``samples_per_insert = r`` and tolerance ``t`` (in sampled items), a sample of
``n`` items may proceed while ``sampled + n <= r * inserted + t``, and an insert of ``m`` items while
``r * (inserted + m) - sampled <= t + r * m_min`` — i.e. neither side may run further ahead of the
other than the tolerance allows (Reverb's SampleToInsertRatio).
"""

from __future__ import annotations

from conduit.config import RateLimit


class RateLimiter:
    """Decides whether a sample or an insert may proceed now, and how a refusal is handled."""

    def __init__(self, config: RateLimit | None = None) -> None:
        self.config = config or RateLimit()

    def sample_blocker(self, n: int, inserted: int, sampled: int) -> str | None:
        """Why a sample of ``n`` cannot run now, or None if it can (the sampler adds its own reasons)."""
        cfg = self.config
        if inserted < cfg.min_size:
            return f"min_size={cfg.min_size} not reached ({inserted} items inserted)"
        if cfg.samples_per_insert is not None:
            allowed = cfg.samples_per_insert * inserted + cfg.tolerance
            if sampled + n > allowed:
                return (
                    f"samples_per_insert={cfg.samples_per_insert}: sampling {n} more would reach {sampled + n} "
                    f"sampled items for {inserted} inserted (allowed {allowed:g} with tolerance {cfg.tolerance:g})"
                )
        return None

    def insert_blocker(self, m: int, inserted: int, sampled: int) -> str | None:
        """Why an insert of ``m`` items cannot run now, or None if it can."""
        cfg = self.config
        if cfg.samples_per_insert is None or inserted + m <= cfg.min_size:
            return None
        ahead = cfg.samples_per_insert * (inserted + m) - sampled
        slack = cfg.tolerance + cfg.samples_per_insert * max(m, cfg.min_size)
        if ahead > slack:
            return (
                f"samples_per_insert={cfg.samples_per_insert}: inserting {m} more would put inserts "
                f"{ahead:g} sampled-items ahead of sampling (tolerance {slack:g})"
            )
        return None
