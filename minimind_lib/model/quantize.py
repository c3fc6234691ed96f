"""Making a model small (notebook 07): ``quantize_int8`` swaps every Linear and the tied
embedding for the int8 layers of ``model.int8`` (one int8 matrix where two modules share a
weight), ``model_size_bytes`` counts what a state dict holds, ``cast_model`` gives fp16 and bf16
copies, and ``quantize_dynamic_torch`` is PyTorch's own dynamic int8 to compare against.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from minimind_lib.model.int8 import absmax_quantize, install_int8_group


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
        install_int8_group(model, names, q, scale)
    return model


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
    embedding, so only the untied Linear layers are quantised (a tied head stays fp32).  Returns
    a copy; raises ``RuntimeError`` naming the reason where it is unavailable (see
    ``torch_int8_unavailable``).
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
