"""What a training run is told (notebook 04): ``TrainSettings`` (hyper-parameters and the budget,
in steps or passes over the data), ``RunOptions`` (how the engine runs: compile, gradient
checkpointing, workers, logging), ``TrainConfig`` (both, plus output folder, precision, device
and seed), and the learning-rate schedule ``lr_at``.

>>> config = TrainConfig(max_steps=4, warmup_steps=1, learning_rate=1e-3)
>>> [round(config.lr(step) / 1e-3, 3) for step in range(4)]   # warmup, then cosine to 10%
[1.0, 1.0, 0.55, 0.1]
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from minimind_lib.core.device import (
    PRECISIONS,
)

LossFn = Callable[[nn.Module, dict], "tuple[torch.Tensor, dict[str, Any]]"]


def lr_at(step: int, *, max_steps: int, peak_lr: float, warmup_steps: int,
          min_lr_ratio: float) -> float:
    """Linear warmup to ``peak_lr`` over ``warmup_steps``, then cosine decay to
    ``min_lr_ratio * peak_lr`` at the last step (``max_steps - 1``)."""
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    min_lr = min_lr_ratio * peak_lr
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - 1 - warmup_steps))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak_lr - min_lr)


#: Upper bounds past any real run (a billion steps; a million-token sequence): a value above
#: one is a typo (``--set pretrain.max_steps=1e20``), refused before anything starts
LIMITS = {"max_steps": 10**9, "warmup_steps": 10**9, "eval_every": 10**9, "save_every": 10**9,
          "eval_batches": 10**6, "batch_size": 2**20, "seq_len": 2**20,
          "accumulation_steps": 2**16, "max_examples": 10**12}


def require_at_most(settings: object, limits: dict[str, int]) -> None:
    """``ValueError`` naming the first field of ``settings`` above its limit."""
    for name, limit in limits.items():
        value = getattr(settings, name, None)
        if value is not None and value > limit:
            raise ValueError(f"{type(settings).__name__}.{name} is {value:,}, over the limit of "
                             f"{limit:,}")


def require_positive(settings: object, *fields: str) -> None:
    """Raise ``ValueError`` naming the first of ``fields`` of ``settings`` that is not > 0.

    >>> require_positive(TrainSettings(), "batch_size", "seq_len")
    """
    for field_name in fields:
        if getattr(settings, field_name) <= 0:
            raise ValueError(f"{type(settings).__name__}.{field_name} must be positive, got "
                             f"{getattr(settings, field_name)}")


@dataclass(frozen=True)
class TrainSettings:
    """The hyper-parameters of one training run: the one place each is defined.

    A profile holds one per stage (``profile.pretrain``, ``profile.sft``; DPO's adds ``beta``:
    ``minimind_lib.training.dpo.DPOSettings``); ``TrainConfig`` adds how and where to run. An
    optimizer step sees ``batch_size * accumulation_steps`` sequences of ``seq_len`` tokens per
    process.
    The budget is ``max_steps`` optimizer steps, or ``epochs`` passes over the data (then
    ``max_steps``, when also set, caps it): ``planned_steps`` resolves it once the data's size
    is known, so a profile's budget fits whatever data is present. ``max_examples`` caps how
    many examples (documents, conversations, pairs) a stage reads (None = all).

    >>> s = TrainSettings(batch_size=4, seq_len=64, accumulation_steps=2, max_steps=None, epochs=2)
    >>> s.tokens_per_step, s.planned_steps(num_examples=100)   # 12 steps a pass (8 a step)
    (512, 24)
    """

    batch_size: int = 8
    seq_len: int = 128  # tokens per training sequence (datasets are cut to it)
    learning_rate: float = 3e-4
    max_steps: int | None = 100  # optimizer steps (a cap when ``epochs`` is set too)
    epochs: float | None = None  # passes over the data; the steps follow from its size
    accumulation_steps: int = 1
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1  # cosine decays to this fraction of the peak
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW
    eval_every: int = 50
    eval_batches: int = 20  # validation batches per evaluation
    save_every: int = 200  # checkpoint period in steps (and always at the end)
    max_examples: int | None = None

    def __post_init__(self) -> None:
        name = type(self).__name__
        require_positive(self, "batch_size", "seq_len", "accumulation_steps", "eval_every",
                         "eval_batches", "save_every")
        if self.max_steps is None and self.epochs is None:
            raise ValueError(f"{name} needs a budget: max_steps or epochs (or both)")
        if self.max_steps is not None and self.max_steps <= 0:
            raise ValueError(f"{name}.max_steps must be positive, got {self.max_steps}")
        if self.epochs is not None and not 0 < self.epochs < 1e6:
            raise ValueError(f"{name}.epochs must be positive, got {self.epochs}")
        if self.learning_rate <= 0:
            raise ValueError(f"{name}.learning_rate must be positive, got {self.learning_rate}")
        if self.warmup_steps < 0:
            raise ValueError(f"{name}.warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"{name}.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.max_examples is not None and self.max_examples <= 0:
            raise ValueError(f"{name}.max_examples must be positive or None, "
                             f"got {self.max_examples}")
        require_at_most(self, LIMITS)
        object.__setattr__(self, "betas", tuple(self.betas))

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.accumulation_steps * self.seq_len

    @property
    def budget(self) -> str:
        """The budget in words.

        >>> TrainSettings(epochs=4, max_steps=3800).budget, TrainSettings(max_steps=80).budget
        ('4 passes, at most 3,800 steps', '80 steps')
        """
        parts = [f"{self.epochs:g} passes" if self.epochs is not None else "",
                 (f"at most {self.max_steps:,} steps" if self.epochs is not None
                  else f"{self.max_steps:,} steps") if self.max_steps is not None else ""]
        return ", ".join(p for p in parts if p)

    def planned_steps(self, num_examples: int, world_size: int = 1) -> int:
        """Optimizer steps of a run over ``num_examples`` examples: ``max_steps``, or ``epochs``
        passes (each ``num_examples // global batch`` steps, as ``StepBatchSampler`` reads
        them), capped by ``max_steps`` when both are set; at least 1."""
        if self.epochs is None:
            return self.max_steps
        per_pass = num_examples // (self.batch_size * self.accumulation_steps * world_size)
        steps = max(1, math.ceil(self.epochs * per_pass))
        return steps if self.max_steps is None else min(steps, self.max_steps)

    def resolved(self, num_examples: int, world_size: int = 1):
        """These settings with the budget in steps (``planned_steps``) and ``epochs`` cleared:
        what a run over ``num_examples`` examples will do (``train`` resolves its config so).

        >>> TrainSettings(batch_size=10, max_steps=None, epochs=2).resolved(55).max_steps
        10
        """
        if self.epochs is None:
            return self
        return replace(self, max_steps=self.planned_steps(num_examples, world_size), epochs=None)


#: DataLoader worker processes: more than a few per core only thrash (each holds a copy)
MAX_WORKERS = max(8, 4 * (os.cpu_count() or 1))


@dataclass(frozen=True)
class RunOptions:
    """How the engine runs, apart from what it learns: none of these changes the result
    (``compile`` only within float rounding), so none enters a stage's fingerprint.
    Profiles hold one (``profile.train``; ``--set train.gradient_checkpointing=true``)."""

    compile: bool = False  # torch.compile the model
    gradient_checkpointing: bool = False  # recompute each block in backward: less memory
    num_workers: int = 0  # DataLoader worker processes
    max_bad_steps: int = 5  # consecutive non-finite steps before giving up
    keep_checkpoints: int = 1
    wandb_project: str | None = None  # log to Weights & Biases too, when installed

    def __post_init__(self) -> None:
        require_positive(self, "max_bad_steps", "keep_checkpoints")
        if self.num_workers < 0:
            raise ValueError(f"{type(self).__name__}.num_workers must be >= 0, got "
                             f"{self.num_workers}")
        require_at_most(self, {"num_workers": MAX_WORKERS, "keep_checkpoints": 10**4,
                               "max_bad_steps": 10**6})


@dataclass(frozen=True)
class TrainConfig(TrainSettings, RunOptions):
    """A training run: the hyper-parameters (``TrainSettings``), how the engine runs
    (``RunOptions``), and where: output folder, precision, device, seed, progress bar. Each
    field is defined once, in one of the three.

    ``batch_size`` is the micro-batch of one process; an optimizer step sees
    ``batch_size * accumulation_steps * world_size`` sequences.

    >>> TrainConfig(max_steps=0)
    Traceback (most recent call last):
    ...
    ValueError: TrainConfig.max_steps must be positive, got 0
    """

    out_dir: str | Path | None = None  # None: no metrics file and no checkpoints
    precision: str = "auto"  # auto | fp32 | bf16 | fp16 (see module docstring)
    device: str | None = None  # None: minimind_lib.core.device.pick_device()
    seed: int = 42
    progress: bool = True  # tqdm bar (rank 0 only)
    group_by_length: bool = False  # steps of alike lengths (StepBatchSampler; needs .lengths)

    def __post_init__(self) -> None:
        TrainSettings.__post_init__(self)
        RunOptions.__post_init__(self)
        if self.precision not in PRECISIONS:
            raise ValueError(f"TrainConfig.precision is {self.precision!r}; choose one of "
                             f"{', '.join(PRECISIONS)}")

    @classmethod
    def from_stage(cls, settings: TrainSettings, options: RunOptions | None = None,
                   **overrides: Any) -> TrainConfig:
        """A run of a profile stage's settings (and the profile's ``RunOptions``), e.g.
        ``TrainConfig.from_stage(profile.pretrain, profile.train, out_dir=d)``: every
        ``TrainSettings`` and ``RunOptions`` field is carried over (a subclass's own fields,
        such as DPO's ``beta``, stay with the stage); ``overrides`` replace any field.

        >>> from minimind_lib.course.profiles import get_profile
        >>> c = TrainConfig.from_stage(get_profile("smoke").pretrain, precision="fp32")
        >>> (c.batch_size, c.max_steps, c.precision)
        (8, 80, 'fp32')
        """
        values = {f.name: getattr(settings, f.name) for f in fields(TrainSettings)}
        if options is not None:
            values |= {f.name: getattr(options, f.name) for f in fields(RunOptions)}
        return cls(**{**values, **overrides})


    def lr(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based)."""
        return lr_at(step, max_steps=self.max_steps, peak_lr=self.learning_rate,
                     warmup_steps=self.warmup_steps, min_lr_ratio=self.min_lr_ratio)
