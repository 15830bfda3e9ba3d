"""The RLlib iteration benchmark measures Conduit DQN's staleness: priority age and staging delay."""

import conduit_rllib
import pytest
from benchmark_modules import cartpole_dqn, load


def test_histograms_pool_across_rows_and_json_keys():
    s = load("rllib_staleness")
    pooled = s.pooled([{0: 2, 3: 1}, None, {"3": 1, "40": 1}])  # JSON turns keys into strings
    assert pooled == {0: 2, 3: 2, 40: 1}
    assert s.pooled([None, None]) is None
    summ = s.summary(pooled)
    assert summ == {"median": 3, "p90": 40, "max": 40, "n": 5}
    assert s.summary(None) is None and s.summary({}) is None


def test_iteration_summary_and_table_carry_conduits_staleness():
    it = load("rllib_iteration")
    key = {"algo": "dqn", "env": "CartPole-v1", "train_batch_size": 32}
    work = {"env_steps_sampled": 200, "gradient_updates": 200, "module_steps_trained": 6400}
    rows = [
        {"system": "native", "wall_s": 2.0, "exposed_s": 0.5, **work, **key},
        {
            "system": "conduit",
            "wall_s": 1.0,
            "exposed_s": 0.05,
            **work,
            **key,
            "priority_age_hist": {"0": 10, "31": 5, "47": 1},
            "staging_delay_hist": {"0": 4, "32": 12},
        },
    ]
    rat = it.ratios(rows)["dqn CartPole-v1 b32"]
    assert rat["ratio_wall"] == pytest.approx(0.5)
    assert rat["conduit_priority_age_updates"]["max"] == 47
    assert rat["conduit_staging_delay_transitions"]["median"] == 32
    text = "\n".join(load("report_tables").rllib_iteration({"ratios": {"dqn CartPole-v1 b32": rat}}))
    assert "0 / 31 / 47" in text and "32 / 32 / 32" in text and "200 / 200" in text


def _dqn(overlap):
    cfg = cartpole_dqn(batch=32, learning_starts=64, steps=200)
    return conduit_rllib.enable(cfg, overlap=overlap).build_algo()


@pytest.mark.ray
def test_probe_sees_no_staleness_in_sync_mode_and_bounded_staleness_in_async(ray_local):
    s = load("rllib_staleness")
    out = {}
    for overlap in ("sync", "async"):
        algo = _dqn(overlap)
        try:
            probe = s.StalenessProbe(algo)
            algo.train()
            algo.train()
            out[overlap] = probe.take()
            stage = algo.conduit_path.stage_steps
        finally:
            algo.stop()
    age, delay = out["sync"]
    assert set(age) == {0} and set(delay) == {0}  # as native RLlib: every sample sees everything
    age, delay = out["async"]
    assert sum(age.values()) == sum(delay.values()) > 100  # one entry per train batch
    assert max(age) > 0 and max(delay) > 0  # async: priorities queued, steps staged
    assert max(delay) <= stage  # never more than one stage behind
    assert max(age) < 3 * stage  # queued sends (one stage) plus deliveries prepared ahead
