"""``--fixed-length`` (issue 48): timing runs of equal work, every response at the length cap.

vLLM: the harness sets verl's ``actor_rollout_ref.rollout.ignore_eos``, a field of verl's rollout config
that verl's vLLM server copies into every request's ``SamplingParams`` (checked here in verl's own
source, so a verl that drops it fails this test rather than a benchmark). Paced: every drawn length at
the cap. hf: refused by name. The benchmarks forward the flag through ``verl_runs.harness_args``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from argparse import Namespace
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("conduit_verl_cpu")  # the CPU harness: pip install --no-deps -e tools/verl_cpu

from conduit_verl_cpu import run  # noqa: E402
from conduit_verl_cpu.overrides import CPURunSpec, cpu_overrides  # noqa: E402
from conduit_verl_cpu.pace import PaceModel  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import verl_runs  # noqa: E402

IGNORE_EOS = "actor_rollout_ref.rollout.ignore_eos=True"


def _spec(tmp_path: Path, **kw: object) -> CPURunSpec:
    return CPURunSpec(tmp_path, tmp_path / "t", tmp_path / "v", tmp_path, max_response_length=16, **kw)


def test_fixed_length_on_vllm_is_verls_ignore_eos(tmp_path: Path) -> None:
    vllm = _spec(tmp_path, rollout="vllm")
    assert IGNORE_EOS not in cpu_overrides(vllm)  # off unless asked for
    assert IGNORE_EOS in cpu_overrides(dataclasses.replace(vllm, fixed_length=True))


def test_verl_reads_ignore_eos_from_the_rollout_config_into_vllms_sampling_params() -> None:
    from omegaconf import OmegaConf
    from verl.workers.config.rollout import RolloutConfig

    root = Path(importlib.util.find_spec("verl").origin).parent  # type: ignore[union-attr, arg-type]
    # a key of verl's config (the override needs no "+"), with a field of its own in RolloutConfig
    config = OmegaConf.load(root / "trainer/config/_generated_ppo_trainer.yaml")
    assert OmegaConf.select(config, "actor_rollout_ref.rollout.ignore_eos") is False
    assert "ignore_eos" in {f.name for f in dataclasses.fields(RolloutConfig)}
    # verl's vLLM server: every request's SamplingParams gets it from that config
    server = (root / "workers/rollout/vllm_rollout/vllm_async_server.py").read_text()
    assert re.search(r'sampling_params\.setdefault\("ignore_eos", self\.config\.get\("ignore_eos"', server)
    assert "SamplingParams(max_tokens=max_tokens, **sampling_params)" in server


def test_fixed_length_on_the_paced_rollout_draws_every_length_at_the_cap() -> None:
    args, _ = run.parse_args(["--rollout", "paced", "--response-length", "48", "--fixed-length"])
    pace = dict(args.pace)
    assert pace["median_len"] == 48 and pace["tail"] == 1.0  # --pace-median / --pace-tail overridden
    model = PaceModel(max_len=48, **{k: v for k, v in pace.items() if k != "wave"})  # type: ignore[arg-type]
    assert {model.draw_length(seed, seed // 4) for seed in range(200)} == {48}
    plain, _ = run.parse_args(["--rollout", "paced", "--response-length", "48"])
    assert dict(plain.pace)["tail"] == 4.0


def test_fixed_length_is_refused_where_it_cannot_apply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        run.parse_args(["--fixed-length"])  # the hf rollout
    assert "--fixed-length needs --rollout vllm" in capsys.readouterr().err
    with pytest.raises(ValueError, match="hf rollout stops at EOS"):
        cpu_overrides(_spec(tmp_path, fixed_length=True))
    # a paced spec whose lengths still vary is not fixed-length
    varied = _spec(tmp_path, fixed_length=True, pace=(("median_len", 8), ("tail", 4.0)))
    with pytest.raises(ValueError, match="median_len >= 16 and tail 1"):
        cpu_overrides(varied)
    fixed = dataclasses.replace(varied, pace=(("median_len", 16), ("tail", 1.0)))
    assert IGNORE_EOS not in cpu_overrides(fixed)  # the pace model does it, not verl


def _bench_args(rollout: str, fixed: bool) -> Namespace:
    return Namespace(
        batch_size=None,
        n=None,
        rollout=rollout,
        response_length=16,
        pace_median=8,
        core_split="0:1",
        fixed_length=fixed,
    )


def test_the_benchmarks_forward_fixed_length_to_the_harness() -> None:
    assert "--fixed-length" in verl_runs.harness_args(_bench_args("vllm", True))
    assert "--fixed-length" in verl_runs.harness_args(_bench_args("paced", True), 4.0, 1.0)
    assert "--fixed-length" not in verl_runs.harness_args(_bench_args("vllm", False))
    with pytest.raises(SystemExit, match="--fixed-length applies to --rollout vllm or paced"):
        verl_runs.harness_args(_bench_args("hf", True))
    p = __import__("argparse").ArgumentParser()
    verl_runs.add_run_flags(p, timeout=1)
    assert p.parse_args(["--fixed-length"]).fixed_length is True
    assert p.parse_args([]).fixed_length is False
