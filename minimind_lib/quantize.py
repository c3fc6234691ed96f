"""Make the model small: int8 weight-only quantisation from scratch, PyTorch's own dynamic
int8, and fp16/bf16 casts, plus a side-by-side comparison (notebook 07).

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

import copy
import itertools
import json
import math
import os
import shutil
import statistics
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minimind_lib.checkpoint import (
    QUANT_FILE,
    WEIGHTS_FILE,
    atomic_write_text,
    load_model,
    load_weights,
    read_config,
    save_model,
)
from minimind_lib.data import encode_texts, read_jsonl
from minimind_lib.device import pick_device
from minimind_lib.evaluate import (
    answer_budget,
    eval_files,
    evaluate_sft,
    load_eval_records,
    perplexity,
    select_per_task,
    summarize,
)
from minimind_lib.model import MiniMindForCausalLM
from minimind_lib.sft import ModelEval
from minimind_lib.tokenizer import BPETokenizer
from minimind_lib.train import METRICS_FILE

if TYPE_CHECKING:
    from minimind_lib.pipeline import StageContext
    from minimind_lib.profiles import Profile

QMAX = 127  # symmetric int8: -128 is never used, so +x and -x round to +q and -q
FORMAT = "int8-weight-only-per-channel"
SOURCE_STAGE = "dpo"  # the quantize stage shrinks the most trained model
TOKENIZER_FILE = "tokenizer.json"
EVAL_FILE = "eval.json"
TABLE_FILE = "formats.md"


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


def shared_parameter_names(model: nn.Module) -> set[str]:
    """Names of modules' parameters that another module also uses (tied weights).

    >>> emb, head = nn.Embedding(5, 3), nn.Linear(3, 5, bias=False)
    >>> head.weight = emb.weight                  # tied, as MiniMind's lm_head and embedding
    >>> sorted(shared_parameter_names(nn.ModuleDict({"emb": emb, "head": head})))
    ['emb.weight', 'head.weight']
    """
    owners: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(name)
    return {n for names in owners.values() if len(names) > 1 for n in names}


def quantization_groups(model: nn.Module, skip: Iterable[str] = (),
                        embeddings: bool = True) -> list[list[str]]:
    """The module groups ``quantize_int8`` replaces, each a list of module names that share one
    weight (a lone ``nn.Linear``, or a tied embedding and head).

    A group is quantised only when every module in it may be: a Linear, or an Embedding when
    ``embeddings`` is true, and none named in ``skip``.  Quantising one half of a tied pair
    would store a second, int8 copy next to the fp32 one, making the model *bigger*.

    >>> emb, head = nn.Embedding(5, 3), nn.Linear(3, 5, bias=False)
    >>> head.weight = emb.weight
    >>> m = nn.ModuleDict({"emb": emb, "proj": nn.Linear(3, 3), "head": head})
    >>> quantization_groups(m), quantization_groups(m, embeddings=False)
    ([['emb', 'head'], ['proj']], [['proj']])
    """
    skip = set(skip)
    kinds = (nn.Linear, nn.Embedding) if embeddings else (nn.Linear,)
    uses: dict[int, int] = {}  # how many parameter names point at each tensor
    for _, p in model.named_parameters(remove_duplicate=False):
        uses[id(p)] = uses.get(id(p), 0) + 1
    by_weight: dict[int, list[str]] = {}
    for name, m in model.named_modules(remove_duplicate=False):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            by_weight.setdefault(id(m.weight), []).append(name)
    groups = []
    for key, names in by_weight.items():
        modules = [model.get_submodule(n) for n in names]
        if (uses[key] == len(names) and not skip & set(names)
                and all(isinstance(m, kinds) for m in modules)
                and all(getattr(m, "max_norm", None) is None for m in modules)):
            groups.append(names)
    return groups


def _install_group(model: nn.Module, names: list[str], q: Tensor, scale: Tensor) -> None:
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


def quantize_int8(model: nn.Module, skip: Iterable[str] = (), inplace: bool = False,
                  embeddings: bool = True) -> nn.Module:
    """Replace the ``nn.Linear`` (and, with ``embeddings``, ``nn.Embedding``) modules of ``model``
    by int8 ones with per-output-channel scales (see ``quantization_groups``).

    Works on any module tree; ``skip`` names modules to keep.  Norms and biases stay fp32.
    Returns a copy unless ``inplace``.

    >>> m = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> qm = quantize_int8(m)
    >>> [type(layer).__name__ for layer in qm]
    ['QuantLinear', 'ReLU', 'QuantLinear']
    >>> model_size_bytes(m), model_size_bytes(qm)    # 46 fp32 -> 40 int8 + 6 fp32 scales + 6 bias
    (184, 88)
    """
    if not inplace:
        model = copy.deepcopy(model)
    for names in quantization_groups(model, skip, embeddings):
        q, scale = absmax_quantize(model.get_submodule(names[0]).weight)
        _install_group(model, names, q, scale)
    return model


def quantized_groups(model: nn.Module) -> list[list[str]]:
    """The int8 modules of ``model``, grouped by the int8 weight they share."""
    groups: dict[int, list[str]] = {}
    for name, m in model.named_modules(remove_duplicate=False):
        if isinstance(m, (QuantLinear, QuantEmbedding)):
            groups.setdefault(id(m.weight), []).append(name)
    return list(groups.values())


# --------------------------------------------------------------------------- sizes


def _tensor_bytes(t: Tensor) -> int:
    if t.is_quantized:  # PyTorch's packed int8: the int8 values plus its scale/zero-point tensors
        n = t.numel() * t.element_size()
        if t.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
            for aux in (t.q_per_channel_scales(), t.q_per_channel_zero_points()):
                n += aux.numel() * aux.element_size()
        else:
            n += 8 + 8  # one float64 scale and one int64 zero point
        return n
    return t.numel() * t.element_size()


def model_size_bytes(model: nn.Module) -> int:
    """Bytes of the tensors in ``model.state_dict()``, each distinct tensor counted once.

    Tied weights (MiniMind's head and embedding) count once; non-persistent buffers (the RoPE
    tables) are not in the state dict.  PyTorch's dynamically quantised layers keep their
    weights in packed tuples: those are counted too.

    >>> model_size_bytes(nn.Linear(10, 10))     # (100 + 10) fp32 values
    440
    """
    seen: set = set()
    total = 0

    def visit(value: object) -> None:
        nonlocal total
        if isinstance(value, Tensor):
            # a tied weight appears under two names but is one storage
            key = id(value) if value.is_quantized else (value.data_ptr(), value.dtype, value.shape)
            if key not in seen:
                seen.add(key)
                total += _tensor_bytes(value)
        elif isinstance(value, (tuple, list)):
            for v in value:
                visit(v)

    for value in model.state_dict().values():
        visit(value)
    return total


# --------------------------------------------------------------------------- save / load


def save_quantized(model: MiniMindForCausalLM, directory: str | os.PathLike) -> Path:
    """Write an int8 model to ``directory``: a ``checkpoint.save_model`` folder
    (``model.safetensors`` with int8 weights + fp32 scales, ``config.json``) plus
    ``quantization.json`` (the format and the int8 module groups), each file atomic.
    """
    groups = quantized_groups(model)
    if not groups:
        raise ValueError("save_quantized: the model has no int8 layers; "
                         "call quantize_int8(model) first (or use checkpoint.save_model)")
    directory = save_model(model, directory)
    # written last: a folder without it is read as a plain one, which then fails strictly
    atomic_write_text(directory / QUANT_FILE,
                      json.dumps({"format": FORMAT, "groups": groups}, indent=2) + "\n")
    return directory


def is_quantized_checkpoint(directory: str | os.PathLike) -> bool:
    """True when ``directory`` holds a ``save_quantized`` checkpoint."""
    return (Path(directory) / QUANT_FILE).is_file()


def load_quantized(directory: str | os.PathLike,
                   device: str | torch.device = "cpu") -> MiniMindForCausalLM:
    """Inverse of ``save_quantized``; strict: a missing, extra or mis-shaped tensor is an error."""
    directory = Path(directory)
    meta_path = directory / QUANT_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"{meta_path}: no such file ({directory} is not an int8 folder)")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("format") != FORMAT:
        raise ValueError(f"{meta_path}: format is {meta.get('format')!r}, expected {FORMAT!r}")
    model = MiniMindForCausalLM(read_config(directory))
    modules = dict(model.named_modules(remove_duplicate=False))
    groups = meta.get("groups") or []
    bad = [n for g in groups for n in g if not isinstance(modules.get(n), (nn.Linear, nn.Embedding))]
    if bad or not groups:
        raise ValueError(f"{meta_path}: 'groups' must name Linear/Embedding modules of the "
                         f"model; these are not: {bad}")
    for names in groups:  # empty int8 modules of the right shapes; the weights come next
        q, scale = absmax_quantize(torch.zeros_like(modules[names[0]].weight))
        _install_group(model, names, q, scale)
    load_weights(model, directory / WEIGHTS_FILE, device=device)
    return model.to(device).eval()


# --------------------------------------------------------------------------- other formats


def cast_model(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A copy of ``model`` with every floating tensor in ``dtype`` (fp16 / bf16: half the bytes).

    >>> model_size_bytes(cast_model(nn.Linear(10, 10), torch.bfloat16))
    220
    """
    return copy.deepcopy(model).to(dtype)


def torch_int8_unavailable(device: torch.device | str = "cpu") -> str | None:
    """Why PyTorch's dynamic int8 cannot run here, or None when it can."""
    if torch.device(device).type != "cpu":
        return "PyTorch's dynamic int8 kernels run on the CPU only"
    try:
        from torch.ao.quantization import quantize_dynamic  # noqa: F401
    except ImportError:
        return "torch.ao.quantization.quantize_dynamic is not in this torch build"
    if not torch.backends.quantized.supported_engines or \
            torch.backends.quantized.engine == "none":
        return "this torch build has no quantized engine (fbgemm/x86/qnnpack)"
    return None


def quantize_dynamic_torch(model: nn.Module, skip: Iterable[str] = ()) -> nn.Module:
    """PyTorch's own dynamic int8 (``torch.ao.quantization.quantize_dynamic``): int8 weights
    per output channel like ours, and activations quantised to int8 on the fly so the matmul
    itself runs in int8 (fbgemm/x86/qnnpack kernels, CPU only).  It has no dynamic int8
    embedding, so only the untied Linear layers are quantised (a tied head stays fp32).  Returns a copy; raises ``RuntimeError``
    naming the reason where it is unavailable (see ``torch_int8_unavailable``).
    """
    reason = torch_int8_unavailable(next(model.parameters()).device)
    if reason:
        raise RuntimeError(reason)
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    groups = quantization_groups(model, skip, embeddings=False)
    spec = {names[0]: per_channel_dynamic_qconfig for names in groups if len(names) == 1}
    # The torch.ao.quantization API is deprecated (torch >= 2.10 warns on import and on every
    # call; torchao is its successor) but still ships in torch 2.13 and is the reference we
    # compare against: silence exactly those warnings here, deliberately.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_(tensor|channel).*")
        return quantize_dynamic(model, spec, dtype=torch.qint8, inplace=False)


# --------------------------------------------------------------------------- comparison


@dataclass
class Speed:
    """Generation speed: prefill tokens/s (prompt processed in one pass) and decode tokens/s
    (one new token per step with the KV cache)."""

    prefill_tokens_per_s: float
    decode_tokens_per_s: float


def measure_speed(
    models: dict[str, nn.Module],
    prompt_ids: Tensor,
    new_tokens: int = 32,
    repeats: int = 3,
) -> dict[str, Speed]:
    """Time prefill and decode of each model on ``prompt_ids`` (B, T), interleaved.

    Each repeat runs every model once, round robin, so background load hits all of them alike;
    the median over repeats is reported.  Decoding is greedy through ``model.stream`` and runs
    all ``new_tokens`` steps (no early stop).
    """
    for model in models.values():  # warm-up: kernels, allocators, the first KV cache
        _time_generation(model, prompt_ids, 2)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in models}
    for _ in range(repeats):
        for name, model in models.items():
            times[name].append(_time_generation(model, prompt_ids, new_tokens))
    speeds = {}
    for name, runs in times.items():
        prefill = statistics.median(r[0] for r in runs)
        decode = statistics.median(r[1] for r in runs)
        speeds[name] = Speed(prompt_ids.numel() / prefill,
                             prompt_ids.shape[0] * (new_tokens - 1) / decode)
    return speeds


@torch.inference_mode()
def _time_generation(model: nn.Module, prompt_ids: Tensor, new_tokens: int) -> tuple[float, float]:
    if new_tokens < 2:
        raise ValueError(f"new_tokens must be >= 2 to time decoding, got {new_tokens}")
    steps = model.stream(prompt_ids, new_tokens, temperature=0)
    start = time.perf_counter()
    next(steps)  # the prefill: the whole prompt in one forward pass, then the first token
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for _ in steps:
        pass
    return prefill, time.perf_counter() - start


@dataclass
class FormatRow:
    """One line of notebook 07's table."""

    name: str
    size_bytes: int
    prefill_tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    note: str = ""


def build_formats(
    model: MiniMindForCausalLM, device: torch.device | str = "cpu"
) -> tuple[dict[str, nn.Module], dict[str, str]]:
    """The model in every format of the table: fp32 (``model`` itself, moved to ``device``),
    fp16, bf16, int8 (ours), int8 (PyTorch).

    Returns ``(models, skipped)``; ``skipped`` maps a format that cannot run here to the reason.
    """
    model = model.to(device).eval()
    models: dict[str, nn.Module] = {
        "fp32": model,
        "fp16": cast_model(model, torch.float16),
        "bf16": cast_model(model, torch.bfloat16),
        "int8 (ours)": quantize_int8(model),
    }
    skipped: dict[str, str] = {}
    reason = torch_int8_unavailable(device)
    if reason:
        skipped["int8 (PyTorch)"] = reason
    else:
        models["int8 (PyTorch)"] = quantize_dynamic_torch(model)
    return models, skipped


def compare_formats(
    model: MiniMindForCausalLM,
    prompt_ids: Tensor,
    evaluate: Callable[[str, nn.Module], dict[str, float]] | None = None,
    device: torch.device | str = "cpu",
    new_tokens: int = 32,
    repeats: int = 3,
) -> list[FormatRow]:
    """Size, speed and quality of ``model`` in each format of ``build_formats``.

    ``evaluate(format_name, model)`` returns the quality columns (e.g. held-out perplexity and
    exact-match from ``minimind_lib.evaluate``); formats that cannot run here get a row with
    the reason in ``note``.
    """
    models, skipped = build_formats(model, device)
    speeds = measure_speed(models, prompt_ids.to(device), new_tokens, repeats)
    rows = []
    for name, m in models.items():
        values = {col: float(v) for col, v in (evaluate(name, m) if evaluate else {}).items()}
        rows.append(FormatRow(name, model_size_bytes(m), speeds[name].prefill_tokens_per_s,
                              speeds[name].decode_tokens_per_s, values))
    rows += [FormatRow(name, 0, note=f"skipped: {why}") for name, why in skipped.items()]
    return rows


#: how ``format_table`` titles and prints the quality columns it knows (others: 4 digits)
COLUMNS = {"perplexity": ("perplexity", "{:.4g}"), "exact_match": ("exact-match", "{:.1%}")}


def format_table(rows: list[FormatRow]) -> str:
    """A markdown table of ``compare_formats`` rows (size relative to the first row).

    >>> print(format_table([FormatRow("fp32", 4_000_000, 1000.0, 50.0, {"exact_match": 0.25}),
    ...                     FormatRow("int8", 1_000_000, 900.0, 40.0, {"exact_match": 0.25})]))
    | format | size (MB) | size vs fp32 | prefill tok/s | decode tok/s | exact-match |
    |---|---|---|---|---|---|
    | fp32 | 4.00 | 1.00x | 1,000 | 50.0 | 25.0% |
    | int8 | 1.00 | 0.25x | 900 | 40.0 | 25.0% |
    """
    cols = list(dict.fromkeys(c for r in rows for c in r.metrics))  # in order of appearance
    titles = [COLUMNS.get(c, (c, ""))[0] for c in cols]
    head = ["format", "size (MB)", "size vs fp32", "prefill tok/s", "decode tok/s", *titles]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = rows[0].size_bytes
    for r in rows:
        if r.note:
            lines.append(f"| {r.name} | {r.note} |" + " |" * (len(head) - 2))
            continue
        cells = [r.name, f"{r.size_bytes / 1e6:.2f}", f"{r.size_bytes / base:.2f}x",
                 f"{r.prefill_tokens_per_s:,.0f}", f"{r.decode_tokens_per_s:,.1f}",
                 *(COLUMNS.get(c, (c, "{:.4g}"))[1].format(r.metrics[c]) if c in r.metrics
                   else "" for c in cols)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the pipeline stage


@dataclass
class FormatComparison:
    """What ``measure_formats`` measured: the table rows, and per format the held-out scores
    (``sft.ModelEval``: question scores per task and text perplexity)."""

    rows: list[FormatRow]
    evals: dict[str, ModelEval]
    per_task: int
    perplexity_tokens: int


def measure_formats(model: MiniMindForCausalLM, tokenizer: BPETokenizer, profile: Profile,
                    device: str | None = None, progress: bool = False) -> FormatComparison:
    """The format table of notebook 07 and the quantize stage for a trained chat ``model``:
    size, prefill/decode speed on ``device`` (default: the best here), held-out perplexity
    and exact-match, for fp32, fp16, bf16, int8 (ours) and int8 (PyTorch)."""
    # Five formats, each evaluated in full, would cost five times the sft stage's evaluation
    # (and fp16 matmuls are slow on most CPUs): a tenth of its questions (the same ones for
    # every format) and a slice of the held-out text keep the comparison fair and short;
    # perplexity, which needs no generation, is the sharper of the two measures here.
    per_task = max(2, math.ceil(profile.eval_per_task / 10))
    questions = select_per_task(load_eval_records(), per_task)
    budget = answer_budget(tokenizer, questions)
    seq_len = profile.sft.seq_len
    ppl_tokens = profile.eval_per_task * seq_len
    evals: dict[str, ModelEval] = {}

    def evaluate(name: str, m: nn.Module) -> dict[str, float]:
        tasks = evaluate_sft(m, tokenizer, questions, max_new_tokens=budget, progress=progress)
        ppl = perplexity(m, tokenizer, eval_files("pretrain")[0], seq_len, max_tokens=ppl_tokens)
        evals[name] = ModelEval(tasks, ppl)
        return {"perplexity": ppl, "exact_match": summarize(tasks)["all"].exact_match}

    # the speed prompt: held-out text, as long as the training windows (at most 256 tokens)
    texts = (r["text"] for r in read_jsonl(eval_files("pretrain")[0], "pretrain"))
    stream = [i for ids in encode_texts(tokenizer, itertools.islice(texts, 64)) for i in ids]
    prompt = torch.tensor([stream[:min(256, profile.pretrain.seq_len)]])  # (1, T)
    rows = compare_formats(model, prompt, evaluate, device=pick_device(device), new_tokens=16)
    return FormatComparison(rows, evals, per_task, ppl_tokens)


def quantize_stage(ctx: StageContext) -> dict:
    """The ``quantize`` stage: the ``dpo`` stage's model in int8 (a ``save_quantized`` folder
    with the tokenizer files beside it), and the format table measured on it: ``eval.json``
    (per format: held-out perplexity and question scores, as the sft stage writes them),
    ``formats.md`` / ``metrics.jsonl`` (one row per format: size, prefill and decode speed,
    perplexity, exact-match)."""
    profile = ctx.profile
    tokenizer = BPETokenizer.from_file(ctx.dir("tokenizer") / TOKENIZER_FILE)
    model = load_model(ctx.dir(SOURCE_STAGE))
    qmodel = quantize_int8(model)
    save_quantized(qmodel, ctx.out_dir)
    with torch.no_grad():  # what is on disk is what we made (and load_quantized is strict)
        probe = torch.arange(min(16, model.config.vocab_size))[None]  # (1, 16)
        if not torch.equal(load_quantized(ctx.out_dir)(probe).logits, qmodel(probe).logits):
            raise RuntimeError(f"{ctx.out_dir}: the reloaded int8 model differs from the saved one")
    for f in sorted(ctx.dir("tokenizer").glob("*.json")):
        if f.name != "stage.json":  # the folder is self-contained: serve --model works on it
            shutil.copyfile(f, ctx.out_dir / f.name)

    result = measure_formats(model, tokenizer, profile, ctx.device, ctx.progress)
    rows = result.rows

    atomic_write_text(ctx.out_dir / EVAL_FILE, json.dumps(
        {"per_task": result.per_task, "perplexity_tokens": result.perplexity_tokens,
         "models": {name: e.to_dict() for name, e in result.evals.items()}}, indent=2) + "\n")
    atomic_write_text(ctx.out_dir / METRICS_FILE,
                      "".join(json.dumps(asdict(r)) + "\n" for r in rows))
    table = format_table(rows)
    atomic_write_text(ctx.out_dir / TABLE_FILE, table + "\n")
    print(table)
    done = [r for r in rows if not r.note]
    return {"source": SOURCE_STAGE, "format": FORMAT, "eval": EVAL_FILE, "table": TABLE_FILE,
            "size_bytes": {r.name: r.size_bytes for r in done},
            "perplexity": {r.name: r.metrics["perplexity"] for r in done},
            "exact_match": {r.name: r.metrics["exact_match"] for r in done},
            "skipped": {r.name: r.note for r in rows if r.note}}
