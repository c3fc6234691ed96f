"""Reading past the training length (notebook 12): perplexity by input length, loss by
position, and the RoPE-scaling variants of a trained RoPE model.

A model trained on windows of ``T`` tokens meets positions ``>= T`` for the first time when
it reads a longer input.  ``extend(model, length, scaling)`` is the same model (same weights)
with a position table reaching ``length``, optionally with RoPE scaled (``rope_variants``:
position interpolation, NTK-aware, YaRN; ``minimind_lib.model.positions.rope_frequencies``).
``perplexity_by_length`` scores one held-out token stream cut into non-overlapping windows
of each length, so every length is scored on the same text (the protocol of Press et al.
2022, ALiBi, section 4); ``loss_by_position`` shows *where* in a long window the loss rises.

>>> from minimind_lib.model.config import MiniMindConfig
>>> from minimind_lib.model.decoder import MiniMindForCausalLM
>>> model = MiniMindForCausalLM(MiniMindConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1,
...     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8))
>>> longer = extend(model, 32, rope_variants(8, 32)["RoPE + YaRN"])
>>> longer.config.max_position_embeddings, longer.config.rope_scaling["factor"]
(32, 4.0)
>>> ppl = perplexity_by_length(model, torch.randint(0, 32, (64,)), [4, 8])
>>> sorted(ppl), all(20 < p < 45 for p in ppl.values())   # untrained: about the vocab size
([4, 8], True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor

from minimind_lib.model.config import ROPE_SCALING_DEFAULTS
from minimind_lib.model.decoder import MiniMindForCausalLM


def extend(model: MiniMindForCausalLM, max_positions: int,
           rope_scaling: dict | None = None) -> MiniMindForCausalLM:
    """A copy of ``model`` (same weights, eval mode) that reads up to ``max_positions``
    tokens, with ``rope_scaling`` in place of the model's own (RoPE models only)."""
    config = replace(model.config, max_position_embeddings=max_positions,
                     rope_scaling=rope_scaling)
    weight = model.lm_head.weight
    longer = MiniMindForCausalLM(config).to(device=weight.device, dtype=weight.dtype)
    longer.load_state_dict(model.state_dict(), strict=True)
    return longer.eval()


def rope_variants(train_len: int, length: int) -> dict[str, dict | None]:
    """The RoPE scalings notebook 12 compares for a model trained on ``train_len`` tokens
    reading ``length``: none, PI, NTK-aware and YaRN (MiniMind's betas and attention factor
    1.0), each with ``factor = length / train_len`` (no scaling up to ``train_len``).

    >>> rope_variants(256, 1024)["RoPE + PI"]
    {'type': 'linear', 'factor': 4.0, 'original_max_position_embeddings': 256}
    """
    base = {"factor": length / train_len, "original_max_position_embeddings": train_len}
    yarn = {k: v for k, v in ROPE_SCALING_DEFAULTS["yarn"].items() if k not in base}
    return {"RoPE": None, "RoPE + PI": {"type": "linear", **base},
            "RoPE + NTK": {"type": "ntk", **base}, "RoPE + YaRN": {"type": "yarn", **base, **yarn}}


@torch.no_grad()
def window_losses(model: MiniMindForCausalLM, tokens: Tensor, length: int,
                  batch_size: int = 4) -> Tensor:
    """Next-token losses of ``tokens`` (N,) cut into ``N // length`` non-overlapping windows:
    (windows, length - 1), entry ``[w, t]`` the loss of predicting token t+1 of window w from
    tokens 0..t of it.  fp32, eval mode."""
    n_windows = tokens.numel() // length
    if n_windows == 0:
        raise ValueError(f"{tokens.numel()} tokens do not fill one window of {length}")
    was_training = model.training
    model.eval()
    device = model.lm_head.weight.device
    windows = tokens[:n_windows * length].view(n_windows, length).to(device)  # (W, L)
    losses = []
    for batch in windows.split(batch_size):
        logits = model(batch).logits[:, :-1].float()  # (b, L-1, V)
        losses.append(F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none"))
    model.train(was_training)
    return torch.cat(losses).cpu()  # (W, L-1)


def perplexity_by_length(model: MiniMindForCausalLM, tokens: Tensor, lengths: Sequence[int],
                         batch_size: int = 4) -> dict[int, float]:
    """``exp(mean next-token loss)`` of ``tokens`` cut into windows of each length; the stream
    is first trimmed to a multiple of the longest length, so every length reads the same text."""
    usable = tokens.numel() // max(lengths) * max(lengths)
    if usable == 0:
        raise ValueError(f"{tokens.numel()} tokens do not fill one window of {max(lengths)}")
    return {length: window_losses(model, tokens[:usable], length, batch_size).mean().exp().item()
            for length in lengths}


def loss_by_position(model: MiniMindForCausalLM, tokens: Tensor, length: int, bucket: int,
                     batch_size: int = 4) -> Tensor:
    """Mean next-token loss in consecutive position buckets of windows of ``length``:
    ((length - 1) // bucket,), entry i the positions ``i*bucket .. (i+1)*bucket - 1``."""
    losses = window_losses(model, tokens, length, batch_size).mean(dim=0)  # (L-1,)
    n = (length - 1) // bucket
    return losses[:n * bucket].view(n, bucket).mean(dim=1)
