"""Small shared pieces for the serving tests."""

from __future__ import annotations

import torch
from torch import nn


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
