"""int8 weight-only layers, from scratch (notebook 07): what an int8 model folder holds
(``FORMAT`` in its ``quantization.json``) and how ``checkpoint.load_model`` rebuilds it.

Symmetric absmax quantisation (Jacob et al. 2018, eq. 1 with zero-point 0) maps a weight row
``w`` to integers ``q = round(w / s)`` in [-127, 127] with one scale per output channel
``s = max|w| / 127``, and back with ``w ≈ s · q``.  Each weight is off by at most ``s / 2``, so
one scale per *row* (per output channel) keeps a row with small weights from paying for an
outlier elsewhere in the matrix.  ``QuantLinear`` stores ``q`` (int8, 1 byte a weight) and
``s`` (fp32, one per row) and computes ``x Wᵀ = (x qᵀ) · s``: the dequantisation is a cast
and a per-column scale of the output, done on the fly in the input's dtype.
``QuantEmbedding`` does the same per token row, so MiniMind's tied embedding and head share
one int8 matrix and the whole model shrinks to about a quarter of its fp32 bytes.

>>> layer = nn.Linear(4, 2, bias=False)
>>> _ = layer.weight.data.copy_(torch.tensor([[1.0, -0.5, 0.25, 0.0], [0.01, 0.02, -0.03, 0.0]]))
>>> q = QuantLinear.from_linear(layer)
>>> q.weight.tolist()                                   # each row uses its full int8 range
[[127, -64, 32, 0], [42, 85, -127, 0]]
>>> bool((q.dequantized_weight() - layer.weight).abs().max() <= q.weight_scale.max() / 2)
True
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

QMAX = 127  # symmetric int8: -128 is never used, so +x and -x round to +q and -q
FORMAT = "int8-weight-only-per-channel"


# --------------------------------------------------------------------------- absmax, from scratch


def absmax_quantize(w: Tensor, per_channel: bool = True) -> tuple[Tensor, Tensor]:
    """Symmetric int8 quantisation of a 2-D weight ``w`` (out, in).

    Returns ``(q, scale)``: ``q`` int8 (out, in) and ``scale`` fp32, shape (out,) per channel
    (one scale per output row) or () per tensor.  ``dequantize(q, scale)`` ≈ ``w``, off by at
    most ``scale / 2`` per element.  An all-zero row gets scale 0 (and dequantises to 0).

    >>> q, s = absmax_quantize(torch.tensor([[0.5, -1.0], [0.0, 0.0]]))
    >>> q.tolist(), s.tolist()
    ([[64, -127], [0, 0]], [0.007874015718698502, 0.0])
    >>> absmax_quantize(torch.tensor([[0.5, -1.0], [0.1, 0.0]]), per_channel=False)[0].tolist()
    [[64, -127], [13, 0]]
    """
    if w.dim() != 2:
        raise ValueError(f"absmax_quantize expects a 2-D weight (out, in), "
                         f"got shape {tuple(w.shape)}")
    w = w.detach().float()
    amax = w.abs().amax(dim=1) if per_channel else w.abs().amax()  # (out,) or ()
    scale = amax / QMAX
    # subtle: divide by 1 where the scale is 0 (an all-zero row) so q is 0, not NaN
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    divisor = safe[:, None] if per_channel else safe  # (out, 1) or ()
    q = torch.round(w / divisor).clamp(-QMAX, QMAX).to(torch.int8)  # (out, in)
    return q, scale


def dequantize(q: Tensor, scale: Tensor) -> Tensor:
    """``scale · q`` in fp32; ``scale`` is (out,) per channel or () per tensor.

    >>> dequantize(torch.tensor([[127, -64]], dtype=torch.int8), torch.tensor([0.01])).tolist()
    [[1.2699999809265137, -0.6399999856948853]]
    """
    s = scale[:, None] if scale.dim() == 1 else scale  # (out, 1) or ()
    return q.float() * s  # (out, in)


class QuantLinear(nn.Module):
    """A ``nn.Linear`` whose weight is stored as int8 plus one fp32 scale per output channel.

    Buffers (so they are saved, moved by ``.to(device)`` and never trained): ``weight`` int8
    (out, in), ``weight_scale`` fp32 (out,), ``bias`` (out,) or None.  ``forward`` casts the
    int8 weight to the input's dtype and scales the output: ``(x qᵀ) · s`` equals
    ``x (s · q)ᵀ`` because ``s`` scales whole rows of the weight.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.ones(out_features))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> QuantLinear:
        """Quantise a trained ``nn.Linear`` (per output channel)."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None)
        layer.weight, layer.weight_scale = absmax_quantize(linear.weight)
        if linear.bias is not None:
            layer.bias = linear.bias.detach().float().clone()
        return layer.to(linear.weight.device)

    def dequantized_weight(self) -> Tensor:
        """The fp32 weight this layer stands for (out, in)."""
        return dequantize(self.weight, self.weight_scale)

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight.to(x.dtype))  # (..., out): x qᵀ (autocast may pick the dtype)
        y = y * self.weight_scale.to(y.dtype)  # (..., out): · s, column by column
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"


class QuantEmbedding(nn.Module):
    """A ``nn.Embedding`` stored as int8 rows plus one fp32 scale per row (per token).

    Row ``i`` of an embedding is token ``i``'s vector, and it is also output channel ``i`` of a
    head tied to it: so one int8 matrix with per-row scales serves both, and a tied model stays
    tied (``quantize_int8`` shares the buffers between the two modules).

    >>> emb = nn.Embedding(3, 2)
    >>> q = QuantEmbedding(3, 2)
    >>> q.weight, q.weight_scale = absmax_quantize(emb.weight)
    >>> ids = torch.tensor([[0, 2]])
    >>> q(ids).shape, bool((q(ids) - emb(ids)).abs().max() <= q.weight_scale.max() / 2)
    (torch.Size([1, 2, 2]), True)
    """

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.register_buffer("weight", torch.zeros(num_embeddings, embedding_dim, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.ones(num_embeddings))

    def forward(self, ids: Tensor) -> Tensor:
        rows = F.embedding(ids, self.weight)  # (B, T, C) int8
        return rows.float() * self.weight_scale[ids][..., None]  # (B, T, C): s_i · q_i

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8 per-row"


def install_int8_group(model: nn.Module, names: list[str], q: Tensor, scale: Tensor) -> None:
    """Replace the modules ``names`` (sharing one weight) by int8 ones sharing ``q``/``scale``."""
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, child)
        if isinstance(old, nn.Embedding):
            new = QuantEmbedding(old.num_embeddings, old.embedding_dim)
        else:
            new = QuantLinear(old.in_features, old.out_features, old.bias is not None)
            if old.bias is not None:
                new.bias = old.bias.detach().float().clone()
        new.weight, new.weight_scale = q, scale  # subtle: the SAME tensors: a tie stays a tie
        setattr(parent, child, new.to(q.device))


def quantized_groups(model: nn.Module) -> list[list[str]]:
    """The int8 modules of ``model``, grouped by the int8 weight they share."""
    groups: dict[int, list[str]] = {}
    for name, m in model.named_modules(remove_duplicate=False):
        if isinstance(m, (QuantLinear, QuantEmbedding)):
            groups.setdefault(id(m.weight), []).append(name)
    return list(groups.values())


def install_int8_layers(model: nn.Module, groups: list[list[str]], source: str = "groups") -> None:
    """Replace the modules named in ``groups`` (lists of names sharing one weight, as
    ``quantized_groups`` returns them) by int8 modules of the same shapes, with zero weights:
    how ``checkpoint.load_model`` rebuilds an int8 folder before loading its tensors strictly.
    ``source`` names where ``groups`` came from, for the error message.

    >>> m = nn.Sequential(nn.Linear(4, 2))
    >>> install_int8_layers(m, [["0"]])
    >>> type(m[0]).__name__, m[0].weight.dtype
    ('QuantLinear', torch.int8)
    """
    modules = dict(model.named_modules(remove_duplicate=False))
    bad = [n for g in groups for n in g
           if not isinstance(modules.get(n), (nn.Linear, nn.Embedding))]
    if bad or not groups:
        raise ValueError(f"{source}: 'groups' must name Linear/Embedding modules of the "
                         f"model; these are not: {bad}")
    for names in groups:
        q, scale = absmax_quantize(torch.zeros_like(modules[names[0]].weight))
        install_int8_group(model, names, q, scale)
