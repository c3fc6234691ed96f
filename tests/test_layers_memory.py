"""Memory-lean layers (minimind_lib.model.layers, issue 32): ``RMSNormFunction`` and
``SiLUMulFunction`` against the plain-autograd expressions written here (the forward of
notebook 03's ``MyRMSNorm`` and ``MySwiGLU``). Contract: the forward is bit for bit the plain
one (fp32, bf16 inputs, bf16 autocast); the hand-written backward equals autograd's bit for bit
for each layer alone, and to float rounding in a block (see the block test); autograd keeps
fewer tensors: a block no longer keeps each norm's normalised x nor silu(gate)."""

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minimind_lib.model import MiniMindConfig
from minimind_lib.model.decoder import Block
from minimind_lib.model.layers import FeedForward, RMSNorm, RMSNormFunction, SiLUMulFunction
from minimind_lib.model.positions import rope_tables

CONFIG = MiniMindConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                        max_position_embeddings=32)
B, T = 2, 16


def plain_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm's forward as plain autograd ops (what layers.RMSNorm was before issue 32)."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


class PlainRMSNorm(RMSNorm):
    def forward(self, x: Tensor) -> Tensor:
        return plain_rms_norm(x, self.weight, self.eps)


class PlainFeedForward(FeedForward):
    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def grads(output: Tensor, inputs: list[Tensor], seed: int = 1) -> list[Tensor]:
    """Gradients of ``(output * r).sum()`` for a fixed random ``r`` (not all ones: a sum
    alone would hide errors that cancel across a row)."""
    r = torch.randn(output.shape, generator=torch.Generator().manual_seed(seed))
    return list(torch.autograd.grad((output.float() * r).sum(), inputs))


def leaf(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> Tensor:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3
    return x.to(dtype).requires_grad_()


def norm_weight(dim: int) -> Tensor:
    # not all ones, so a wrongly placed weight shows in the outputs and the gradients
    return (torch.rand(dim, generator=torch.Generator().manual_seed(7)) + 0.5).requires_grad_()


# --- forward: bit for bit; backward: fp32 rounding ---------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_forward_is_the_plain_one_bit_for_bit_and_backward_close(dtype):
    x, weight = leaf(B, T, 32, dtype=dtype), norm_weight(32)
    ours, plain = RMSNormFunction.apply(x, weight, 1e-5), plain_rms_norm(x, weight, 1e-5)
    assert ours.dtype == plain.dtype and torch.equal(ours, plain)
    for got, want in zip(grads(ours, [x, weight]), grads(plain, [x, weight]), strict=True):
        # the backward takes autograd's ops in autograd's order on the recomputed x̂: equal
        assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_forward_is_the_plain_one_bit_for_bit_and_backward_close(dtype):
    gate, up = leaf(B, T, 48, dtype=dtype), leaf(B, T, 48, dtype=dtype, seed=1)
    ours, plain = SiLUMulFunction.apply(gate, up), F.silu(gate) * up
    assert ours.dtype == plain.dtype and torch.equal(ours, plain)
    for got, want in zip(grads(ours, [gate, up]), grads(plain, [gate, up]), strict=True):
        # the backward runs autograd's own ops (grad * up, silu_backward, grad * silu(gate))
        # on bit-identical recomputed inputs: equal, no tolerance
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_gradcheck_in_float64():
    """Finite differences in float64 on tiny shapes: the hand-written backwards are the
    derivatives (gradcheck's default tolerances, atol 1e-5, rtol 1e-3)."""
    x = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    weight = (torch.rand(5, dtype=torch.float64) + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(RMSNormFunction.apply, (x, weight, 1e-5))
    gate = torch.randn(2, 3, 7, dtype=torch.float64, requires_grad=True)
    up = torch.randn(2, 3, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(SiLUMulFunction.apply, (gate, up))


@pytest.mark.parametrize("qk_norm", [False, True])
def test_block_under_bf16_autocast_same_forward_dtypes_and_close_gradients(qk_norm):
    """A whole block (norms, attention with or without QK-norm, SwiGLU) under bf16 autocast,
    lean vs plain layers: the same output and dtype bit for bit; parameter gradients close."""
    config = MiniMindConfig(**{**CONFIG.__dict__, "qk_norm": qk_norm})
    torch.manual_seed(0)
    lean = Block(config).train()
    plain = plain_block(lean, config)
    cos, sin = rope_tables(config.head_dim, T, config.rope_theta)
    x = leaf(B, T, config.hidden_size)
    outputs = []
    for block in (lean, plain):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y, _ = block(x, cos, sin)
        outputs.append(y)
    assert outputs[0].dtype == outputs[1].dtype and torch.equal(outputs[0], outputs[1])
    params = [list(block.parameters()) for block in (lean, plain)]
    for got, want in zip(grads(outputs[0], params[0]), grads(outputs[1], params[1]),
                         strict=True):
        # each norm's input gets its gradient from the residual path and from the norm; plain
        # autograd adds the norm's two uses of x (x², x * 1/rms) to it one by one, ours as one
        # sum: fp32 rounding, which can flip a bf16 rounding (2**-8 relative) and spread
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2 * want.abs().max().item())


def plain_block(lean: Block, config: MiniMindConfig) -> Block:
    """A copy of ``lean`` whose norms and feed-forward are the plain-autograd ones."""
    block = Block(config).train()
    block.input_layernorm = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)
    block.post_attention_layernorm = PlainRMSNorm(config.hidden_size, config.rms_norm_eps)
    block.mlp = PlainFeedForward(config)
    if config.qk_norm:
        block.self_attn.q_norm = PlainRMSNorm(config.head_dim, config.rms_norm_eps)
        block.self_attn.k_norm = PlainRMSNorm(config.head_dim, config.rms_norm_eps)
    with torch.no_grad():
        for p in lean.parameters():  # norm weights away from 1, so they matter
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    block.load_state_dict(lean.state_dict())
    return block


# --- what autograd keeps ---------------------------------------------------------------------


def saved_sizes(module: nn.Module, *args: Tensor) -> list[int]:
    """Element counts of the distinct storages autograd saves while ``module(*args)`` runs,
    sorted; parameters and the arguments that need no gradient (the RoPE tables, buffers in the
    model) excluded."""
    constants = [*module.parameters(), *(a for a in args if not a.requires_grad)]
    params = {t.untyped_storage().data_ptr() for t in constants}
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen.setdefault(storage.data_ptr(), storage.nbytes() // t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(*args)
    return sorted(seen.values())


def test_each_layer_keeps_only_its_inputs():
    x = leaf(B, T, 32)
    assert saved_sizes(RMSNorm(32), x) == sorted([B * T * 32, B * T])  # x, 1/rms per row
    # x (gate/up's input), gate, up, and their product (down_proj's input); not silu(gate)
    assert saved_sizes(FeedForward(CONFIG), x) == [B * T * 32] + [B * T * 48] * 3
    assert saved_sizes(PlainFeedForward(CONFIG), x) == [B * T * 32] + [B * T * 48] * 4


def test_a_block_keeps_two_normalised_inputs_and_silu_gate_less():
    """The exact storages of one dense block, fp32 (``training.memory.activation_bytes``
    counts the same): per norm its input x and 1/rms; the q/k/v and gate/up inputs (the norms'
    outputs); attention's q, k, v, output and log-sum-exp; gate, up and their product. The
    plain layers keep also each norm's normalised x (C) and silu(gate) (I)."""
    torch.manual_seed(0)
    lean = Block(CONFIG).train()
    cos, sin = rope_tables(CONFIG.head_dim, T, CONFIG.rope_theta)
    x = leaf(B, T, CONFIG.hidden_size)
    C, H = CONFIG.hidden_size, CONFIG.num_attention_heads
    inner = CONFIG.intermediate_size  # I
    K = CONFIG.num_key_value_heads * CONFIG.head_dim
    per_token = [C, 1, C,  # attention's norm: x, 1/rms; its output, q/k/v's input
                 C, K, K, C,  # q, k, v, attention's output (o_proj's input)
                 C, 1, C,  # the MLP's norm, as above
                 inner, inner, inner]  # gate, up, silu(gate) * up
    lean_sizes = saved_sizes(lean, x, cos, sin)
    assert lean_sizes == sorted([B * T * n for n in per_token] + [B * H * T])  # + log-sum-exp
    plain_sizes = saved_sizes(plain_block(lean, CONFIG), x, cos, sin)
    assert plain_sizes == sorted(lean_sizes + [B * T * C] * 2 + [B * T * inner])
