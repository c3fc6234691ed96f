"""Small shared pieces of the tests: a tiny model, a noisy one for the serving tests."""

from __future__ import annotations

import torch
from torch import nn

from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM

#: the tiny model's config: one layer, hidden 32, 2 heads, 1 KV head, the course vocabulary
TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            max_position_embeddings=256)


def tiny_model(seed: int = 0, **config: object) -> MiniMindForCausalLM:
    """A seeded tiny model (``TINY``; ``config`` changes any field, e.g. ``dropout=0.1``)."""
    torch.manual_seed(seed)
    return MiniMindForCausalLM(MiniMindConfig(**{**TINY, **config}))


def noisy(model: nn.Module, std: float = 0.5) -> nn.Module:
    """``model`` in eval mode with its matrices redrawn from N(0, std): an untrained model whose
    greedy answers differ from prompt to prompt and rarely end early (a model that always says
    the same thing could not reveal answers mixed up between requests)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, std)
    return model.eval()


class ScriptedReplies(nn.Module):
    """A stand-in for the served model: each generation writes the next of ``replies`` (text
    with its markers, e.g. ``<tool_call>``, as the tokenizer's special ids), then
    ``<|im_end|>``; ``prompts`` keeps every prompt it was given, decoded."""

    def __init__(self, tokenizer, context: int = 4096) -> None:
        super().__init__()
        self.tokenizer, self.replies, self.prompts = tokenizer, [], []
        self.config = MiniMindConfig(vocab_size=len(tokenizer), hidden_size=8,
                                     num_hidden_layers=1, num_attention_heads=2,
                                     num_key_value_heads=1, max_position_embeddings=context)
        self.dummy = nn.Parameter(torch.zeros(1))

    def stream(self, ids, max_new_tokens, *args, **kwargs):
        self.prompts.append(self.tokenizer.decode(ids[0].tolist()))
        reply = self.tokenizer.encode(self.replies.pop(0))
        for t in reply + [self.tokenizer.token_to_id("<|im_end|>")]:
            yield torch.tensor([t])
