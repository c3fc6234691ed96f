"""What a profile will do before it does it: tokens, steps, passes over the data and time.

``python -m minimind_lib plan --profile P [--json]`` prints, for each training stage, the
tokens planned and available, passes over the data, optimizer steps and tokens per step, and
an estimated time on a few named GPUs and on this CPU. (Each training run also logs its plan,
exactly, when it starts: ``training.loop.train``.)

Assumptions, stated once:

* training FLOPs per token: ``6N + 12 L C T`` (``training.loop.flops_per_token``; PaLM appendix B);
  DPO adds a forward pass (``2N`` per token) over its pairs for the reference log-probs, and
  on-policy DPO the sampling: ``samples`` forward passes over each question and its answer;
* GRPO is not planned here: each of its steps samples as much as it trains (its own log
  prints the time per step);
* GPUs: the dense bf16 tensor-core TFLOP/s with fp32 accumulation in ``GPU_TFLOPS`` (NVIDIA's
  datasheets and architecture whitepapers), at ``GPU_MFU`` model FLOPs utilisation. 25% is an
  assumption for a 26M-parameter model (small matmuls, fp32 norms and a 6,400-way softmax keep
  it well below large models' 40-50%); ``benchmarks/gpu_check.py`` measures the real figure;
* this CPU: two real training steps of the profile's model, timed here (``--no-cpu-probe``
  skips them);
* evaluation (held-out questions, perplexity) is not included.

Token counts are exact when the data is small (under ``EXACT_LIMIT_BYTES``: every document is
tokenised), else estimated from the first ``SAMPLE_BYTES`` of each file (``estimated: true``).
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from minimind_lib.core.device import pick_precision
from minimind_lib.course.profiles import Profile
from minimind_lib.course.stages import STAGES
from minimind_lib.data.conversations import SFTDataset
from minimind_lib.data.readers import dataset_files, read_jsonl
from minimind_lib.model.decoder import MiniMindForCausalLM
from minimind_lib.tokenizer.bpe import COURSE_TOKENIZER, BPETokenizer
from minimind_lib.training.dpo import DPOSettings
from minimind_lib.training.loop import flops_per_token
from minimind_lib.training.rollout import verifiable_questions
from minimind_lib.training.settings import TrainSettings

#: dense bf16 tensor TFLOP/s with fp32 accumulation (fp16 is the same on these cards)
GPU_TFLOPS = {"RTX 3060": 25.4, "RTX 4060": 30.2, "RTX 3090": 71.0, "RTX 4090": 165.2,
              "A100": 312.0, "H100": 989.0}
GPU_MFU = 0.25
EXACT_LIMIT_BYTES = 64 * 2**20
SAMPLE_BYTES = 16 * 2**20
VAL_EVERY = 50  # data.tokenize_corpus sends every 50th document to validation (val_fraction 0.02)


@dataclass(frozen=True)
class StagePlan:
    """One training stage of a profile, on the data present."""

    stage: str
    examples_available: int  # pretraining windows, SFT conversations or DPO pairs
    tokens_available: int
    tokens_per_step: int  # at most: SFT/DPO batches are padded to their longest example
    steps: int
    tokens_planned: int
    passes: float  # passes over the available examples
    flops: float
    estimated: bool  # token counts extrapolated from a sample of big files

    def seconds(self, flops_per_second: float) -> float:
        return self.flops / flops_per_second


@dataclass(frozen=True)
class _Data:
    examples: int
    tokens: int  # all of them (train split for pretraining)
    estimated: bool


def _documents(paths: list[Path], schema: str, max_examples: int | None) -> tuple[list, bool]:
    """The records to count: all of them when the files are small, else a sample."""
    total = sum(p.stat().st_size for p in paths)
    records = itertools.chain.from_iterable(read_jsonl(p, schema) for p in paths)
    if total <= EXACT_LIMIT_BYTES:
        return list(itertools.islice(records, max_examples)), False
    sample, size = [], 0
    for r in itertools.islice(records, max_examples):
        sample.append(r)
        size += len(json.dumps(r, ensure_ascii=False).encode()) + 1
        if size >= SAMPLE_BYTES:
            break
    return sample, True


def _scale(paths: list[Path], sample: list, max_examples: int | None) -> float:
    """How many times more records the files hold than ``sample`` (by bytes, then capped)."""
    size = sum(len(json.dumps(r, ensure_ascii=False).encode()) + 1 for r in sample)
    factor = sum(p.stat().st_size for p in paths) / max(size, 1)
    if max_examples is not None:
        factor = min(factor, max_examples / len(sample))
    return max(factor, 1.0)


def _pretrain_data(paths: list[Path], tokenizer: BPETokenizer, settings: TrainSettings) -> _Data:
    docs, estimated = _documents(paths, "pretrain", settings.max_examples)
    encoded = tokenizer.encode_batch([d["text"] for d in docs], allowed_special="all")
    train_tokens = sum(len(ids) + 1 for n, ids in enumerate(encoded)
                       if n % VAL_EVERY != VAL_EVERY - 1)  # + 1: the end-of-text token
    if estimated:
        train_tokens = int(train_tokens * _scale(paths, docs, settings.max_examples))
    return _Data(max(0, (train_tokens - 1) // settings.seq_len), train_tokens, estimated)


def _sft_data(paths: list[Path], tokenizer: BPETokenizer, settings: TrainSettings) -> _Data:
    chats, estimated = _documents(paths, "sft", settings.max_examples)
    dataset = SFTDataset(chats, tokenizer, settings.seq_len, progress=False)
    factor = _scale(paths, chats, settings.max_examples) if estimated else 1.0
    return _Data(int(len(dataset) * factor), int(dataset.lengths.sum() * factor), estimated)


def _dpo_data(paths: list[Path], tokenizer: BPETokenizer, settings: DPOSettings) -> _Data:
    if settings.pairs == "on_policy":  # paths are SFT files: the questions the pairs come from
        return _on_policy_data(paths, tokenizer, settings)
    pairs, estimated = _documents(paths, "dpo", settings.max_examples)
    sides = [p[side] for p in pairs for side in ("chosen", "rejected")]
    dataset = SFTDataset([{"conversations": s} for s in sides], tokenizer, settings.seq_len,
                         progress=False)
    factor = _scale(paths, pairs, settings.max_examples) if estimated else 1.0
    return _Data(int(len(pairs) * factor), int(dataset.lengths.sum() * factor), estimated)


def _on_policy_data(paths: list[Path], tokenizer: BPETokenizer, settings: DPOSettings) -> _Data:
    """On-policy DPO: at most one pair per sampled question (none where every sample is right),
    each side about as long as the question with its reference answer: an upper bound."""
    records, estimated = _documents(paths, "sft", None)
    questions = verifiable_questions(records, settings.tasks)[:settings.questions]
    chats = [{"conversations": q.messages + [{"role": "assistant", "content": q.answer}]}
             for q in questions]
    dataset = SFTDataset(chats, tokenizer, settings.seq_len, progress=False)
    return _Data(len(questions), 2 * int(dataset.lengths.sum()), estimated)


_COUNTERS = {"pretrain": _pretrain_data, "sft": _sft_data, "dpo": _dpo_data}
#: The stages a plan covers, in stage order (lora trains on generated data, grpo on samples)
PLANNED_STAGES = tuple(s for s in STAGES if s in _COUNTERS)


def stage_plan(stage: str, profile: Profile, tokenizer: BPETokenizer) -> StagePlan:
    """The plan of training stage ``stage`` on the data ``profile`` uses."""
    settings: TrainSettings = STAGES[stage].settings_in(profile)
    on_policy = stage == "dpo" and settings.pairs == "on_policy"
    data = _COUNTERS[stage](dataset_files("sft" if on_policy else stage, profile.data_dir),
                            tokenizer, settings)
    batch = settings.batch_size * settings.accumulation_steps
    n = MiniMindForCausalLM(profile.model).num_parameters()
    if stage == "pretrain":
        steps = settings.planned_steps(data.examples)
        planned = steps * settings.tokens_per_step
        flops = flops_per_token(profile.model, settings.seq_len) * planned
        return StagePlan(stage, data.examples, data.tokens, settings.tokens_per_step, steps,
                         planned, steps * batch / max(data.examples, 1), flops, data.estimated)
    examples = data.examples  # the dpo stage samples max_steps x batch pairs at most
    if stage == "dpo" and settings.max_steps is not None:
        examples = min(examples, settings.max_steps * batch)
    steps = settings.planned_steps(examples)
    mean_tokens = data.tokens / max(data.examples, 1)  # per conversation, or per pair (2 sides)
    planned = int(steps * batch * mean_tokens)
    flops = flops_per_token(profile.model, int(mean_tokens)) * planned
    if stage == "dpo":  # the reference scores every sampled pair once, forward only
        flops += 2 * n * examples * mean_tokens
    if on_policy:  # every question answered `samples` times: prompt + answer, forward only
        flops += 2 * n * settings.samples * data.tokens / 2
    return StagePlan(stage, data.examples, data.tokens, settings.tokens_per_step, steps, planned,
                     steps * batch / max(data.examples, 1), flops, data.estimated)


def cpu_flops_per_second(profile: Profile, steps: int = 2) -> float:
    """Training FLOP/s of the profile's model on this CPU: ``steps`` timed optimizer steps of
    up to 4 sequences of ``profile.pretrain.seq_len`` tokens (after one warm-up step), in the
    precision training would pick here; the fastest step counts."""
    device = torch.device("cpu")
    precision = pick_precision(device)
    model = MiniMindForCausalLM(profile.model).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    seq, batch = profile.pretrain.seq_len, min(4, profile.pretrain.batch_size)
    ids = torch.randint(0, profile.model.vocab_size, (batch, seq))
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        with precision.context(device):
            loss = model(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return flops_per_token(profile.model, seq) * batch * seq / min(times[1:])


def plan(profile: Profile, *, cpu_probe: bool = True,
         tokenizer: BPETokenizer | None = None) -> dict:
    """The plan of every training stage of ``profile`` as a json-able dict: per stage the
    ``StagePlan`` fields and ``seconds`` per named GPU (and ``cpu`` when probed)."""
    tokenizer = tokenizer or BPETokenizer.from_file(COURSE_TOKENIZER)
    rates = {name: tflops * 1e12 * GPU_MFU for name, tflops in GPU_TFLOPS.items()}
    if cpu_probe:
        rates["this CPU"] = cpu_flops_per_second(profile)
    stages = {}
    for stage in PLANNED_STAGES:
        p = stage_plan(stage, profile, tokenizer)
        stages[stage] = {**asdict(p), "seconds": {name: p.seconds(r) for name, r in rates.items()}}
    return {"profile": profile.name, "gpu_mfu_assumed": GPU_MFU, "gpu_tflops": GPU_TFLOPS,
            "data": str(profile.data_dir) if profile.data_dir else "bundled sample",
            "stages": stages}


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def format_plan(result: dict) -> str:
    """The plan as a markdown table (one row per stage), then the time estimates."""
    names = list(next(iter(result["stages"].values()))["seconds"])
    head = ["stage", "tokens planned", "tokens available", "passes", "steps", "tokens/step"]
    lines = [f"plan of profile `{result['profile']}` on {result['data']}", "",
             "| " + " | ".join(head + names) + " |", "|---" * (len(head) + len(names)) + "|"]
    totals = dict.fromkeys(names, 0.0)
    for stage, s in result["stages"].items():
        about = "~" if s["estimated"] else ""
        cells = [stage, f"{s['tokens_planned'] / 1e6:.2f}M",
                 f"{about}{s['tokens_available'] / 1e6:.2f}M", f"{s['passes']:.2f}",
                 f"{s['steps']:,}", f"{s['tokens_per_step']:,}"]
        cells += [_duration(s["seconds"][n]) for n in names]
        for n in names:
            totals[n] += s["seconds"][n]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("| **all** | | | | | | " + " | ".join(_duration(t) for t in totals.values())
                 + " |")
    lines += ["", f"GPU times assume {result['gpu_mfu_assumed']:.0%} of the dense bf16 peak "
              "(TFLOP/s: " + ", ".join(f"{k} {v:g}" for k, v in result["gpu_tflops"].items())
              + "); evaluation time is not included."]
    return "\n".join(lines)
