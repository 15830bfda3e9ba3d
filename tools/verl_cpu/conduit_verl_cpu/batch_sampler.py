"""Batched sampling to fixed response lengths (the paced rollout's real token generation).

All requests of a wave go through the model together, one forward per decode step with a KV
cache (not one per token per request). Each request samples with the Gumbel-max trick from noise
drawn by its own seeded generator. EOS is held back until the request's drawn length: the response
ends with EOS at exactly that length (a length at the cap is truncated there instead, as a real
server truncates at ``max_tokens``). Log-probs are of the sampled tokens under the model's
temperature-scaled distribution without that constraint (what verl recomputes).

Batch invariance: a request's logits, and so its tokens and log-probs, are bit for bit those it
gets alone, whichever other requests share the batch, in whatever order. A plain batched forward
does not give that on CPU: a matmul's result for one row depends on how many rows the matrix has
(the BLAS picks another kernel for 1-3 rows, blocks differently for more) and attention sums over
the batch's padded width, so the same request's log-probs differ by ~1e-6 between batches, enough
to flip a near-tie between two tokens. Here every prompt is left-padded to one width fixed by the
caller (the server's prompt length: a row's attention never sees its neighbours' lengths), and
every ``nn.Linear`` computes each row as its own ``1 x K`` product (``torch.bmm`` over the rows,
:func:`row_invariant_linears`): one kernel shape whatever the batch. The rest of the model is
row-wise already (norms, softmax, rotary; attention's matmuls are per row and head). It costs
little on the tiny model (``tests/integrations/verl/test_paced_batch_invariance.py`` checks it).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Request:
    """One prompt, the response length it must reach, and its sampling seed."""

    prompt_ids: list[int]
    length: int
    seed: int


def gumbel_noise(seed: int, steps: int, vocab: int) -> torch.Tensor:
    """``[steps, vocab]`` standard Gumbel noise from a generator seeded with ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(steps, vocab, generator=gen, dtype=torch.float64).clamp_(1e-20, 1.0)
    return (-torch.log(-torch.log(u))).float()


def _row_linear(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``nn.Linear.forward`` with every row of ``x`` its own ``1 x K`` matmul: the same kernel
    shape for any number of rows, so a row's result does not depend on the others."""
    rows = x.reshape(-1, 1, x.shape[-1])
    y = torch.bmm(rows, self.weight.t().unsqueeze(0).expand(rows.shape[0], -1, -1))
    if self.bias is not None:
        y = y + self.bias
    return y.view(*x.shape[:-1], self.weight.shape[0])


@contextlib.contextmanager
def row_invariant_linears(model: torch.nn.Module) -> Iterator[None]:
    """Within the block, every ``nn.Linear`` of ``model`` computes row by row (``_row_linear``);
    the modules' own ``forward`` is back afterwards."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    for m in linears:
        m.forward = types.MethodType(_row_linear, m)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for m in linears:
            del m.forward


@torch.no_grad()
def sample_batch(
    model: Any,
    requests: list[Request],
    temperature: float,
    eos_id: int,
    pad_id: int,
    cap: int,
    on_done: Callable[[int, list[int], list[float]], None],
    width: int = 0,
) -> None:
    """Generate every request to its length; ``on_done(index, token ids, log-probs)`` as each
    one completes (shortest first: a short response is ready after its own steps, and the batch
    shrinks as responses finish). ``width``: the prompt width every prompt is left-padded to (a
    prompt longer than it widens the batch, and then that batch's requests are not guaranteed the
    tokens they would get in another batch)."""
    with row_invariant_linears(model):
        b, steps = len(requests), max(r.length for r in requests)
        width = max(width, *(len(r.prompt_ids) for r in requests))
        ids = torch.full((b, width), pad_id, dtype=torch.long)
        mask = torch.zeros((b, width), dtype=torch.long)
        for i, r in enumerate(requests):  # left padding
            ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids, dtype=torch.long)
            mask[i, width - len(r.prompt_ids) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp_(min=0)
        lengths = torch.tensor([r.length for r in requests])
        end_eos = lengths < cap  # at the cap: truncated, no EOS
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1]
        sampled = temperature > 0
        noise = torch.stack([gumbel_noise(r.seed, steps, logits.shape[-1]) for r in requests])
        rows = torch.arange(b)  # the requests still generating, in batch order
        tokens = torch.empty((b, steps), dtype=torch.long)
        logps = torch.empty((b, steps))
        for s in range(steps):
            scaled = logits.float() / (temperature if sampled else 1.0)
            logp = torch.log_softmax(scaled, dim=-1)
            score = scaled + noise[rows, s] if sampled else scaled.clone()
            score[lengths[rows] - 1 > s, eos_id] = float("-inf")  # EOS held back until the drawn length
            tok = score.argmax(-1)
            last = lengths[rows] - 1 == s
            tok = torch.where(last & end_eos[rows], torch.full_like(tok, eos_id), tok)
            tokens[rows, s], logps[rows, s] = tok, logp.gather(1, tok[:, None])[:, 0]
            for i in rows[last].tolist():
                on_done(i, tokens[i, : s + 1].tolist(), logps[i, : s + 1].tolist())
            keep = (~last).nonzero()[:, 0]
            if len(keep) == 0:
                break
            if len(keep) < len(rows):
                rows, tok, mask, pos = rows[keep], tok[keep], mask[keep], pos[keep]
                cache.batch_select_indices(keep)
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=torch.long)], dim=1)
            pos = pos[:, -1:] + 1
            out = model(
                input_ids=tok[:, None],
                attention_mask=mask,
                position_ids=pos,
                past_key_values=cache,
                use_cache=True,
            )
            cache, logits = out.past_key_values, out.logits[:, -1]
