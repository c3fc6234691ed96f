"""MiniMind2-Small: a Llama-style decoder (notebooks 02 and 03), with MiniMind's options.

Read top to bottom: ``MiniMindConfig`` → ``RMSNorm`` → RoPE (``rope_tables``,
``apply_rope``; scaled for long inputs by PI, NTK or YaRN: notebook 12) → ALiBi
(``alibi_slopes``, ``alibi_bias``; notebook 12) → ``Attention`` (GQA, KV cache, SDPA or
manual path; notebook 02) → ``FeedForward`` (SwiGLU) → ``MoEFeedForward`` (mixture of
experts; notebook 11) → ``Block`` → ``MiniMindForCausalLM`` with ``generate`` (notebook 03).
Names follow ``transformers.LlamaForCausalLM`` (see ``minimind_lib.model.hf``) and, for the MoE
layers, MiniMind's own ``model/model_minimind.py``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from minimind_lib.model.attention import Attention, LayerCache
from minimind_lib.model.chunked_loss import IGNORE_INDEX, chunked_causal_lm_loss, head_weight
from minimind_lib.model.config import MiniMindConfig
from minimind_lib.model.generation import decode_stream
from minimind_lib.model.kv_cache import CacheView, StaticCache
from minimind_lib.model.layers import FeedForward, RMSNorm
from minimind_lib.model.moe import MoEFeedForward
from minimind_lib.model.positions import rope_tables


class Block(nn.Module):
    """Pre-norm decoder block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))`` (notebook 03);
    ``mlp`` is a ``MoEFeedForward`` when ``config.use_moe`` (notebook 11)."""

    def __init__(self, config: MiniMindConfig, use_sdpa: bool = True) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, use_sdpa)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MoEFeedForward(config) if config.use_moe else FeedForward(config)

    def forward(
        self, x: Tensor, cos: Tensor | None, sin: Tensor | None,
        past: LayerCache | CacheView | None = None,
    ) -> tuple[Tensor, LayerCache]:
        a, cache = self.self_attn(self.input_layernorm(x), cos, sin, past)
        x = x + a  # (B, T, C)
        x = x + self.mlp(self.post_attention_layernorm(x))  # (B, T, C)
        return x, cache


# --------------------------------------------------------------------------- the model


@dataclass
class CausalLMOutput:
    """What ``MiniMindForCausalLM.forward`` returns.

    ``logits`` (B, T, V), or None when labels were given without ``return_logits=True`` (the
    loss then comes from the chunked head, ``model.chunked_loss``); ``loss`` the mean shifted
    cross-entropy (None without labels; in training mode a MoE model adds ``aux_loss``);
    ``past_key_values`` one ``(k, v)`` per layer when ``use_cache=True``, else None;
    ``aux_loss`` the load-balancing loss summed over the MoE layers (None for a dense model).
    """

    logits: Tensor | None
    loss: Tensor | None = None
    past_key_values: list[LayerCache] | None = None
    aux_loss: Tensor | None = None


class MiniMindModel(nn.Module):
    """The decoder trunk: token embeddings, the blocks and the final norm (Llama's ``model``)."""

    def __init__(self, config: MiniMindConfig, use_sdpa: bool = True) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(Block(config, use_sdpa)
                                    for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.use_rope = config.position_encoding == "rope"
        if self.use_rope:
            cos, sin = rope_tables(config.head_dim, config.max_position_embeddings,
                                   config.rope_theta, config.rope_scaling)
            # non-persistent: rebuilt from the config, so they never enter a checkpoint
            self.register_buffer("rope_cos", cos, persistent=False)  # (P, D)
            self.register_buffer("rope_sin", sin, persistent=False)  # (P, D)
        self.gradient_checkpointing = False  # see MiniMindForCausalLM.gradient_checkpointing_enable

    def forward(
        self, input_ids: Tensor | None,
        past_key_values: list[LayerCache] | StaticCache | None = None,
        inputs_embeds: Tensor | None = None,
    ) -> tuple[Tensor, list[LayerCache] | StaticCache]:
        """``input_ids`` (B, T) → final hidden states (B, T, C) and the extended KV cache.

        ``past_key_values``: None, the ``(k, v)`` pairs of every layer (extended by
        concatenation: the cache notebook 02 builds), or a ``StaticCache`` (written in place,
        each row at its own length: batched generation, ``model.generation``), which is
        returned, advanced by T.

        ``inputs_embeds`` (B, T, C), given instead of ``input_ids`` (then None), replaces the
        token embeddings: a vision-language model's sequence with the image spliced in
        (``minimind_lib.vision.vlm``, notebook 13; Hugging Face's name)."""
        given = input_ids if inputs_embeds is None else inputs_embeds
        if given.dim() != (2 if inputs_embeds is None else 3):
            name = "input_ids must be (batch, seq_len)" if inputs_embeds is None else \
                "inputs_embeds must be (batch, seq_len, hidden)"
            raise ValueError(f"{name}, got shape {tuple(given.shape)}")
        static = isinstance(past_key_values, StaticCache)
        n_past = (past_key_values.num_layers if static else
                  len(past_key_values) if past_key_values is not None else len(self.layers))
        if n_past != len(self.layers):
            raise ValueError(f"past_key_values has {n_past} layers, "
                             f"the model has {len(self.layers)}")
        T = given.shape[1]
        if static:
            # each row's positions and a mask, or (every row at one length) plain ints
            plan = past_key_values.prepare(T)
            positions, mask, start, end = plan.positions, plan.mask, plan.start or 0, plan.span
            pasts = [past_key_values.layer(i) for i in range(len(self.layers))]
        else:
            start = past_key_values[0][0].shape[2] if past_key_values else 0
            end, positions, mask = start + T, None, None
            pasts = past_key_values or [None] * len(self.layers)
        self._check_inputs(input_ids if inputs_embeds is None else None, end)
        cos, sin = self._rope(start, T, positions if mask is not None else None)
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, C)
        x = self.dropout(x)
        caches = []
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for layer, past in zip(self.layers, pasts, strict=True):
            if recompute:
                # keep only the block's input; rerun the block in backward (Chen et al. 2016)
                x, cache = checkpoint(layer, x, cos, sin, past, use_reentrant=False)
            else:
                x, cache = layer(x, cos, sin, past)
            caches.append(cache)
        if static:
            past_key_values.advance(T)
            return self.norm(x), past_key_values
        return self.norm(x), caches

    def _rope(self, start: int, T: int, positions: Tensor | None
              ) -> tuple[Tensor | None, Tensor | None]:
        """cos/sin of the new positions: (T, D) from ``start``, or (B, T, D) gathered at each
        row's ``positions``; (None, None) without RoPE."""
        if not self.use_rope:
            return None, None
        if positions is None:
            return self.rope_cos[start:start + T], self.rope_sin[start:start + T]  # (T, D)
        return self.rope_cos[positions], self.rope_sin[positions]  # (B, T, D)

    def _check_inputs(self, input_ids: Tensor | None, end: int) -> None:
        vocab, max_pos = self.config.vocab_size, self.config.max_position_embeddings
        if input_ids is not None and input_ids.numel() and (input_ids.min() < 0
                                                         or input_ids.max() >= vocab):
            bad = input_ids[(input_ids < 0) | (input_ids >= vocab)][0].item()
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab}) "
                             f"(MiniMindConfig.vocab_size={vocab})")
        if end > max_pos:
            limit = "the RoPE table" if self.use_rope else "the model allows"
            raise ValueError(f"sequence of {end} positions is longer than {limit} "
                             f"(MiniMindConfig.max_position_embeddings={max_pos})")


class MiniMindForCausalLM(nn.Module):
    """MiniMind2-Small: the decoder trunk plus the (tied) output head (notebook 03).

    Parameter and submodule names follow ``transformers.LlamaForCausalLM``, so state dicts
    move between the two unchanged (``minimind_lib.model.hf``).

    >>> _ = torch.manual_seed(0)
    >>> model = MiniMindForCausalLM(MiniMindConfig(vocab_size=32, hidden_size=16,
    ...                             num_hidden_layers=1, num_attention_heads=2,
    ...                             num_key_value_heads=1, max_position_embeddings=16))
    >>> out = model(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]]))
    >>> out.logits is None   # with labels: the loss only (return_logits=True adds the logits)
    True
    >>> model(torch.tensor([[1, 2, 3]])).logits.shape
    torch.Size([1, 3, 32])
    >>> import math
    >>> abs(out.loss.item() - math.log(32)) < 0.1   # untrained: about ln(vocab)
    True
    >>> model.generate(torch.tensor([[1, 2]]), max_new_tokens=3, temperature=0).shape
    torch.Size([1, 5])
    >>> MiniMindForCausalLM(MiniMindConfig()).num_parameters()
    25829888
    """

    def __init__(self, config: MiniMindConfig, use_sdpa: bool = True) -> None:
        super().__init__()
        self.config = config
        self.model = MiniMindModel(config, use_sdpa)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        if config.tie_word_embeddings:
            # Press & Wolf 2017: one matrix embeds tokens and scores them (saves V*C params)
            self.lm_head.weight = self.model.embed_tokens.weight

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # Llama's initializer_range 0.02: small logits at start, so the loss begins near ln V
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def set_attention(self, use_sdpa: bool) -> MiniMindForCausalLM:
        """Switch every layer to the fused SDPA path (True) or the manual path (False)."""
        for layer in self.model.layers:
            layer.self_attn.use_sdpa = use_sdpa
        return self

    def gradient_checkpointing_enable(self) -> MiniMindForCausalLM:
        """Activation checkpointing (HF's name): in training, keep only each block's input and
        recompute the block during backward. The gradients are the same; the memory for saved
        activations drops to the block inputs plus the head and loss
        (``minimind_lib.training.memory`` measures it), for one more forward pass per step (about
        a third more compute)."""
        self.model.gradient_checkpointing = True
        return self

    def gradient_checkpointing_disable(self) -> MiniMindForCausalLM:
        self.model.gradient_checkpointing = False
        return self

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Number of distinct parameters (a tied head is counted once)."""
        skip = {id(self.model.embed_tokens.weight), id(self.lm_head.weight)}
        return sum(p.numel() for p in self.parameters()
                   if not (exclude_embeddings and id(p) in skip))

    def num_active_parameters(self) -> int:
        """Parameters one token's forward pass uses: all of them, minus the routed experts a
        token skips (``n_routed_experts - num_experts_per_tok`` per MoE layer).

        >>> c = dict(vocab_size=8, hidden_size=16, num_attention_heads=2, num_hidden_layers=1)
        >>> moe = MiniMindForCausalLM(MiniMindConfig(use_moe=True, **c))
        >>> expert = 3 * 16 * moe.config.intermediate_size
        >>> moe.num_parameters() - moe.num_active_parameters() == 2 * expert   # 4 experts, top-2
        True
        """
        skipped = 0
        for layer in self.model.layers:
            if isinstance(layer.mlp, MoEFeedForward):
                per_expert = sum(p.numel() for p in layer.mlp.experts[0].parameters())
                skipped += (layer.mlp.n_experts - layer.mlp.top_k) * per_expert
        return self.num_parameters() - skipped

    def forward(
        self,
        input_ids: Tensor,
        labels: Tensor | None = None,
        past_key_values: list[LayerCache] | None = None,
        use_cache: bool = False,
        return_logits: bool = False,
    ) -> CausalLMOutput:
        """Logits for ``input_ids`` (B, T); with ``labels`` (B, T) the loss instead.

        ``labels`` are aligned with the inputs (usually a copy of them, -100 where no loss is
        wanted): the model shifts them, so position t is scored on predicting token t+1.
        Batches may be right-padded (pads labelled -100): causal attention means real tokens
        never see the pads to their right, so no attention mask is needed.

        With ``labels`` the head and the loss run together chunk by chunk (``head_loss``):
        no (B, T, V) logits are made or kept for backward, and ``.logits`` is None. A caller
        that needs the logits as well passes ``return_logits=True``: the plain path,
        ``causal_lm_loss(lm_head(hidden), labels)``, the same loss to fp32 rounding.

        MoE (notebook 11): ``aux_loss`` is the load-balancing loss summed over layers.  In
        training mode ``loss`` = cross-entropy + ``aux_loss`` (what the optimizer minimises,
        as in MiniMind's trainer); in eval mode ``loss`` is the plain cross-entropy, so the
        validation losses of dense and MoE models compare.
        """
        hidden, caches = self.model(input_ids, past_key_values)  # (B, T, C)
        aux_loss = self._aux_loss()
        logits, loss = self.head_outputs(hidden, labels, return_logits)
        if loss is not None and aux_loss is not None and self.training:
            loss = loss + aux_loss
        return CausalLMOutput(logits, loss, caches if use_cache else None, aux_loss)

    def head_outputs(self, hidden: Tensor, labels: Tensor | None = None,
                     return_logits: bool = False) -> tuple[Tensor | None, Tensor | None]:
        """The output head on the trunk's hidden states (B, T, C): ``(logits, loss)`` as
        ``forward`` returns them (with ``labels`` and without ``return_logits``: no logits)."""
        if labels is not None and not return_logits:
            return None, self.head_loss(hidden, labels)
        logits = self.lm_head(hidden)  # (B, T, V)
        return logits, None if labels is None else causal_lm_loss(logits, labels)

    def head_loss(self, hidden: Tensor, labels: Tensor) -> Tensor:
        """``causal_lm_loss(self.lm_head(hidden), labels)`` without the (B, T, V) logits.

        ``hidden`` (B, T, C): the trunk's final hidden states. A plain bias-free head runs in
        ``chunked_causal_lm_loss`` (its weight's gradient reaches the tied embedding too); an
        int8 or LoRA-wrapped head runs whole, as a module.
        """
        weight = head_weight(self.lm_head)
        if weight is None:
            return causal_lm_loss(self.lm_head(hidden), labels)
        return chunked_causal_lm_loss(hidden, weight, labels)

    def _aux_loss(self) -> Tensor | None:
        losses = [layer.mlp.aux_loss for layer in self.model.layers
                  if isinstance(layer.mlp, MoEFeedForward)]
        return torch.stack(losses).sum() if losses else None

    @torch.no_grad()
    def stream(
        self,
        input_ids: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
        attention_mask: Tensor | None = None,
        constraints: object = None,
    ) -> Iterator[Tensor]:
        """Yield the next token of every row, (B,) per step; arguments as in ``generate``.

        Stops after ``max_new_tokens`` or once every row has produced one of the
        ``eos_token_id`` ids (rows that finished earlier keep yielding the first of them, and
        are no longer computed). The loop is ``model.generation.decode_stream``.
        """
        yield from decode_stream(self, input_ids, max_new_tokens, temperature, top_k, top_p,
                                 eos_token_id, use_cache, generator, attention_mask, constraints)

    def generate(
        self,
        input_ids: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
        attention_mask: Tensor | None = None,
        constraints: object = None,
    ) -> Tensor:
        """Autoregressive decoding: returns (B, T + new) = prompt + generated tokens.

        ``temperature=0`` is greedy (``top_k``/``top_p`` are then irrelevant); otherwise
        logits are divided by ``temperature``, cut to the ``top_k`` best and to the smallest
        set with probability ≥ ``top_p``, then sampled (``generator`` for reproducibility).
        ``use_cache=False`` recomputes the whole sequence each step (same tokens, slower); with
        the cache (a ``StaticCache``, written in place) each step feeds one token a row.

        Prompts of different lengths go in one batch left-padded, with ``attention_mask`` 0 on
        the padding (transformers' convention; ``model.generation.left_pad`` builds both): each
        row's answer is the one its prompt gets alone. Generation stops early once every row
        has emitted one of the ``eos_token_id`` ids; rows that finished first are filled with
        the first of them.  Call ``model.eval()`` first if dropout > 0. ``constraints``: a
        grammar every row follows, or one per row (``inference.structured.constrain``).

        >>> _ = torch.manual_seed(0)
        >>> model = MiniMindForCausalLM(MiniMindConfig(vocab_size=16, hidden_size=16,
        ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
        >>> from minimind_lib.model.generation import left_pad
        >>> ids, mask = left_pad([[3, 4, 5], [6]])
        >>> both = model.generate(ids, 4, temperature=0, attention_mask=mask)
        >>> alone = model.generate(torch.tensor([[6]]), 4, temperature=0)
        >>> both[1, 3:].tolist() == alone[0, 1:].tolist()
        True
        """
        new = list(self.stream(input_ids, max_new_tokens, temperature, top_k, top_p,
                               eos_token_id, use_cache, generator, attention_mask, constraints))
        if not new:
            return input_ids
        return torch.cat((input_ids, torch.stack(new, dim=1)), dim=1)  # (B, T + new)


@torch.no_grad()
def attention_maps(model: MiniMindForCausalLM, input_ids: Tensor) -> Tensor:
    """Attention probabilities of every layer and head: (L, B, H, T, T) for ``input_ids``
    (B, T).  Row t of a map says how much position t reads from each earlier position.

    >>> model = MiniMindForCausalLM(MiniMindConfig(vocab_size=16, hidden_size=16,
    ...     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1))
    >>> maps = attention_maps(model, torch.tensor([[1, 2, 3]]))
    >>> maps.shape, maps[0, 0, 0, 0].tolist()   # causal: token 0 reads only itself
    (torch.Size([2, 1, 2, 3, 3]), [1.0, 0.0, 0.0])
    """
    maps = []

    def capture(module: Attention, args: tuple, _output: object) -> None:
        x, cos, sin = args[:3]  # the normed input of the attention layer, (B, T, C)
        maps.append(module.weights(x, cos, sin))

    hooks = [layer.self_attn.register_forward_hook(capture) for layer in model.model.layers]
    try:
        model(input_ids)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(maps)  # (L, B, H, T, T)


def causal_lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy of predicting token t+1 from position t; ``IGNORE_INDEX`` (-100)
    labels are ignored.

    ``logits`` (B, T, V), ``labels`` (B, T) aligned with the inputs.  Computed in fp32.

    >>> logits = torch.zeros(1, 3, 4)                  # uniform over 4 tokens
    >>> round(causal_lm_loss(logits, torch.tensor([[0, 1, -100]])).item(), 4)  # ln 4
    1.3863
    """
    if labels.shape != logits.shape[:2]:
        raise ValueError(f"labels shape {tuple(labels.shape)} must equal input_ids shape "
                         f"{tuple(logits.shape[:2])}")
    # subtle: shift the labels, not the logits: slicing logits[:, :-1] would copy the
    # (B, T, V) tensor forward and backward (measured ~10% of a CPU training step)
    targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)  # (B, T): token t+1; last: none
    flat_logits = logits.reshape(-1, logits.shape[-1]).float()  # (B*T, V)
    return F.cross_entropy(flat_logits, targets.reshape(-1), ignore_index=IGNORE_INDEX)


def model_size(config: MiniMindConfig) -> tuple[int, int]:
    """``(parameters, bytes)`` of the fp32 model ``config`` describes: its weights, and the RoPE
    tables beside them, from the config alone (nothing is allocated, however large it asks for:
    ``load_model`` checks an edited ``config.json`` with it before building anything).
    ``tests/test_model.py`` holds it equal to the built model's counts.

    >>> model_size(MiniMindConfig())[0]       # MiniMind2-Small
    25829888
    >>> f"{model_size(MiniMindConfig(vocab_size=10**9))[1]:.1e}"   # bytes
    '2.0e+12'
    """
    c, d = config.hidden_size, config.head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    ffn = 3 * c * config.intermediate_size  # gate, up, down
    if config.use_moe:  # routed and shared experts, and the router
        experts = config.n_routed_experts + config.n_shared_experts
        ffn = ffn * experts + config.n_routed_experts * c
    layer = 2 * c + c * q + 2 * c * kv + q * c + ffn  # two norms, q k v o, the feed-forward
    if config.qk_norm:
        layer += 2 * d  # q_norm, k_norm
    embeddings = config.vocab_size * c * (1 if config.tie_word_embeddings else 2)
    params = embeddings + config.num_hidden_layers * layer + c  # + the final norm
    tables = {"rope": 2 * config.max_position_embeddings * d,  # cos and sin, (P, D) each
              "alibi": config.num_hidden_layers * config.num_attention_heads,  # slopes a layer
              }.get(config.position_encoding, 0)
    return params, 4 * (params + tables)
