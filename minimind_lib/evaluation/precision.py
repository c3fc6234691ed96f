"""The model in every format, side by side: size, speed and held-out quality (notebook 07).

fp32, fp16 and bf16 casts, our int8 (``minimind_lib.model.quantize``) and PyTorch's dynamic int8,
each measured on the same prompt (prefill and decode speed, median of rounds run round robin so
background load hits every format alike) and scored by the same held-out evaluation
(``minimind_lib.evaluation``): the table the MiniMind manual gives, measured on your machine
(``measure_formats`` measures, ``formats_table`` prints).
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from minimind_lib.core.device import pick_device
from minimind_lib.data.readers import read_jsonl
from minimind_lib.evaluation.model_eval import ModelEval
from minimind_lib.evaluation.perplexity import bits_per_byte, perplexity
from minimind_lib.evaluation.questions import (
    answer_budget,
    eval_files,
    evaluate_sft,
    load_eval_records,
    select_per_task,
    summarize,
)
from minimind_lib.model.decoder import MiniMindForCausalLM
from minimind_lib.model.quantize import (
    cast_model,
    model_size_bytes,
    quantize_dynamic_torch,
    quantize_int8,
    torch_int8_unavailable,
)
from minimind_lib.tokenizer.bpe import BPETokenizer


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
    exact-match from ``minimind_lib.evaluation``); formats that cannot run here get a row with
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


#: how ``formats_table`` titles and prints the quality columns it knows (others: 4 digits)
COLUMNS = {"perplexity": ("perplexity", "{:.4g}"), "bits_per_byte": ("bits/byte", "{:.4f}"),
           "exact_match": ("exact-match", "{:.1%}")}


def formats_table(rows: list[FormatRow]) -> str:
    """A markdown table of ``compare_formats`` rows (size relative to the first row).

    >>> print(formats_table([FormatRow("fp32", 4_000_000, 1000.0, 50.0, {"exact_match": 0.25}),
    ...                      FormatRow("int8", 1_000_000, 900.0, 40.0, {"exact_match": 0.25})]))
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


# --- the held-out comparison of notebook 07 and the quantize stage ---------------------------


@dataclass
class FormatComparison:
    """What ``measure_formats`` measured: the table rows, and per format the held-out scores
    (``evaluation.model_eval.ModelEval``: question scores per task, text perplexity and bits per
    byte)."""

    rows: list[FormatRow]
    evals: dict[str, ModelEval]
    per_task: int
    perplexity_tokens: int


def measure_formats(model: MiniMindForCausalLM, tokenizer: BPETokenizer, *, eval_per_task: int,
                    seq_len: int, prompt_len: int = 256, device: str | None = None,
                    progress: bool = False) -> FormatComparison:
    """The format table for a trained chat ``model``: size, prefill/decode speed on ``device``
    (default: the best here), held-out perplexity, bits per byte and exact-match, for fp32,
    fp16, bf16, int8 (ours) and int8 (PyTorch).

    ``eval_per_task`` is the full evaluation's questions per task (a tenth of them are asked
    here), ``seq_len`` the window of the perplexity and the cut of each text for bits per byte
    (and ``eval_per_task * seq_len`` the held-out tokens of each), ``prompt_len`` the speed
    prompt's length in tokens.
    """
    # Five formats, each evaluated in full, would cost five times the sft stage's evaluation
    # (and fp16 matmuls are slow on most CPUs): a tenth of its questions (the same ones for
    # every format) and a slice of the held-out text keep the comparison fair and short;
    # perplexity, which needs no generation, is the sharper of the two measures here.
    per_task = max(2, math.ceil(eval_per_task / 10))
    questions = select_per_task(load_eval_records(), per_task)
    budget = answer_budget(tokenizer, questions)
    ppl_tokens = eval_per_task * seq_len
    evals: dict[str, ModelEval] = {}

    def evaluate(name: str, m: nn.Module) -> dict[str, float]:
        tasks = evaluate_sft(m, tokenizer, questions, max_new_tokens=budget, progress=progress)
        held_out = eval_files("pretrain")[0]
        ppl = perplexity(m, tokenizer, held_out, seq_len, max_tokens=ppl_tokens)
        bpb = bits_per_byte(m, tokenizer, held_out, context=seq_len, max_tokens=ppl_tokens)
        evals[name] = ModelEval(tasks, ppl, bpb)
        return {"perplexity": ppl, "bits_per_byte": bpb,
                "exact_match": summarize(tasks)["all"].exact_match}

    # the speed prompt: held-out text, ``prompt_len`` tokens of it
    texts = (r["text"] for r in read_jsonl(eval_files("pretrain")[0], "pretrain"))
    encoded = tokenizer.encode_batch(list(itertools.islice(texts, 64)), allowed_special=set())
    stream = [i for ids in encoded for i in ids]
    prompt = torch.tensor([stream[:prompt_len]])  # (1, T)
    rows = compare_formats(model, prompt, evaluate, device=pick_device(device), new_tokens=16)
    return FormatComparison(rows, evals, per_task, ppl_tokens)
