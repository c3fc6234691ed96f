"""The chunked head + cross-entropy (minimind_lib.model.chunked_loss) against the plain path.

The plain path is ``causal_lm_loss(F.linear(hidden, weight), labels)`` (and, per token,
``-F.cross_entropy(logits / temperature, reduction="none")``). Tolerances:

* fp32: ``FP32`` (torch's default fp32 ``assert_close`` tolerances, a few ulps): the logits of
  a row are the same matmul either way, only the order of the sums (the loss over rows, the
  weight gradient over chunks) differs;
* bf16 autocast: the loss and the hidden states' gradient to fp32 rounding (the same bf16
  logits, the same bf16 matmul for the gradient), the weight gradient to ``BF16``: the plain
  path rounds its one (V, C) matmul to bf16, the chunked one sums bf16 chunks in fp32, so they
  differ by bf16 rounding (2^-8 relative) of the largest entry.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny import tiny_model

from minimind_lib.model import IGNORE_INDEX
from minimind_lib.model.chunked_loss import chunked_causal_lm_loss, chunked_token_logprobs
from minimind_lib.model.decoder import causal_lm_loss
from minimind_lib.training.logprobs import token_logprobs

FP32 = dict(rtol=1.3e-6, atol=1e-5)
B, T, C, V = 3, 7, 8, 64  # 21 positions; a logits tensor would hold 21 x 64 entries


def inputs(seed: int = 0, dtype: torch.dtype = torch.float32):
    """hidden (B, T, C) and weight (V, C) requiring grad; labels (B, T) with a prompt to skip
    in row 0 and an all-ignored row 1 (an SFT batch)."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, C, generator=g, dtype=dtype).requires_grad_()
    weight = (0.5 * torch.randn(V, C, generator=g, dtype=dtype)).requires_grad_()
    labels = torch.randint(0, V, (B, T), generator=g)
    labels[0, :3] = IGNORE_INDEX
    labels[1] = IGNORE_INDEX
    return hidden, weight, labels


def loss_and_grads(loss_fn, hidden, weight, labels, autocast=None, scale=1.0):
    with torch.autocast("cpu", dtype=autocast or torch.float32, enabled=autocast is not None):
        loss = loss_fn(hidden, weight, labels)
    grads = torch.autograd.grad(loss * scale, (hidden, weight))
    return (loss.detach(), *grads)


def plain(hidden, weight, labels):
    return causal_lm_loss(F.linear(hidden, weight), labels)


def chunked(chunk_size, grad_in_forward):
    return lambda h, w, y: chunked_causal_lm_loss(h, w, y, chunk_size, grad_in_forward)


# --- the loss: the same numbers as the plain path ------------------------------------------

# 10 scored positions (4 in row 0, none in row 1, 6 in row 2): chunk sizes that divide 10
# (1, 5), that do not (3, 4) and that exceed it (64)
@pytest.mark.parametrize("chunk_size", [1, 3, 4, 5, 64])
@pytest.mark.parametrize("grad_in_forward", [True, False])
@pytest.mark.parametrize("scale", [1.0, 1024.0])  # 1024: a GradScaler's incoming gradient
def test_loss_and_gradients_equal_the_plain_path_in_fp32(chunk_size, grad_in_forward, scale):
    hidden, weight, labels = inputs()
    assert int((labels[:, 1:] != IGNORE_INDEX).sum()) == 10  # what the chunk sizes are for
    want = loss_and_grads(plain, hidden, weight, labels, scale=scale)
    got = loss_and_grads(chunked(chunk_size, grad_in_forward), hidden, weight, labels,
                         scale=scale)
    for name, a, b in zip(("loss", "d hidden", "d weight"), got, want, strict=True):
        torch.testing.assert_close(a, b, **FP32, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("chunk_size", [3, 512])
@pytest.mark.parametrize("grad_in_forward", [True, False])
def test_under_bf16_autocast_it_matches_the_plain_path(chunk_size, grad_in_forward):
    hidden, weight, labels = inputs(seed=1)
    loss, d_hidden, d_weight = loss_and_grads(chunked(chunk_size, grad_in_forward), hidden,
                                              weight, labels, autocast=torch.bfloat16)
    want_loss, want_hidden, want_weight = loss_and_grads(plain, hidden, weight, labels,
                                                         autocast=torch.bfloat16)
    fp32_loss = plain(hidden, weight, labels)
    assert abs(want_loss - fp32_loss) > 1e-4  # autocast did change the plain path's numbers
    torch.testing.assert_close(loss, want_loss, **FP32)  # the same bf16 logits
    torch.testing.assert_close(d_hidden, want_hidden, **FP32)  # the same bf16 matmul
    bf16 = 2**-8 * want_weight.abs().max().item()
    torch.testing.assert_close(d_weight, want_weight, rtol=0, atol=bf16)
    assert d_hidden.dtype == d_weight.dtype == torch.float32  # the leaves' dtype


def test_fp16_autocast_recomputes_in_backward():
    """Under fp16 the gradient must be formed in backward, after a GradScaler's factor has
    reached it: (softmax - onehot) / N cast to fp16 without that factor underflows. So fp16
    takes the recomputing path even when ``grad_in_forward`` asks otherwise; bf16 (fp32's
    exponent range) and fp32 take the eager one."""
    hidden, weight, labels = inputs(seed=3)
    kinds = {}
    for dtype in (torch.float16, torch.bfloat16, None):
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = chunked_causal_lm_loss(hidden, weight, labels, 4, grad_in_forward=True)
            want = plain(hidden, weight, labels)
        kinds[dtype] = type(loss.grad_fn).__name__
        torch.testing.assert_close(loss, want, **FP32)
        if dtype == torch.float16:  # a GradScaler's factor, then the plain path's gradients
            grads = torch.autograd.grad(loss * 2.0**16, (hidden, weight))
            want_grads = torch.autograd.grad(want * 2.0**16, (hidden, weight))
            for a, b in zip(grads, want_grads, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=2**-10 * b.abs().max().item())
    assert "Eager" not in kinds[torch.float16]
    assert "Eager" in kinds[torch.bfloat16] and "Eager" in kinds[None]


@pytest.mark.parametrize("grad_in_forward", [True, False])
def test_gradcheck_in_float64(grad_in_forward):
    hidden, weight, labels = inputs(dtype=torch.float64)
    fn = chunked(chunk_size=5, grad_in_forward=grad_in_forward)
    assert torch.autograd.gradcheck(lambda h, w: fn(h, w, labels), (hidden, weight))


def test_the_tied_head_and_embedding_get_both_gradients():
    """On a real (tied) model: the trunk + chunked loss gives the same gradient to every
    parameter as ``model(ids, labels=ids).loss``, the shared embedding/head matrix included."""
    model = tiny_model().train()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator()
                        .manual_seed(0))
    labels = ids.clone()
    labels[0, :5] = IGNORE_INDEX  # a prompt

    def grads(loss):
        model.zero_grad(set_to_none=True)
        loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    want = grads(model(ids, labels=labels).loss)
    hidden, _ = model.model(ids)
    got = grads(chunked_causal_lm_loss(hidden, model.lm_head.weight, labels, chunk_size=7))
    assert want.keys() == got.keys() and "model.embed_tokens.weight" in got
    for name in want:
        torch.testing.assert_close(got[name], want[name], **FP32, msg=name)


def test_all_ignored_gives_nan_and_zero_gradients_as_f_cross_entropy():
    hidden, weight, labels = inputs()
    labels[:] = IGNORE_INDEX
    for fn in (plain, chunked(4, True), chunked(4, False)):
        loss, d_hidden, d_weight = loss_and_grads(fn, hidden, weight, labels)
        assert loss.isnan()
        assert not d_hidden.any() and not d_weight.any()


def test_without_grad_it_is_the_same_value():
    hidden, weight, labels = inputs()
    with torch.no_grad():
        loss = chunked_causal_lm_loss(hidden, weight, labels, chunk_size=4)
    assert loss.grad_fn is None
    torch.testing.assert_close(loss, plain(hidden, weight, labels).detach(), **FP32)


def test_bad_arguments_are_refused():
    hidden, weight, labels = inputs()
    with pytest.raises(ValueError, match="labels shape"):
        chunked_causal_lm_loss(hidden, weight, labels[:, 1:])
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_causal_lm_loss(hidden, weight, labels, chunk_size=0)
    with pytest.raises(ValueError, match="temperature"):
        chunked_token_logprobs(hidden[0], weight, labels[0], temperature=0.0)


# --- per token: DPO and GRPO ---------------------------------------------------------------


def plain_token_logprobs(rows, weight, targets, temperature):
    return -F.cross_entropy(F.linear(rows, weight).float() / temperature, targets,
                            ignore_index=IGNORE_INDEX, reduction="none")


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_token_logprobs_and_gradients_equal_the_plain_path(temperature, chunk_size):
    hidden, weight, labels = inputs()
    rows, targets = hidden.reshape(-1, C), labels.reshape(-1)  # (21, C), (21,) some ignored
    # a different weight per token, as DPO's and GRPO's losses give (an all-ones weight would
    # miss a backward that used the incoming gradient of one row for all)
    upstream = torch.randn(B * T, generator=torch.Generator().manual_seed(1))
    got = chunked_token_logprobs(rows, weight, targets, temperature, chunk_size)
    want = plain_token_logprobs(rows, weight, targets, temperature)
    torch.testing.assert_close(got, want, **FP32)
    assert not got[targets == IGNORE_INDEX].any()  # 0 where ignored
    got_grads = torch.autograd.grad((got * upstream).sum(), (hidden, weight))
    want_grads = torch.autograd.grad((want * upstream).sum(), (hidden, weight))
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, **FP32)


def test_token_logprobs_gradcheck_in_float64_with_a_temperature():
    hidden, weight, labels = inputs(dtype=torch.float64)
    rows, targets = hidden[0].detach().requires_grad_(), labels[2]  # (T, C), (T,)
    assert torch.autograd.gradcheck(
        lambda h, w: chunked_token_logprobs(h, w, targets, temperature=0.7, chunk_size=3),
        (rows, weight))


def test_token_logprobs_under_bf16_autocast():
    hidden, weight, labels = inputs(seed=2)
    rows, targets = hidden[2], labels[2]  # (T, C), (T,)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = chunked_token_logprobs(rows, weight, targets, 0.7, chunk_size=3)
        want = plain_token_logprobs(rows, weight, targets, 0.7)
    torch.testing.assert_close(got, want, **FP32)  # the same bf16 logits, softmax in fp32
    assert got.dtype == torch.float32


@pytest.mark.parametrize("temperature", [1.0, 0.8])
def test_training_token_logprobs_is_unchanged(temperature):
    """``token_logprobs`` on a MiniMindForCausalLM (the chunked path) equals the same model's
    full logits scored by cross-entropy (the path any other module takes), gradients too."""
    model = tiny_model().train()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, model.config.vocab_size, (2, 10), generator=g)
    labels = ids.clone()
    labels[:, :4] = IGNORE_INDEX  # the prompts
    labels[1, 8:] = IGNORE_INDEX  # padding
    weights = torch.randn(2, 9, generator=g)

    def run(fn):
        model.zero_grad(set_to_none=True)
        out = fn()
        (out * weights).sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    got, got_grads = run(lambda: token_logprobs(model, ids, labels, temperature))
    want, want_grads = run(lambda: -F.cross_entropy(
        model(ids).logits[:, :-1].float().transpose(1, 2) / temperature, labels[:, 1:],
        ignore_index=IGNORE_INDEX, reduction="none"))
    torch.testing.assert_close(got, want, **FP32)
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], **FP32, msg=name)


# --- memory: autograd keeps no tensor with V entries per position ---------------------------


def saved_tensors(fn) -> list[torch.Tensor]:
    """Every tensor autograd saves while ``fn()`` runs (saved-tensor hooks)."""
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return saved


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_autograd_keeps_no_logits_sized_tensor(autocast):
    hidden, weight, labels = inputs()
    positions = B * T
    rows, targets = hidden.reshape(-1, C), labels.reshape(-1)
    runs = {
        "plain": lambda: plain(hidden, weight, labels),
        "chunked, grad in forward": lambda: chunked_causal_lm_loss(hidden, weight, labels, 4),
        "chunked, recompute": lambda: chunked_causal_lm_loss(hidden, weight, labels, 4, False),
        "plain per token": lambda: plain_token_logprobs(rows, weight, targets, 0.7),
        "chunked per token": lambda: chunked_token_logprobs(rows, weight, targets, 0.7, 4),
    }
    with torch.autocast("cpu", dtype=autocast or torch.float32, enabled=autocast is not None):
        largest = {name: max(t.numel() for t in saved_tensors(fn)) for name, fn in runs.items()}
    valid = int((labels[:, 1:] != IGNORE_INDEX).sum())
    # the check can fail: the plain paths keep a (positions, V) tensor (the log-softmax)
    assert largest["plain"] >= valid * V and largest["plain per token"] >= valid * V
    for name in runs:
        if name.startswith("chunked"):
            # the largest is the weight's gradient (V, C) or the hidden rows (N, C)
            assert largest[name] <= max(V, positions) * C < valid * V, name


# --- through the model: ``model(ids, labels=labels)`` takes the chunked path ------------------


def batch(model, seed: int = 0, size: tuple[int, int] = (2, 12)):
    """ids (B, T) and labels with a prompt to skip in row 0 (an SFT batch)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, size, generator=g)
    labels = ids.clone()
    labels[0, :5] = IGNORE_INDEX
    return ids, labels


def loss_and_parameter_grads(model, ids, labels, autocast=None, **kwargs):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=autocast or torch.float32, enabled=autocast is not None):
        out = model(ids, labels=labels, **kwargs)
    out.loss.backward()
    return out, {name: p.grad.clone() for name, p in model.named_parameters()}


MODELS = {
    "tied": dict(),
    "untied": dict(tie_word_embeddings=False),
    "moe": dict(use_moe=True),  # training mode: loss = cross-entropy + aux_loss
}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_the_models_loss_and_gradients_equal_the_plain_path(name, autocast):
    """``model(ids, labels=labels)`` (chunked: no logits) against ``return_logits=True`` (the
    plain path: ``causal_lm_loss(lm_head(hidden), labels)``) on the whole model: the loss, the
    logits returned, every parameter's gradient. Tolerances as the module docstring's: fp32
    rounding, and under bf16 the head weight's gradient to bf16 rounding of its largest entry
    (plain: one bf16 matmul over all positions; chunked: bf16 chunks summed in fp32; the tied
    embedding's gradient adds the lookup's fp32 gradient to it)."""
    model = tiny_model(**MODELS[name]).train()
    ids, labels = batch(model)
    got, got_grads = loss_and_parameter_grads(model, ids, labels, autocast)
    want, want_grads = loss_and_parameter_grads(model, ids, labels, autocast, return_logits=True)
    assert got.logits is None and want.logits.shape == (*ids.shape, model.config.vocab_size)
    if name == "moe":
        assert got.aux_loss > 0  # added to both losses
    else:
        assert "Eager" in type(got.loss.grad_fn).__name__  # the chunked path was taken
    torch.testing.assert_close(got.loss, want.loss, **FP32)
    head = {"lm_head.weight", "model.embed_tokens.weight"}
    for key, grad in want_grads.items():
        tolerance = FP32
        if autocast is not None and key in head:
            tolerance = dict(rtol=0, atol=2**-8 * grad.abs().max().item())
        torch.testing.assert_close(got_grads[key], grad, **tolerance, msg=key)


def test_eval_mode_and_no_grad_give_the_same_loss():
    model = tiny_model(use_moe=True).eval()  # eval: the plain cross-entropy, no aux_loss
    ids, labels = batch(model, seed=1)
    with torch.no_grad():
        got = model(ids, labels=labels)
        want = model(ids, labels=labels, return_logits=True)
    assert got.logits is None and got.loss.grad_fn is None
    torch.testing.assert_close(got.loss, want.loss, **FP32)


def test_an_int8_head_runs_as_a_module():
    """A quantised head is not a plain ``nn.Linear``: the model runs it whole (no weight to give
    the chunked functions) and the loss is still right; ``.logits`` stays None."""
    from minimind_lib.model.chunked_loss import head_weight
    from minimind_lib.model.quantize import quantize_int8

    model = quantize_int8(tiny_model(tie_word_embeddings=False)).eval()
    assert head_weight(model.lm_head) is None
    ids, labels = batch(model, seed=2)
    with torch.no_grad():
        got = model(ids, labels=labels)
        want = causal_lm_loss(model(ids).logits, labels)
    assert got.logits is None
    torch.testing.assert_close(got.loss, want, **FP32)


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_the_models_forward_with_labels_saves_no_logits_sized_tensor(autocast):
    """Every tensor autograd keeps during ``model(ids, labels=labels)`` in training: none has
    B*T*V entries or more (the plain path keeps the (B*T, V) fp32 log-softmax, and under
    autocast the bf16 logits too: checked, so the test can fail)."""
    model = tiny_model().train()
    ids, labels = batch(model, size=(2, 24))
    logits_size = ids.numel() * model.config.vocab_size  # B*T*V
    with torch.autocast("cpu", dtype=autocast or torch.float32, enabled=autocast is not None):
        plain_saved = saved_tensors(lambda: model(ids, labels=labels, return_logits=True))
        chunked_saved = saved_tensors(lambda: model(ids, labels=labels))
    assert max(t.numel() for t in plain_saved) >= logits_size
    biggest = max(chunked_saved, key=torch.Tensor.numel)
    assert biggest.numel() < logits_size, tuple(biggest.shape)
