"""The batch of ``tq_backends.py``: a GRPO-shaped TensorDict (jagged token fields sharing one length per
sample, drawn uniformly in [L/2, L], and a scalar reward), its payload, and the check of what a get
returned. Shared by the driver, the workers, the cross-node client actors and ``gpu/tq_tiers_gpu.py``."""

from __future__ import annotations

from typing import Any

JAGGED_FIELDS = {
    "input_ids": "int64",
    "responses": "int64",
    "response_mask": "int64",
    "old_log_probs": "float32",
}


def make_arrays(samples: int, tokens: int, seed: int) -> dict[str, Any]:
    """Flat values per field, shared offsets, and the scalar rewards (deterministic in ``seed``)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(tokens // 2, 1), tokens + 1, (samples,), generator=g)
    offsets = torch.zeros(samples + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    total = int(offsets[-1])
    values = {
        "input_ids": torch.randint(0, 151_936, (total,), generator=g, dtype=torch.int64),
        "responses": torch.randint(0, 151_936, (total,), generator=g, dtype=torch.int64),
        "response_mask": torch.randint(0, 2, (total,), generator=g, dtype=torch.int64),
        "old_log_probs": -5.0 * torch.rand(total, generator=g, dtype=torch.float32),
    }
    return {"offsets": offsets, "values": values, "rm_scores": torch.randn(samples, generator=g)}


def payload_bytes(arrays: dict[str, Any]) -> int:
    return sum(int(v.nbytes) for v in arrays["values"].values()) + int(arrays["rm_scores"].nbytes)


def min_field_bytes(arrays: dict[str, Any]) -> int:
    return min(int(v.nbytes) for v in arrays["values"].values())


def make_batch(arrays: dict[str, Any]) -> Any:
    """The TensorDict verl would put: jagged nested tensors plus one dense scalar field."""
    import torch
    from tensordict import TensorDict

    offsets = arrays["offsets"]
    fields = {
        name: torch.nested.nested_tensor_from_jagged(v, offsets) for name, v in arrays["values"].items()
    }
    fields["rm_scores"] = arrays["rm_scores"]
    return TensorDict(fields, batch_size=[len(offsets) - 1])


def check_batch(out: Any, arrays: dict[str, Any]) -> str | None:
    """None if ``out`` (what kv_batch_get returned) holds exactly ``arrays``; else what differs."""
    import torch

    want = set(arrays["values"]) | {"rm_scores"}
    missing = want - set(out.keys())
    if missing:
        return f"missing fields {sorted(missing)}"
    for name, values in arrays["values"].items():
        got = out[name]
        if getattr(got, "is_nested", False) and got.layout == torch.jagged:
            if not torch.equal(got.offsets().to(torch.int64), arrays["offsets"]):
                return f"{name}: offsets differ"
            if not torch.equal(got.values().reshape(-1), values):
                return f"{name}: values differ"
        else:
            pieces = list(got.unbind()) if isinstance(got, torch.Tensor) else list(got)
            flat = torch.cat([torch.as_tensor(p).reshape(-1) for p in pieces])
            if not torch.equal(flat, values):
                return f"{name}: values differ ({type(got).__name__})"
    rm = out["rm_scores"]
    if getattr(rm, "is_nested", False):
        rm = torch.stack(list(rm.unbind())).reshape(-1)
    if not torch.equal(torch.as_tensor(rm).reshape(-1), arrays["rm_scores"]):
        return "rm_scores differ"
    return None


def cell_seed(samples: int, tokens: int) -> int:
    return samples * 1_000_003 + tokens
