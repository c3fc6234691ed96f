"""Mixture of experts, MiniMind's way (notebook 11): a router picks ``num_experts_per_tok`` of
``n_routed_experts`` SwiGLU experts per token (``MoEFeedForward``), shared experts see every
token, and ``load_balancing_loss`` (Switch Transformer's, per sequence when ``seq_aux``) keeps
the router from collapsing onto a few experts. ``dense_twin`` is the dense model of equal active
parameters; ``expert_load`` counts the routing of a batch.

MiniMind-3's MoE (``router_aux_loss_coef`` set; Qwen3-MoE's layer) is the same module with two
rules changed: the top-k weights are renormalised for every k (with top-1 each token's expert
output is taken whole: the router learns only from the auxiliary loss), and the loss is the
batch-level one times ``router_aux_loss_coef``, summed over layers as MiniMind-3 sums it.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minimind_lib.model.config import MiniMindConfig
from minimind_lib.model.layers import FeedForward


def load_balancing_loss(
    probs: Tensor, chosen: Tensor, alpha: float, seq_aux: bool = True
) -> Tensor:
    """MiniMind's auxiliary load-balancing loss of one MoE layer (a scalar).

    ``probs`` (B, T, E) the router probabilities, ``chosen`` (B, T, k) the experts picked.
    Per sequence b (``seq_aux``), expert e gets ``f_be = #slots of b routed to e · E / (k T)``
    (1 for every expert when the load is even) and ``P_be = mean_t probs[b, t, e]``; the loss
    is ``alpha · mean_b Σ_e f_be P_be``.  Without ``seq_aux`` the whole batch counts as one
    sequence.  This is the Switch Transformer's loss (Fedus et al. 2022, eq. 4, for k = 1)
    computed per sequence as in DeepSeekMoE (Dai et al. 2024, eq. 12-14).  Only ``P`` carries a
    gradient (counts are not differentiable): it pushes probability away from overloaded
    experts.  Uniform probabilities give ``alpha`` whatever the counts.

    >>> probs = torch.full((1, 4, 2), 0.5)                  # 4 tokens, 2 experts, uniform
    >>> load_balancing_loss(probs, torch.tensor([[[0], [1], [0], [1]]]), alpha=1.0).item()
    1.0
    >>> skewed = torch.tensor([[[0.9, 0.1]] * 4])           # every token prefers expert 0
    >>> round(load_balancing_loss(skewed, torch.zeros(1, 4, 1, dtype=torch.long), 1.0).item(), 4)
    1.8
    """
    B, T, k = chosen.shape
    n_experts = probs.shape[-1]
    if not seq_aux:
        probs, chosen, B, T = probs.reshape(1, B * T, -1), chosen.reshape(1, B * T, k), 1, B * T
    ones = torch.ones(B, T * k, device=probs.device)
    counts = torch.zeros(B, n_experts, device=probs.device).scatter_add_(
        1, chosen.reshape(B, T * k), ones)  # (B, E): slots per expert in each sequence
    f = counts * n_experts / (k * T)  # (B, E)
    return alpha * (f * probs.float().mean(dim=1)).sum(dim=1).mean()


class MoEFeedForward(nn.Module):
    """Mixture of experts in place of the FFN (notebook 11), MiniMind's ``MOEFeedForward``.

    A router ``gate`` (C → E, no bias) scores every token; ``softmax`` gives probabilities,
    the ``k`` best experts are kept and their probabilities renormalised to sum to 1 (when
    ``norm_topk_prob`` and k > 1, as MiniMind); the output is the weighted sum of those k
    SwiGLU experts plus every shared expert, unweighted (DeepSeekMoE's shared experts):

        ``y = Σ_{e in topk(x)} w_e · expert_e(x) + Σ_s shared_s(x)``

    ``aux_loss`` holds the layer's ``load_balancing_loss`` after each forward (train and eval
    mode alike; MiniMind leaves it 0 in eval mode); ``MiniMindForCausalLM`` sums it over layers.

    Dispatch: MiniMind trains by copying each token k times and running every copy through
    its expert, and at inference sorts the (token, choice) slots by expert and runs each
    expert once on its slots.  Both compute the same sum: an expert acts on each token
    independently, so grouping the tokens differently changes no token's result (only the
    order of float additions).  This class uses the sorted dispatch in both modes, with
    gradients, so train and eval give the same logits.  The router starts like every Linear
    here, N(0, 0.02) (MiniMind's ``MoEGate`` uses PyTorch's Kaiming-uniform default).

    >>> moe = MoEFeedForward(MiniMindConfig(hidden_size=16, num_attention_heads=2, use_moe=True))
    >>> moe(torch.randn(2, 3, 16)).shape, len(moe.experts), len(moe.shared_experts)
    (torch.Size([2, 3, 16]), 4, 1)
    """

    def __init__(self, config: MiniMindConfig) -> None:
        super().__init__()
        self.n_experts, self.top_k = config.n_routed_experts, config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.alpha, self.seq_aux = config.aux_loss_alpha, config.seq_aux
        # MiniMind-3 (Qwen3-MoE): renormalise every top-k, the loss over the whole batch
        self.minimind3 = config.router_aux_loss_coef is not None
        if self.minimind3:
            self.alpha, self.seq_aux = config.router_aux_loss_coef, False
        self.gate = nn.Linear(config.hidden_size, self.n_experts, bias=False)
        self.experts = nn.ModuleList(FeedForward(config) for _ in range(self.n_experts))
        self.shared_experts = nn.ModuleList(
            FeedForward(config) for _ in range(config.n_shared_experts))
        self.aux_loss: Tensor | None = None

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Router for tokens ``x`` (N, C): probabilities (N, E), the chosen experts (N, k)
        and their weights (N, k)."""
        probs = F.softmax(self.gate(x).float(), dim=-1)  # (N, E), fp32 under autocast too
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)  # (N, k) each
        if self.norm_topk_prob and (self.top_k > 1 or self.minimind3):
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return probs, chosen, weights

    def dispatch(self, x: Tensor, chosen: Tensor, weights: Tensor) -> Tensor:
        """``Σ_j weights[:, j] · expert_{chosen[:, j]}(x)`` for ``x`` (N, C), each expert run
        once on the tokens routed to it; returns (N, C)."""
        slots = chosen.flatten()  # (N*k,): slot n*k + j is token n's j-th choice
        order = slots.argsort(stable=True)  # (N*k,) slots grouped by expert
        counts = slots.bincount(minlength=self.n_experts).tolist()
        y = torch.zeros_like(x)  # (N, C)
        for expert, group in zip(self.experts, order.split(counts), strict=True):
            tokens = group // self.top_k  # (n_e,) the token of each slot
            out = expert(x[tokens]) * weights.flatten()[group, None]  # (n_e, C)
            y.index_add_(0, tokens, out.to(y.dtype))
        return y

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        flat = x.reshape(B * T, C)  # (N, C)
        probs, chosen, weights = self.route(flat)
        self.aux_loss = load_balancing_loss(probs.view(B, T, -1), chosen.view(B, T, -1),
                                            self.alpha, self.seq_aux)
        if self.minimind3:  # it shares choices per token, not per slot: k times the above
            self.aux_loss = self.aux_loss * self.top_k
        y = self.dispatch(flat, chosen, weights)  # (N, C)
        for shared in self.shared_experts:
            y = y + shared(flat)
        return y.view(B, T, C)


def dense_twin(config: MiniMindConfig) -> MiniMindConfig:
    """The dense config whose FFN has as many parameters as one token uses in the MoE
    ``config``: width ``intermediate_size · (num_experts_per_tok + n_shared_experts)``, the
    fair "equal active parameters" baseline of notebook 11 (it lacks only the router).

    >>> moe = MiniMindConfig(hidden_size=256, num_attention_heads=8, intermediate_size=256,
    ...                      use_moe=True)
    >>> dense_twin(moe).intermediate_size, dense_twin(moe).use_moe
    (768, False)
    """
    width = config.intermediate_size * (config.num_experts_per_tok + config.n_shared_experts)
    return replace(config, use_moe=False, intermediate_size=width)


@torch.no_grad()
def expert_load(model: nn.Module, input_ids: Tensor) -> Tensor:
    """How many (token, choice) slots each MoE layer routes to each expert for ``input_ids``
    (B, T) through a ``MiniMindForCausalLM``: a (L, E) count tensor; every row sums to B·T·k
    (notebook 11's histogram).

    >>> from minimind_lib.model.decoder import MiniMindForCausalLM
    >>> model = MiniMindForCausalLM(MiniMindConfig(vocab_size=16, hidden_size=16,
    ...     num_hidden_layers=2, num_attention_heads=2, use_moe=True))
    >>> load = expert_load(model, torch.tensor([[1, 2, 3]]))
    >>> load.shape, load.sum(dim=1).tolist()    # 3 tokens x top-2
    (torch.Size([2, 4]), [6, 6])
    """
    counts = []

    def capture(module: MoEFeedForward, args: tuple, _output: object) -> None:
        x = args[0]  # the normed input of the MoE layer, (B, T, C)
        _, chosen, _ = module.route(x.reshape(-1, x.shape[-1]))
        counts.append(chosen.flatten().bincount(minlength=module.n_experts))

    hooks = [layer.mlp.register_forward_hook(capture) for layer in model.model.layers
             if isinstance(layer.mlp, MoEFeedForward)]
    if not hooks:
        raise ValueError("the model has no MoE layers (MiniMindConfig.use_moe is False)")
    try:
        model(input_ids)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(counts)  # (L, E)
