"""The paced rollout's sampler is batch-invariant: a request's tokens and log-probs are bit for bit the
same alone as in a batch with other requests of other prompt and response lengths, in any order.

Log-probs are compared exactly, not only tokens: equal logits give equal tokens for every seed, whereas
a run that happens to draw no near-tie would pass a tokens-only check with batch-dependent logits (they
differed by ~1e-6 before ``batch_sampler`` computed rows independently, and flipped no token in 64
requests). A few seconds on one core; no Ray, no verl.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("conduit_verl_cpu")  # the CPU harness: pip install --no-deps -e tools/verl_cpu
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conduit_verl_cpu.batch_sampler import Request, row_invariant_linears, sample_batch  # noqa: E402

EOS, PAD, CAP, WIDTH = 1, 0, 48, 32


@pytest.fixture(scope="module")
def model(tmp_path_factory):  # noqa: ANN001, ANN201
    from conduit_verl_cpu.model import build_model_dir
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)  # as the server runs (HFGenerationServer: num_threads=1)
    path = build_model_dir(tmp_path_factory.mktemp("paced_model") / "m")
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


def _requests(n: int) -> list[Request]:
    rng = random.Random(7)
    return [
        Request([rng.randrange(3, 70) for _ in range(rng.randint(4, WIDTH))], rng.randint(2, CAP), 1000 + i)
        for i in range(n)
    ]


def _run(model, batch: list[Request]) -> list[tuple[list[int], list[float]]]:  # noqa: ANN001
    got: dict[int, tuple[list[int], list[float]]] = {}
    sample_batch(model, batch, 1.0, EOS, PAD, CAP, lambda i, t, lp: got.__setitem__(i, (t, lp)), width=WIDTH)
    return [got[i] for i in range(len(batch))]


def test_a_request_gets_the_same_tokens_and_log_probs_alone_and_in_any_batch(model) -> None:  # noqa: ANN001
    reqs = _requests(24)
    alone = [_run(model, [r])[0] for r in reqs]
    assert all(len(tokens) == r.length for (tokens, _), r in zip(alone, reqs))
    full = _run(model, reqs)
    assert full == alone  # tokens and log-probs, bit for bit
    rng = random.Random(3)
    for size in (2, 3, 5, 11):  # small batches take other BLAS kernels in a plain forward
        idx = rng.sample(range(len(reqs)), size)
        assert _run(model, [reqs[i] for i in idx]) == [alone[i] for i in idx], idx
    assert _run(model, reqs[::-1]) == alone[::-1]


def test_linears_are_restored_and_row_results_match_a_plain_forward_to_rounding(model) -> None:  # noqa: ANN001
    x = torch.randn(5, 7, model.config.hidden_size)
    plain = model.model.layers[0].mlp(x)
    with row_invariant_linears(model):
        rows = model.model.layers[0].mlp(x)
        one = model.model.layers[0].mlp(x[2:3])
    assert torch.equal(rows[2:3], one)
    assert torch.allclose(rows, plain, rtol=1e-5, atol=1e-6)
    assert all("forward" not in vars(m) for m in model.modules())
