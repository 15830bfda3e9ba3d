"""Build a tiny Qwen2 causal LM + tokenizer from a config and save them as a HF model directory."""

from __future__ import annotations

from pathlib import Path

import torch

from conduit_verl_cpu.tokenizer import build_tokenizer


def build_model_dir(
    out_dir: str | Path, seed: int = 0, hidden: int = 64, layers: int = 2, max_positions: int = 256
) -> Path:
    """Write config, weights (float32, seeded init) and tokenizer to ``out_dir``; return it.

    ``max_positions``: prompt + response tokens the model must take (its rotary embedding does not
    depend on it, so the weights are the same for any value)."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)  # float32 is the default dtype
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
