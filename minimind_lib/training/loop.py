"""The training engine: one loop for every stage that trains (built up in notebook 04).

``train`` reads in three parts: ``start_run`` (seed, device, optimizer, scaler, resume, the
data stream), ``train_step`` (one optimizer step: accumulate -> unscale -> clip -> step ->
zero, the loop notebook 04 assembles by hand), and around it ``RunLog`` / ``_after_step``
(metrics, validation, checkpoints). One optimizer step of ``train``:

1. set the learning rate: linear warmup, then cosine decay to ``min_lr_ratio`` of the peak
   (Loshchilov & Hutter 2017, SGDR eq. 5, without restarts);
2. ``accumulation_steps`` micro-batches: forward under ``torch.autocast`` (bf16, or fp16 with
   a ``GradScaler``), backward of ``loss / accumulation_steps`` so the summed gradients equal
   one big batch's mean gradient; under DDP, gradients are all-reduced on the last micro-step
   only (``no_sync`` on the others);
3. unscale (fp16), clip the global gradient norm to ``grad_clip``, AdamW step
   (fused on CUDA; no weight decay on norms and biases);
4. a non-finite loss or gradient skips the step (logged); ``max_bad_steps`` in a row stop
   training with ``TrainingDiverged``;
5. log a metrics row (step, loss, lr, grad norm, tokens/s, elapsed), validate every
   ``eval_every`` steps, checkpoint every ``save_every`` steps and at the end.

Precision: ``TrainConfig.precision="auto"`` follows ``minimind_lib.core.device.pick_precision``:
bf16 autocast on CUDA GPUs that support it (else fp16 + scaler), and on a CPU *bf16 where the
CPU has native bf16 instructions* (faster than fp32 there: docs/benchmarks.md), else fp32. Ask for
``"fp32"`` to get the plain fp32 loop anywhere.

Data order is a function of (seed, step) only: step ``s`` reads the global batch
``perm_e[k*G:(k+1)*G]`` with ``e, k = divmod(s, steps_per_epoch)``, ``G`` = batch size x
accumulation x world size, ``perm_e`` a seeded permutation. So a resumed run reads exactly
the batches an uninterrupted one would, and DDP rank ``r`` reads its own micro-batches of
each global batch.

Reuse for other stages: ``dataset`` is any map-style dataset whose ``collate_fn``-made batches
are dicts of tensors; ``loss_fn(model, batch) -> (loss, {name: value})`` replaces the default
``model(input_ids, labels=labels).loss`` (DPO plugs in its loss and logs its rewards). A method
whose step is more than a loss over the next batch plugs in a whole ``Step`` instead: GRPO's
(``grpo.GRPOStep``) reads questions from the stream, samples and rewards answers, then calls
``train_step`` on them; ``eval_fn`` replaces the validation loss (GRPO's greedy accuracy).

>>> from minimind_lib.training.settings import lr_at
>>> lrs = [lr_at(s, max_steps=10, peak_lr=1.0, warmup_steps=2, min_lr_ratio=0.1) for s in range(10)]
>>> [round(x, 3) for x in lrs]
[0.5, 1.0, 1.0, 0.955, 0.831, 0.65, 0.45, 0.269, 0.145, 0.1]
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from minimind_lib.core.atomic import atomic_write_text, disk_full_named, read_json_lines
from minimind_lib.core.device import (
    Precision,
    pick_device,
    pick_precision,
    rng_state,
    seed_everything,
    set_rng_state,
)
from minimind_lib.core.filenames import METRICS_FILE
from minimind_lib.model.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from minimind_lib.training.distributed import DistInfo, init_distributed
from minimind_lib.training.sampling import StepBatchSampler
from minimind_lib.training.settings import LossFn, TrainConfig

#: A validation plug-in: ``eval_fn(model) -> {name: value}``, merged into the step's row.
EvalFn = Callable[[nn.Module], dict[str, float]]


def default_loss(model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
    """Next-token cross-entropy: ``model(input_ids, labels=labels).loss``.  For a MoE model
    (notebook 11) that loss already includes the load-balancing ``aux_loss`` in training mode,
    and ``aux_loss`` is logged as an extra metric; a dense model logs no extra metrics."""
    out = model(batch["input_ids"], labels=batch["labels"])
    aux_loss = getattr(out, "aux_loss", None)
    return out.loss, ({} if aux_loss is None else {"aux_loss": aux_loss})


def flops_per_token(config: Any, seq_len: int) -> float:
    """Training FLOPs per token of a MiniMind model: ``6 N + 12 L C T`` (PaLM, appendix B).

    ``6 N``: forward (2 N) plus backward (4 N) multiply-adds through the ``N`` weights (the tied
    embedding counts once: as the output head's matmul; the lookup costs nothing); ``12 L C T``:
    the attention scores and weighted sums over ``T`` positions in ``L`` layers of width ``C``.
    Model FLOPs utilisation (MFU) = ``flops_per_token * tokens/s / peak FLOP/s``.

    >>> from minimind_lib.model.config import MiniMindConfig
    >>> round(flops_per_token(MiniMindConfig(), 512) / 1e6, 1)  # MiniMind2-Small at T = 512
    180.1
    """
    from minimind_lib.model.decoder import model_size

    n_params = model_size(config)[0]
    return 6 * n_params + 12 * config.num_hidden_layers * config.hidden_size * seq_len


class TrainingDiverged(RuntimeError):
    """Too many optimizer steps in a row had a non-finite loss or gradient."""


# --- pieces of the loop ------------------------------------------------------------------


def make_optimizer(model: nn.Module, config: TrainConfig,
                   device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (>= 2-D) only, not on norms and biases."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.learning_rate, betas=config.betas,
                             fused=device.type == "cuda")


def _to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v
            for k, v in batch.items()}


@torch.no_grad()
def evaluate_loss(model: nn.Module, dataset: Dataset, *, batch_size: int, max_batches: int,
                  device: torch.device, precision: Precision, loss_fn: LossFn = default_loss,
                  collate_fn: Callable | None = None) -> float:
    """Mean loss over the first ``max_batches`` batches of ``dataset`` (fixed order)."""
    was_training = model.training
    model.eval()
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collate_fn)
    total, n = 0.0, 0
    for i, batch in enumerate(loader):
        if i == max_batches:
            break
        with precision.context(device):
            loss, _ = loss_fn(model, _to_device(batch, device))
        total, n = total + loss.float().item(), n + 1
    model.train(was_training)
    if n == 0:
        raise ValueError("the validation dataset is empty")
    return total / n


class MetricsLog:
    """Append-only ``metrics.jsonl`` (one json object per optimizer step)."""

    def __init__(self, path: Path | None, resume_step: int | None):
        self.path = path
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = []
        if resume_step is not None and path.is_file():  # drop rows after the checkpoint
            rows = [r for r in read_json_lines(path) if r["step"] <= resume_step]
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))

    def write(self, row: dict) -> None:
        if self.path is not None:
            with disk_full_named(self.path), self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")


def _wandb_run(config: TrainConfig):
    if not config.wandb_project:
        return None
    try:
        import wandb
    except ImportError:
        warnings.warn("wandb_project is set but wandb is not installed; logging to "
                      "metrics.jsonl only (pip install wandb)", stacklevel=4)
        return None
    return wandb.init(project=config.wandb_project, config=asdict(config))


# --- 1. setup and resume -------------------------------------------------------------------


@dataclass
class TrainRun:
    """What ``start_run`` prepares for the loop: where the model runs, its optimizer and loss
    scaler, the micro-batch stream, and where training (re)starts."""

    model: nn.Module
    forward: nn.Module  # the model, or its compiled / DDP wrapper: what the loss calls
    params: list[nn.Parameter]  # the trainable parameters, in model order (for clipping)
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    batches: Iterator[dict]
    device: torch.device
    precision: Precision
    info: DistInfo
    data_pos: dict  # what a resumed run must share with this one
    start_step: int = 0
    tokens_seen: int = 0
    elapsed0: float = 0.0  # seconds trained before a resume


def start_run(model: nn.Module, dataset: Dataset, config: TrainConfig, *,
              collate_fn: Callable | None = None, resume: bool = False) -> TrainRun:
    """Seed, place the model, build optimizer and scaler, resume from the latest checkpoint
    (``resume=True``), and start the data stream at the right step."""
    info = init_distributed()
    device = pick_device(config.device)
    if device.type == "cuda" and info.world_size > 1:
        device = torch.device("cuda", info.local_rank)
    precision = pick_precision(device, config.precision)
    if resume and config.out_dir is None:
        raise ValueError("resume=True needs TrainConfig.out_dir (where the checkpoints are)")
    seed_everything(config.seed)
    model.to(device).train()
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    optimizer = make_optimizer(model, config, device)
    scaler = torch.amp.GradScaler(device.type, enabled=precision.use_scaler)
    data_pos = {"dataset_len": len(dataset), "batch_size": config.batch_size,
                "accumulation_steps": config.accumulation_steps,
                "world_size": info.world_size, "seed": config.seed}
    if config.group_by_length:  # another order of the same examples
        data_pos["group_by_length"] = True
    run = TrainRun(model, model, [p for p in model.parameters() if p.requires_grad], optimizer,
                   scaler, iter(()), device, precision, info, data_pos)
    saved_rng = _resume(run, Path(config.out_dir)) if resume else None

    sampler = StepBatchSampler(len(dataset), batch_size=config.batch_size,
                               accumulation_steps=config.accumulation_steps,
                               world_size=info.world_size, rank=info.rank, seed=config.seed,
                               start_step=run.start_step, max_steps=config.max_steps,
                               lengths=_lengths(dataset) if config.group_by_length else None)
    # subtle: a DataLoader draws a seed from the generator it is given (else from the global
    # RNG) when it starts iterating; a private generator keeps the global stream untouched.
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_fn,
                        num_workers=config.num_workers, pin_memory=device.type == "cuda",
                        generator=torch.Generator())
    run.batches = iter(loader)
    if saved_rng is not None:
        set_rng_state(saved_rng)  # after the loader started, so the streams line up exactly
    run.forward = torch.compile(model) if config.compile else model
    if info.world_size > 1:
        run.forward = DistributedDataParallel(
            run.forward, device_ids=[device.index] if device.type == "cuda" else None)
    return run


def _lengths(dataset: Dataset) -> Sequence[int]:
    """Tokens per example, for ``group_by_length``: the dataset's ``lengths``."""
    lengths = getattr(dataset, "lengths", None)
    if lengths is None:
        raise ValueError(f"group_by_length needs a dataset with lengths; "
                         f"{type(dataset).__name__} has none")
    return lengths


def _resume(run: TrainRun, out_dir: Path) -> dict | None:
    """Load the latest checkpoint of ``out_dir`` into ``run``; its RNG state (None: no
    checkpoint)."""
    ckpt = latest_checkpoint(out_dir)
    if ckpt is None:
        if run.info.is_main:
            print(f"no checkpoint in {out_dir}; starting from step 0")
        return None
    state = load_checkpoint(ckpt, run.model, device=run.device)
    _check_resumable(state["data"], run.data_pos, ckpt)
    run.optimizer.load_state_dict(state["optimizer"])
    run.scaler.load_state_dict(state["scaler"])
    run.start_step, run.elapsed0 = state["step"], state["elapsed_s"]
    run.tokens_seen = state["tokens_seen"]
    if run.info.is_main:
        print(f"resuming from {ckpt} at step {run.start_step}")
    return state["rng"][run.info.rank]


# --- 2. one optimizer step -----------------------------------------------------------------


@dataclass
class StepResult:
    """What one optimizer step measured: the mean loss (and the loss function's extra
    metrics) over its micro-batches, the gradient norm before clipping, the tokens it read,
    and whether it was finite (a non-finite step is skipped, not applied)."""

    values: dict[str, float]
    tokens: int
    finite: bool


def train_step(forward: nn.Module, batches: Iterator[dict], optimizer: torch.optim.Optimizer,
               scaler: torch.amp.GradScaler, params: list[nn.Parameter], loss_fn: LossFn, *,
               accumulation_steps: int, grad_clip: float, precision: Precision,
               device: torch.device, world_size: int = 1) -> StepResult:
    """One optimizer step, the loop notebook 04 assembles:
    accumulate -> unscale -> clip -> step -> zero.

    1. ``accumulation_steps`` micro-batches, each forward under autocast and backward of
       ``loss / accumulation_steps`` (scaled by the ``GradScaler`` for fp16), so the summed
       gradients equal one big batch's mean gradient (DDP syncs on the last one only);
    2. unscale (fp16), so clipping sees the true gradients;
    3. clip the global gradient norm to ``grad_clip`` (0: no clipping);
    4. step, unless the loss or gradient is not finite (fp16's scaler also skips overflows);
    5. zero the gradients.
    """
    sums: dict[str, torch.Tensor] = {}
    tokens = 0
    for micro in range(accumulation_steps):  # 1. accumulate
        batch = _to_device(next(batches), device)
        tokens += batch["input_ids"].numel() * world_size
        last = micro == accumulation_steps - 1
        sync = contextlib.nullcontext() if last or world_size == 1 else forward.no_sync()
        with sync:
            with precision.context(device):
                loss, extra = loss_fn(forward, batch)
            # mean over micro-batches: sum of (loss / A) grads == big-batch mean gradient
            scaler.scale(loss / accumulation_steps).backward()
        for name, value in {"loss": loss, **extra}.items():
            value = torch.as_tensor(value, device=device).detach().float()
            sums[name] = sums[name] + value if name in sums else value
    if precision.use_scaler:
        scaler.unscale_(optimizer)  # 2. clip the true gradients, not the scaled ones
    max_norm = grad_clip if grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)  # 3. clip
    values = _step_means(sums, grad_norm, accumulation_steps, world_size, device)
    finite = math.isfinite(values["loss"]) and (precision.use_scaler
                                                or math.isfinite(values["grad_norm"]))
    if finite:
        scaler.step(optimizer)  # 4. (with fp16 it skips the update itself on overflow)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)  # 5.
    return StepResult(values, tokens, finite)


class Step(Protocol):
    """What ``train`` repeats once per optimizer step: ``step(run, step) -> StepResult``, with
    ``desc`` (the progress bar's name) and ``postfix(row)`` (what the bar shows). ``train`` sets
    the learning rate before it and does the logging, validation, checkpointing and resuming
    around it. ``BatchStep`` is the usual one; GRPO's (``grpo.GRPOStep``) samples and rewards
    answers first, then calls ``train_step`` itself."""

    desc: str

    def __call__(self, run: TrainRun, step: int) -> StepResult: ...

    def postfix(self, row: dict) -> dict[str, str]: ...


@dataclass
class BatchStep:
    """The engine's usual ``Step``: ``train_step`` over the next ``accumulation_steps``
    micro-batches of the run's data stream, with ``loss_fn`` (the default loss, SFT's, DPO's)."""

    loss_fn: LossFn
    accumulation_steps: int
    grad_clip: float
    desc: str = "train"

    def __call__(self, run: TrainRun, step: int) -> StepResult:
        return train_step(run.forward, run.batches, run.optimizer, run.scaler, run.params,
                          self.loss_fn, accumulation_steps=self.accumulation_steps,
                          grad_clip=self.grad_clip, precision=run.precision, device=run.device,
                          world_size=run.info.world_size)

    @staticmethod
    def postfix(row: dict) -> dict[str, str]:
        return {"loss": f"{row['loss']:.3f}", "lr": f"{row['lr']:.2e}",
                "tok_s": f"{row['tokens_per_s']:.0f}"}


def _step_means(sums: dict[str, torch.Tensor], grad_norm: torch.Tensor, accumulation_steps: int,
                world_size: int, device: torch.device) -> dict[str, float]:
    """Per-micro-batch means of the summed metrics, and the grad norm, averaged over ranks."""
    names = sorted(sums)
    packed = torch.stack([sums[n] for n in names] + [grad_norm.float()]) / torch.tensor(
        [accumulation_steps] * len(names) + [1.0], device=device)
    if world_size > 1:
        dist.all_reduce(packed)  # every rank sees the same numbers, so all skip together
        packed /= world_size  # (the grad norm is identical on every rank already)
    return dict(zip(names + ["grad_norm"], packed.tolist(), strict=True))


# --- 3. logging, evaluation and saving around the steps ------------------------------------


class RunLog:
    """Where each step's metrics row goes: ``metrics.jsonl``, Weights & Biases, the callbacks
    and the progress bar (rank 0 only)."""

    def __init__(self, config: TrainConfig, run: TrainRun, resume: bool,
                 callbacks: Sequence[Callable[[dict], None]], step_fn: Step):
        main = run.info.is_main
        out_dir = Path(config.out_dir) if config.out_dir is not None else None
        self.metrics = MetricsLog(out_dir / METRICS_FILE if out_dir and main else None,
                                  run.start_step if resume else None)
        self.wandb_run = _wandb_run(config) if main else None
        self.callbacks = list(callbacks) if main else []
        self.bar = tqdm(total=config.max_steps, initial=run.start_step,
                        disable=not (config.progress and main), desc=step_fn.desc,
                        dynamic_ncols=True)
        self.postfix = step_fn.postfix

    def write(self, row: dict) -> None:
        self.metrics.write(row)
        if self.wandb_run is not None:
            self.wandb_run.log(row, step=row["step"])
        for callback in self.callbacks:
            callback(row)

    def advance(self, row: dict) -> None:
        self.bar.set_postfix(self.postfix(row), refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()


def _after_step(run: TrainRun, config: TrainConfig, row: dict, eval_fn: EvalFn | None) -> None:
    """Validate every ``eval_every`` steps and checkpoint every ``save_every`` (and at the end)."""
    step, is_last = row["step"], row["step"] == config.max_steps
    if row.get("skipped") and run.info.is_main:
        print(f"step {step}: non-finite loss/gradient (loss={row['loss']}, "
              f"grad_norm={row['grad_norm']}); step skipped")
    if eval_fn is not None and run.info.is_main and (step % config.eval_every == 0 or is_last):
        row.update(eval_fn(run.model))
    if config.out_dir is not None and (step % config.save_every == 0 or is_last):
        _save(Path(config.out_dir), step, run, row["elapsed_s"], config)


def _check_resumable(saved: dict, current: dict, path: Path) -> None:
    for key in ("dataset_len", "batch_size", "accumulation_steps", "world_size", "seed"):
        if saved[key] != current[key]:
            raise ValueError(f"cannot resume from {path}: its {key} was {saved[key]}, now "
                             f"{current[key]} (the data position would not line up)")


# --- the loop ----------------------------------------------------------------------------


def train(model: nn.Module, dataset: Dataset, config: TrainConfig, *,
          loss_fn: LossFn | None = None, eval_dataset: Dataset | None = None,
          collate_fn: Callable | None = None, resume: bool = False,
          callbacks: Sequence[Callable[[dict], None]] = (), step_fn: Step | None = None,
          eval_fn: EvalFn | None = None, eval_loss_fn: LossFn | None = None) -> list[dict]:
    """Train ``model`` on ``dataset``; return this call's metrics rows (one per optimizer step).

    Three parts: ``start_run`` (setup and resume), one ``Step`` per optimizer step
    (``train_step`` over the data stream, unless ``step_fn`` says otherwise), and around it
    logging, validation and checkpoints. With ``config.out_dir`` set: rows are
    appended to ``out_dir/metrics.jsonl`` and checkpoints written to ``out_dir/checkpoints/``;
    ``resume=True`` continues from the latest checkpoint there (or starts fresh when there is
    none). ``callbacks`` get each row as it is logged (e.g. ``plotting.LiveLossPlot``). Under
    ``torchrun`` every rank calls ``train``; rank 0 logs and saves.

    The plug-ins: ``loss_fn(model, batch)`` replaces the default loss; ``step_fn(run, step)``
    replaces the whole optimizer step (``BatchStep`` by default; GRPO samples in its own);
    ``eval_fn(model) -> {name: value}`` replaces the validation loss on ``eval_dataset``;
    ``eval_loss_fn`` is the loss validated there when it is not the training one
    (distillation: it trains on the teacher's KL, validates plain cross-entropy).
    ``eval_dataset`` may be a mapping ``{metric name: dataset}`` to validate on several sets
    (DPO: ``{"val_loss": on-policy pairs, "offline_val_loss": offline pairs}``).
    """
    loss_fn = loss_fn or default_loss
    info = init_distributed()
    config = config.resolved(len(dataset), info.world_size)
    if config.out_dir is not None and info.is_main:  # a stage's run: say what it will do
        print(plan_line(config, len(dataset), info.world_size))
    run = start_run(model, dataset, config, collate_fn=collate_fn, resume=resume)
    step_fn = step_fn or BatchStep(loss_fn, config.accumulation_steps, config.grad_clip)
    if eval_fn is None and eval_dataset is not None:
        sets = (dict(eval_dataset) if isinstance(eval_dataset, Mapping)
                else {"val_loss": eval_dataset})
        eval_fn = partial(_validation_loss, sets=sets, config=config, run=run,
                          loss_fn=eval_loss_fn or loss_fn, collate_fn=collate_fn)
    log = RunLog(config, run, resume, callbacks, step_fn)
    rows, bad_streak, t_start = [], 0, time.perf_counter()
    for step in range(run.start_step, config.max_steps):
        t0 = time.perf_counter()
        lr = config.lr(step)
        for group in run.optimizer.param_groups:
            group["lr"] = lr
        result = step_fn(run, step)
        bad_streak = 0 if result.finite else bad_streak + 1
        run.tokens_seen += result.tokens
        t1 = time.perf_counter()
        row = {"step": step + 1, **result.values, "lr": lr, "tokens": run.tokens_seen,
               "tokens_per_s": result.tokens / max(t1 - t0, 1e-9),
               "elapsed_s": run.elapsed0 + t1 - t_start}
        if not result.finite:
            row["skipped"] = True
        _after_step(run, config, row, eval_fn)
        rows.append(row)
        log.write(row)
        if bad_streak >= config.max_bad_steps:
            log.close()
            raise TrainingDiverged(
                f"training stopped at step {step + 1}: {bad_streak} optimizer steps in a row had "
                f"a non-finite loss or gradient. Lower the learning rate (now "
                f"{config.learning_rate:g}) or train in bf16 instead of fp16 "
                f"(precision is {run.precision.name}).")
        log.advance(row)
    log.close()
    return rows


def _validation_loss(model: nn.Module, *, sets: Mapping[str, Dataset], config: TrainConfig,
                     run: TrainRun, loss_fn: LossFn,
                     collate_fn: Callable | None) -> dict[str, float]:
    """The default validation: per named set (``val_loss`` by default), the mean loss of its
    first ``eval_batches`` batches."""
    return {name: evaluate_loss(model, dataset, batch_size=config.batch_size,
                                max_batches=config.eval_batches, device=run.device,
                                precision=run.precision, loss_fn=loss_fn, collate_fn=collate_fn)
            for name, dataset in sets.items()}


def plan_line(config: TrainConfig, num_examples: int, world_size: int = 1) -> str:
    """What a run will do, in one line (logged when a stage starts training).

    >>> plan_line(TrainConfig(batch_size=16, seq_len=512, max_steps=500), num_examples=2000)
    '[plan] 500 steps x 16 sequences (<= 8,192 tokens) = 4.0 passes over 2,000 examples'
    """
    batch = config.batch_size * config.accumulation_steps * world_size
    return (f"[plan] {config.max_steps:,} steps x {batch} sequences (<= {batch * config.seq_len:,}"
            f" tokens) = {config.max_steps * batch / max(num_examples, 1):.1f} passes over "
            f"{num_examples:,} examples")


def _save(out_dir: Path, step: int, run: TrainRun, elapsed: float, config: TrainConfig) -> None:
    rngs = [rng_state()]
    if run.info.world_size > 1:  # every rank's RNG (dropout streams differ), saved by rank 0
        rngs = [None] * run.info.world_size
        dist.all_gather_object(rngs, rng_state())
    if run.info.is_main:
        config_row = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()}
        state = {"step": step, "optimizer": run.optimizer.state_dict(),
                 "scaler": run.scaler.state_dict(), "rng": rngs, "data": run.data_pos,
                 "tokens_seen": run.tokens_seen, "elapsed_s": elapsed, "config": config_row}
        save_checkpoint(out_dir, step, run.model, state, keep=config.keep_checkpoints)
    if run.info.world_size > 1:
        dist.barrier()
