"""LoRA: fine-tune two small matrices per layer instead of every weight (notebook 09).

Low-rank adaptation (Hu et al. 2021, "LoRA", eq. 3 and section 4.1) freezes a pretrained
weight ``W0`` (``d x k``) and learns a low-rank update beside it::

    h = W0 x + (alpha / r) * B A x,        A: (r, k),  B: (d, r),  r << min(d, k)

``A`` starts random (Kaiming-uniform, as ``nn.Linear`` and PEFT initialise it) and ``B`` at
zero, so ``B A = 0``: training starts exactly at the base model. ``alpha / r`` scales the
update so that, with Adam, changing ``r`` needs little re-tuning of the learning rate (the
paper sets ``alpha`` once and leaves it). Only ``A`` and ``B`` train: ``r (d + k)``
parameters per matrix instead of ``d k``, and AdamW keeps its two moments (8 bytes per
parameter in fp32) for those alone (``optimizer_state_bytes`` measures it).

After training the update folds into the weight, ``W = W0 + (alpha / r) B A``
(``merge_lora``): a plain model again, as fast as the base, saved with ``save_model``.

The adapter on its own is a few hundred kB: ``save_adapter`` writes it in the format of
Hugging Face's PEFT library (``adapter_config.json`` + ``adapter_model.safetensors``, tensors
named ``base_model.model.<module>.lora_A.weight`` as PEFT names them for a
``LlamaForCausalLM``), so ``peft.PeftModel.from_pretrained(hf.to_hf(base), folder)`` loads it
(``tests/test_lora.py`` checks it gives the merged model's logits).

MiniMind's ``model/model_lora.py`` adds ``B A x`` (rank 8, no ``alpha / r``, ``A`` from
N(0, 0.02)) to every *square* linear layer, which for MiniMind2-Small is ``q_proj`` and
``o_proj``; here the targets are named (``target_modules``), as in PEFT.

>>> from minimind_lib.model.config import MiniMindConfig
>>> from minimind_lib.model.decoder import MiniMindForCausalLM
>>> model = MiniMindForCausalLM(MiniMindConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
...                                            num_attention_heads=4, num_key_value_heads=2))
>>> ids = torch.tensor([[1, 2, 3]])
>>> before = model(ids).logits
>>> add_lora(model, rank=4, alpha=8, target_modules=("q_proj", "v_proj"))
['model.layers.0.self_attn.q_proj', 'model.layers.0.self_attn.v_proj', \
'model.layers.1.self_attn.q_proj', 'model.layers.1.self_attn.v_proj']
>>> torch.equal(model(ids).logits, before)   # B = 0: the same model
True
>>> count_parameters(model).trainable        # 2 layers x (4 x (32 + 32) + 4 x (32 + 16))
896
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from minimind_lib.core.atomic import atomic_path, atomic_write_text
from minimind_lib.core.checked_files import read_json
from minimind_lib.core.filenames import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE
from minimind_lib.data.conversations import SFTDataset
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.training.loop import train
from minimind_lib.training.settings import RunOptions, TrainConfig, TrainSettings

#: The projections of a MiniMind (= Llama) block, by the names PEFT's ``target_modules`` uses.
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
#: How PEFT prefixes a ``LlamaForCausalLM``'s module names in ``adapter_model.safetensors``
#: (``PeftModelForCausalLM.base_model`` is a ``LoraModel`` whose ``.model`` is the Llama).
PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class LoRASettings(TrainSettings):
    """The ``lora`` stage's hyper-parameters: a ``TrainSettings`` plus the adapter's shape.

    ``rank`` r, ``alpha`` (the update is scaled by ``alpha / rank``), ``dropout`` on the
    adapter's input (PEFT's ``lora_dropout``), ``target_modules`` the projections that get an
    adapter in every layer (names from ``ATTENTION`` and ``MLP``).

    >>> LoRASettings(rank=8, alpha=16).scaling
    2.0
    >>> LoRASettings(target_modules=("lm_head",))
    Traceback (most recent call last):
    ...
    ValueError: LoRASettings.target_modules: 'lm_head' is not a projection; choose from q_proj, \
k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj
    """

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ATTENTION
    replay: float = 0.0  # share of the training conversations replayed from the SFT data

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "target_modules", tuple(self.target_modules))
        _check_shape(self.rank, self.alpha, self.dropout, f"{type(self).__name__}.")
        _check_targets(self.target_modules, f"{type(self).__name__}.")
        if not 0.0 <= self.replay < 1.0:
            raise ValueError(f"{type(self).__name__}.replay must be in [0, 1), got {self.replay}")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def _check_shape(rank: object, alpha: object, dropout: object, prefix: str,
                 names: tuple[str, str, str] = ("rank", "alpha", "dropout")) -> None:
    """ValueError ``<prefix><name> must be ...`` for a bad rank, alpha or dropout."""
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        raise ValueError(f"{prefix}{names[0]} must be a positive integer, got {rank!r}")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not alpha > 0:
        raise ValueError(f"{prefix}{names[1]} must be a positive number, got {alpha!r}")
    if not isinstance(dropout, int | float) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"{prefix}{names[2]} must be in [0, 1), got {dropout!r}")


def _check_targets(targets: Sequence[str], prefix: str) -> None:
    if not targets:
        raise ValueError(f"{prefix}target_modules is empty: name at least one projection")
    for name in targets:
        if name not in ATTENTION + MLP:
            raise ValueError(f"{prefix}target_modules: {name!r} is not a projection; choose "
                             f"from {', '.join(ATTENTION + MLP)}")


class LoRALinear(nn.Linear):
    """A frozen ``nn.Linear`` plus the trainable update ``(alpha / r) B A`` (Hu et al. eq. 3).

    It *is* a linear layer (``weight`` keeps its name, so the rest of the state dict does not
    change); ``lora_A`` (r, in) and ``lora_B`` (out, r) are PEFT's ``lora_A.weight`` and
    ``lora_B.weight``.

    >>> base = nn.Linear(6, 4, bias=False)
    >>> layer = LoRALinear.from_linear(base, rank=2, alpha=4)
    >>> x = torch.randn(3, 6)
    >>> torch.equal(layer(x), base(x)), layer.weight is base.weight, layer.weight.requires_grad
    (True, True, False)
    >>> _ = nn.init.normal_(layer.lora_B)
    >>> torch.allclose(layer(x), layer.merged()(x), atol=1e-6)
    True
    """

    def __init__(self, in_features: int, out_features: int, *, rank: int, alpha: float,
                 dropout: float = 0.0, bias: bool = False) -> None:
        super().__init__(in_features, out_features, bias=bias)
        _check_shape(rank, alpha, dropout, f"{type(self).__name__}: ")
        self.rank, self.alpha = rank, alpha
        self.scaling = alpha / rank
        self.lora_A = nn.Parameter(torch.empty(rank, in_features))  # (r, k)
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank))  # (d, r): B A = 0 at start
        # subtle: nn.Linear's own init (Kaiming-uniform with a = sqrt(5)), as PEFT does for A
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, rank: int, alpha: float,
                    dropout: float = 0.0) -> LoRALinear:
        """A ``LoRALinear`` around ``linear``'s own (now frozen) weight and bias tensors."""
        layer = cls(linear.in_features, linear.out_features, rank=rank, alpha=alpha,
                    dropout=dropout, bias=linear.bias is not None)
        weight = linear.weight
        layer.weight = weight  # the same Parameter: no copy, and tied uses stay tied
        layer.bias = linear.bias
        for p in (layer.weight, layer.bias):
            if p is not None:
                p.requires_grad_(False)
        return layer.to(device=weight.device, dtype=weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = F.linear(x, self.weight, self.bias)  # (..., d)
        down = F.linear(self.lora_dropout(x), self.lora_A)  # (..., r)
        return base + self.scaling * F.linear(down, self.lora_B)  # (..., d)

    def delta_weight(self) -> torch.Tensor:
        """The update ``(alpha / r) B A`` as a (d, k) matrix, computed in fp32."""
        return self.scaling * (self.lora_B.float() @ self.lora_A.float())  # (d, k)

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """A plain ``nn.Linear`` with weight ``W0 + (alpha / r) B A`` (and the same bias)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                           device=self.weight.device, dtype=self.weight.dtype)
        linear.weight.copy_(self.weight.float() + self.delta_weight())
        if self.bias is not None:
            linear.bias.copy_(self.bias)
        return linear

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, alpha={self.alpha:g}"


# --- putting adapters in, counting, taking them out -----------------------------------------


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """The adapted layers of ``model`` by module name (empty: no LoRA in it)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def add_lora(model: nn.Module, *, rank: int, alpha: float, dropout: float = 0.0,
             target_modules: Sequence[str] = ATTENTION) -> list[str]:
    """Freeze every parameter of ``model`` and give each linear layer whose name ends in one of
    ``target_modules`` (``q_proj``, ..., ``down_proj``, in every layer) a LoRA update, in place.
    Returns the adapted module names. Only the adapters' ``A`` and ``B`` are trainable after it.
    """
    _check_shape(rank, alpha, dropout, "add_lora: ")
    _check_targets(target_modules, "add_lora: ")
    if lora_layers(model):
        raise ValueError("the model already has LoRA layers; merge_lora it first")
    chosen = [name for name, m in model.named_modules()
              if isinstance(m, nn.Linear) and name.rpartition(".")[2] in target_modules]
    missing = sorted(set(target_modules) - {name.rpartition(".")[2] for name in chosen})
    if missing:
        raise ValueError(f"target_modules {missing} match no linear layer of the model")
    model.requires_grad_(False)
    for name in chosen:
        _set_submodule(model, name, LoRALinear.from_linear(
            model.get_submodule(name), rank=rank, alpha=alpha, dropout=dropout))
    return chosen


@torch.no_grad()
def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its weight (``W0 + (alpha / r) B A``), in place, and make every
    parameter trainable again: ``model`` is a plain model (``save_model`` works on it)."""
    for name, layer in lora_layers(model).items():
        _set_submodule(model, name, layer.merged())
    return model.requires_grad_(True)


@dataclass(frozen=True)
class ParameterCount:
    """Trainable and total parameters (a tied weight counted once), as PEFT's
    ``print_trainable_parameters`` counts them: the total includes the adapters."""

    trainable: int
    total: int

    @property
    def share(self) -> float:
        return self.trainable / self.total

    def __str__(self) -> str:
        return (f"trainable {self.trainable:,} of {self.total:,} parameters "
                f"({self.share:.2%})")


def count_parameters(model: nn.Module) -> ParameterCount:
    """``ParameterCount`` of ``model`` (``model.parameters()`` yields a tied weight once)."""
    params = list(model.parameters())
    return ParameterCount(sum(p.numel() for p in params if p.requires_grad),
                          sum(p.numel() for p in params))


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors ``optimizer`` keeps between steps (AdamW: ``exp_avg`` and
    ``exp_avg_sq`` per trainable parameter, plus a scalar ``step``); 0 before its first step.

    >>> w = nn.Parameter(torch.zeros(10, 10))
    >>> opt = torch.optim.AdamW([w])
    >>> w.grad = torch.ones_like(w)
    >>> opt.step()
    >>> optimizer_state_bytes(opt)    # 2 moments x 100 fp32 values + the fp32 step
    804
    """
    return sum(t.numel() * t.element_size() for state in optimizer.state.values()
               for t in state.values() if torch.is_tensor(t))


# --- PEFT's adapter format ------------------------------------------------------------------


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' tensors under PEFT's names (fp32, on the CPU):
    ``base_model.model.<module>.lora_A.weight`` (r, k) and ``...lora_B.weight`` (d, r)."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError("the model has no LoRA layers (add_lora first)")
    out = {}
    for name, layer in layers.items():
        for part in ("A", "B"):
            tensor = getattr(layer, f"lora_{part}").detach().float().cpu().contiguous()
            out[f"{PEFT_PREFIX}{name}.lora_{part}.weight"] = tensor
    return out


def adapter_config(model: nn.Module, base_model_name_or_path: str | None = None) -> dict:
    """``adapter_config.json`` for the adapters of ``model``: PEFT's ``LoraConfig`` fields for
    plain LoRA on a causal LM (one rank and alpha for every layer)."""
    layers = list(lora_layers(model).items())
    if not layers:
        raise ValueError("the model has no LoRA layers (add_lora first)")
    shapes = {(layer.rank, layer.alpha, _dropout_p(layer)) for _, layer in layers}
    if len(shapes) != 1:
        raise ValueError(f"PEFT's config holds one rank/alpha/dropout; the model mixes {shapes}")
    rank, alpha, dropout = shapes.pop()
    targets = sorted({name.rpartition(".")[2] for name, _ in layers},
                     key=(ATTENTION + MLP).index)
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base_model_name_or_path,
            "r": rank, "lora_alpha": alpha, "lora_dropout": dropout, "target_modules": targets,
            "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
            "init_lora_weights": True, "inference_mode": True, "modules_to_save": None,
            "layers_to_transform": None, "layers_pattern": None,
            "rank_pattern": {}, "alpha_pattern": {}}


def _dropout_p(layer: LoRALinear) -> float:
    return layer.lora_dropout.p if isinstance(layer.lora_dropout, nn.Dropout) else 0.0


def save_adapter(model: nn.Module, directory: str | Path,
                 base_model_name_or_path: str | None = None) -> Path:
    """Write the adapters of ``model`` to ``directory`` in PEFT's format (atomically, file by
    file): ``adapter_config.json`` and ``adapter_model.safetensors``."""
    import safetensors.torch

    directory = Path(directory)
    tensors = adapter_state_dict(model)
    config = adapter_config(model, base_model_name_or_path)
    with atomic_path(directory / ADAPTER_WEIGHTS_FILE) as tmp:
        safetensors.torch.save_file(tensors, str(tmp), metadata={"format": "pt"})
    atomic_write_text(directory / ADAPTER_CONFIG_FILE, json.dumps(config, indent=2) + "\n")
    return directory


#: adapter_config.json fields this module cannot honour -> the values it accepts for them
_PLAIN_LORA = {"use_dora": (False, None), "use_rslora": (False, None),
               "fan_in_fan_out": (False, None), "bias": ("none", None),
               "modules_to_save": (None, []), "layers_to_transform": (None,),
               "rank_pattern": ({}, None), "alpha_pattern": ({}, None)}


def read_adapter_config(directory: str | Path) -> LoRASettings:
    """The adapter shape of a PEFT LoRA folder's ``adapter_config.json``; a field this module
    cannot honour (DoRA, rsLoRA, per-layer ranks, ...) is an error naming the file and field."""
    path = Path(directory) / ADAPTER_CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (not a LoRA adapter folder)")
    config = read_json(path)
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{path}: field 'peft_type' must be \"LORA\"")
    for key, accepted in _PLAIN_LORA.items():
        if config.get(key) not in accepted:
            raise ValueError(f"{path}: field {key!r} is {config[key]!r}; only {accepted[0]!r} "
                             "(plain LoRA) is supported")
    targets = config.get("target_modules")
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise ValueError(f"{path}: field 'target_modules' must be a list of module names "
                         f"(got {targets!r})")
    rank, alpha, dropout = config.get("r"), config.get("lora_alpha"), config.get("lora_dropout", 0)
    _check_shape(rank, alpha, dropout, f"{path}: field ", ("'r'", "'lora_alpha'", "'lora_dropout'"))
    _check_targets(targets, f"{path}: field ")
    return LoRASettings(rank=rank, alpha=alpha, dropout=dropout, target_modules=tuple(targets))


def load_adapter(model: nn.Module, directory: str | Path) -> list[str]:
    """Add the adapters of a PEFT LoRA folder to ``model`` (in place, as ``add_lora`` does) and
    load their weights; strict: every tensor must be there with its shape, and no other."""
    import safetensors.torch

    shape = read_adapter_config(directory)
    path = Path(directory) / ADAPTER_WEIGHTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (the adapter's weights)")
    tensors = safetensors.torch.load_file(str(path))
    names = add_lora(model, rank=shape.rank, alpha=shape.alpha, dropout=shape.dropout,
                     target_modules=shape.target_modules)
    expected = adapter_state_dict(model)
    missing, unexpected = sorted(expected.keys() - tensors), sorted(tensors.keys() - expected)
    if missing or unexpected:
        merge_lora(model)  # leave no half-loaded adapters behind (B = 0: the weights unchanged)
        raise ValueError(f"{path}: missing {missing[:3]}, unexpected {unexpected[:3]} "
                         f"({len(missing)} missing, {len(unexpected)} unexpected tensors)")
    with torch.no_grad():
        for name, layer in lora_layers(model).items():
            for part in ("A", "B"):
                key, param = (f"{PEFT_PREFIX}{name}.lora_{part}.weight",
                              getattr(layer, f"lora_{part}"))
                if tensors[key].shape != param.shape:
                    merge_lora(model)
                    raise ValueError(f"{path}: {key} has shape {tuple(tensors[key].shape)}, the "
                                     f"model needs {tuple(param.shape)}")
                param.copy_(tensors[key])
    return names


# --- training -----------------------------------------------------------------------------


def with_replay(new: Sequence[dict], old: Sequence[dict], share: float, seed: int) -> list[dict]:
    """``new`` plus a seeded sample of ``old`` that makes up ``share`` of the result, shuffled.

    Replaying some of the data a model was trained on is the simplest guard against
    forgetting it while it learns something else (InstructGPT's "PPO-ptx" mixes pretraining
    batches into RLHF for the same reason: Ouyang et al. 2022, eq. 2). LoRA forgets less than
    full fine-tuning but still forgets (Biderman et al. 2024, "LoRA Learns Less and Forgets
    Less"); notebook 09 measures both, with and without replay.

    >>> mixed = with_replay([{"new": i} for i in range(6)], [{"old": i} for i in range(50)],
    ...                     share=0.25, seed=0)
    >>> len(mixed), sum("old" in r for r in mixed)
    (8, 2)
    """
    if not 0.0 <= share < 1.0:
        raise ValueError(f"the replayed share must be in [0, 1), got {share}")
    wanted = round(len(new) * share / (1 - share))
    if wanted > len(old):
        raise ValueError(f"replaying {share:.0%} of {len(new):,} conversations needs {wanted:,} "
                         f"old ones; only {len(old):,} given")
    rng = random.Random(seed)
    mixed = list(new) + rng.sample(list(old), wanted)
    rng.shuffle(mixed)
    return mixed


def finetune(model: nn.Module, tokenizer: BPETokenizer, records: Iterable[dict],
             settings: TrainSettings, *, seed: int, eval_records: Sequence[dict] | None = None,
             options: RunOptions | None = None, out_dir: str | Path | None = None,
             resume: bool = False, precision: str = "auto", device: str | None = None,
             progress: bool = True,
             callbacks: Iterable[Callable[[dict], None]] = ()) -> list[dict]:
    """Supervised fine-tuning (answer-only loss, ``minimind_lib.training.sft``) of the parameters of
    ``model`` that require a gradient, on the conversations ``records``: after ``add_lora``
    the adapters, otherwise every weight (full fine-tuning: the comparison arm). The
    validation loss is the answer loss on ``eval_records``. Returns the metrics rows."""
    train_set = SFTDataset(records, tokenizer, settings.seq_len,
                           max_examples=settings.max_examples, progress=False)
    val_set = (SFTDataset(eval_records, tokenizer, settings.seq_len, progress=False)
               if eval_records else None)
    config = TrainConfig.from_stage(settings, options, out_dir=out_dir, precision=precision,
                                    device=device, seed=seed, progress=progress)
    return train(model, train_set, config, eval_dataset=val_set, collate_fn=train_set.collate,
                 resume=resume, callbacks=list(callbacks))
