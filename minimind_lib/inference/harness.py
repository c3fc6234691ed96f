"""The course's models inside lm-evaluation-harness (``pip install -e '.[eval]'``).

Importing this module registers the model ``"minimind"`` with ``lm_eval``; then::

    import lm_eval
    import minimind_lib.inference.harness  # noqa: F401  (registers "minimind")
    lm_eval.simple_evaluate(model="minimind", model_args="pretrained=runs/cpu/sft",
                            tasks=["arc_easy"])

or, from the shell, ``python -m minimind_lib bench --model runs/cpu/sft --tasks arc_easy``
(``bench`` below). ``pretrained`` is anything ``loading.load_for_serving`` opens: a stage
folder, a ``transformers`` folder (MiniMind's Qwen3 / Llama exports), a MiniMind ``.pth``.

The three requests lm-eval makes, each on the course's own code:

* ``loglikelihood``: (context, continuation) -> (summed log-prob, is greedy), split by
  ``multiple_choice.encode_pair`` and scored by ``multiple_choice.continuation_logprobs``
  (multiple-choice tasks: ARC, PIQA, HellaSwag, C-Eval...);
* ``loglikelihood_rolling``: a text's log-likelihood, ``perplexity.text_logprobs``
  (perplexity tasks: wikitext...);
* ``generate_until``: greedy ``generation.generate_many``, cut at the first stop string.

Nothing here downloads: ``bench`` runs with ``HF_HUB_OFFLINE=1`` and ``HF_DATASETS_OFFLINE=1``
unless the environment says otherwise; ``python -m minimind_lib download bench --tasks ...`` is
the command that fetches the tasks' datasets into the Hugging Face cache.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from lm_eval.api.instance import Instance
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from torch import nn

from minimind_lib.core.device import pick_device
from minimind_lib.evaluation.multiple_choice import continuation_logprobs, encode_pair
from minimind_lib.evaluation.perplexity import text_logprobs
from minimind_lib.inference.loading import load_for_serving
from minimind_lib.model.generation import generate_many
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.tokenizer.chat import apply_chat_template, template_of
from minimind_lib.tokenizer.special import END_OF_TEXT, IM_END


def _positive(value: object, name: str) -> int:
    """lm-eval passes model_args as strings and ``batch_size`` may be ``"auto"``."""
    if value in (None, "auto") or str(value).startswith("auto"):
        return 32
    if not str(value).isdigit() or int(value) < 1:
        raise ValueError(f"minimind model: {name} must be a positive integer, got {value!r}")
    return int(value)


def usable_device(name: str | None) -> str | None:
    """``name`` when this machine has it; else None (the best there is) and a warning naming
    it: lm-eval's CLI passes ``cuda`` unless told otherwise, and its own ``hf`` model falls
    back the same way.

    >>> usable_device("cpu"), usable_device(None)
    ('cpu', None)
    """
    if name is None:
        return None
    kind = torch.device(name).type
    available = {"cpu": True, "cuda": torch.cuda.is_available(),
                 "mps": getattr(torch.backends, "mps", None) is not None
                 and torch.backends.mps.is_available()}
    if available.get(kind, False):
        return name
    warnings.warn(f"device {name!r} is not available on this machine; using "
                  f"{pick_device().type} instead", stacklevel=2)
    return None


@register_model("minimind")
class MiniMindLM(LM):
    """lm-eval's ``LM`` over a course model. ``pretrained``: a model folder or file (see
    ``loading.load_for_serving``), or pass ``model`` and ``tokenizer`` objects (tests,
    notebooks)."""

    def __init__(self, pretrained: str | None = None, *, model: nn.Module | None = None,
                 tokenizer: BPETokenizer | None = None, batch_size: int | str = 32,
                 device: str | None = None, max_gen_toks: int | str = 256,
                 **unused: object) -> None:
        super().__init__()
        if (pretrained is None) == (model is None):
            raise ValueError("minimind model: give pretrained=DIR or a model object, not both")
        if model is None:
            model, tokenizer = load_for_serving(pretrained, usable_device(device))
        elif tokenizer is None:
            raise ValueError("minimind model: a model object needs its tokenizer")
        self.model, self.tok = model.eval(), tokenizer
        self.batch_size = _positive(batch_size, "batch_size")
        self.max_gen_toks = _positive(max_gen_toks, "max_gen_toks")
        self.max_length = model.config.max_position_embeddings
        self.template = template_of(tokenizer)

    # -- scoring ------------------------------------------------------------------------------

    def loglikelihood(self, requests: list[Instance],
                      disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        rows = [encode_pair(self.tok, ctx, cont) for ctx, cont in (r.args for r in requests)]
        # longest first: a batch pads little (lm-eval's own models sort the same way)
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]) - len(rows[i][1]))
        scored = continuation_logprobs(self.model, [rows[i] for i in order], self.batch_size)
        out: list[tuple[float, bool]] = [(0.0, False)] * len(rows)
        for i, result in zip(order, scored, strict=True):
            out[i] = result
        return out

    def loglikelihood_rolling(self, requests: list[Instance],
                              disable_tqdm: bool = False) -> list[float]:
        texts = [r.args[0] for r in requests]
        return text_logprobs(self.model, self.tok, texts, self.max_length,
                             batch_size=self.batch_size)

    # -- generation ---------------------------------------------------------------------------

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        stop_ids = [self.tok.token_to_id(m) for m in (END_OF_TEXT, IM_END)
                    if m in self.tok.special_tokens]
        groups: dict[str, list[int]] = {}  # requests with the same gen_kwargs decode together
        for i, r in enumerate(requests):
            groups.setdefault(json.dumps(r.args[1], sort_keys=True, default=str), []).append(i)
        out = [""] * len(requests)
        for members in groups.values():
            until, budget = _stops_and_budget(requests[members[0]].args[1], self.max_gen_toks)
            room = max(self.max_length - budget, 1)  # the prompt keeps its last tokens
            prompts = [self.tok.encode(requests[i].args[0])[-room:] for i in members]
            replies = generate_many(self.model, prompts, budget, eos_token_id=stop_ids,
                                    batch_size=self.batch_size, progress=not disable_tqdm,
                                    desc="generate_until")
            for i, ids in zip(members, replies, strict=True):
                text = self.tok.decode([t for t in ids if t not in stop_ids])
                cuts = [text.index(s) for s in until if s and s in text]
                out[i] = text[:min(cuts)] if cuts else text
        return out

    # -- chat templates (``lm_eval --apply_chat_template``, as MiniMind runs its benchmarks) --

    def apply_chat_template(self, chat_history: list[dict[str, str]],
                            add_generation_prompt: bool = True) -> str:
        return apply_chat_template(chat_history, add_generation_prompt, template=self.template)

    @property
    def tokenizer_name(self) -> str:
        return f"minimind-{self.template}"

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.template if chat_template else ""


def _stops_and_budget(kwargs: Mapping, default_budget: int) -> tuple[list[str], int]:
    """lm-eval's ``gen_kwargs`` -> (stop strings, new-token budget). Sampling settings are
    refused: the harness's generative tasks are greedy.

    >>> _stops_and_budget({"until": "\\n\\n", "max_gen_toks": 32}, 256)
    (['\\n\\n'], 32)
    """
    until = kwargs.get("until") or []
    until = [until] if isinstance(until, str) else list(until)
    budget = next((kwargs[k] for k in ("max_gen_toks", "max_new_tokens", "max_tokens")
                   if k in kwargs), default_budget)
    if kwargs.get("do_sample") or float(kwargs.get("temperature", 0) or 0) > 0:
        raise ValueError("minimind model: generate_until decodes greedily; this task asks to "
                         f"sample ({dict(kwargs)})")
    return until, int(budget)


# --- bench: run tasks and print one table ------------------------------------------------------

#: MiniMind's published lm-eval scores (README, "Ⅴ 客观评测", fetched 2026-12-05; acc, in %):
#: run with ``lm_eval --model hf ... --batch_size 16 --device cpu --apply_chat_template``
PUBLISHED = {
    "minimind-3 (64M)": {"ceval-valid": 24.89, "cmmlu": 25.38, "arc_easy": 28.49,
                         "piqa": 50.65, "openbookqa": 23.60, "hellaswag": 28.28,
                         "social_iqa": 34.19},
    "minimind-3-moe (198M)": {"ceval-valid": 25.48, "cmmlu": 24.32, "arc_easy": 27.74,
                              "piqa": 50.71, "openbookqa": 26.20, "hellaswag": 27.43,
                              "social_iqa": 34.03},
}


def yaml_problems(folder: str | Path) -> list[str]:
    """``file:line:column: what`` for each YAML file under ``folder`` that does not parse
    (lm-eval's ``!function`` tags are accepted as they are)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    problems = []
    for path in sorted(Path(folder).rglob("*.y*ml")):
        try:
            yaml.load(path.read_text(encoding="utf-8"), Loader=Loader)  # noqa: S506 (safe)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
            problems.append(f"{where}: {getattr(e, 'problem', None) or e}")
        except UnicodeDecodeError as e:
            problems.append(f"{path}: not UTF-8 ({e.reason})")
    return problems


def task_manager(tasks: Sequence[str], include_path: str | None = None):
    """lm-eval's ``TaskManager`` (with the local YAML tasks of ``include_path``), after checking
    that it knows every one of ``tasks``."""
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include_path) if include_path else TaskManager()
    unknown = [t for t in tasks if t not in manager.all_tasks]
    broken = yaml_problems(include_path) if unknown and include_path else []
    if broken:  # lm-eval skips a file it cannot parse; its task then looks unknown
        raise ValueError(f"a task file does not parse, so its task is missing: {broken[0]}"
                         + (f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""))
    if unknown:
        raise ValueError(f"unknown lm-eval task(s): {', '.join(unknown)} (list them with "
                         "`lm_eval ls tasks`; a local YAML task needs --include_path DIR)")
    return manager


def fetch_tasks(tasks: Sequence[str], include_path: str | None = None) -> None:
    """Build each task once, which makes ``datasets`` fetch its data into the Hugging Face
    cache: ``python -m minimind_lib download bench``, the one command that downloads them."""
    from lm_eval.tasks import get_task_dict

    get_task_dict(list(tasks), task_manager(tasks, include_path))


def run_tasks(lm: LM, tasks: Sequence[str], *, include_path: str | None = None,
              limit: int | None = None, apply_chat_template: bool = False,
              num_fewshot: int | None = None) -> dict:
    """``lm_eval.simple_evaluate`` on ``lm``: lm-eval's results dict."""
    from lm_eval import simple_evaluate

    return simple_evaluate(model=lm, tasks=list(tasks),
                           task_manager=task_manager(tasks, include_path), limit=limit,
                           apply_chat_template=apply_chat_template, num_fewshot=num_fewshot,
                           log_samples=False, bootstrap_iters=0)


def summary_rows(results: Mapping, tasks: Sequence[str]) -> list[dict]:
    """One row per requested task (a group's aggregate for groups such as ``cmmlu``): every
    accuracy / perplexity metric lm-eval reported, ``acc`` first."""
    reported = {**results.get("results", {}), **results.get("groups", {})}
    rows = []
    for task in tasks:
        found = reported.get(task, {})
        metrics = {k.split(",")[0]: v for k, v in found.items()
                   if "," in k and not k.split(",")[0].endswith("_stderr")
                   and isinstance(v, int | float)}
        rows.append({"task": task, **metrics})
    return rows


def format_bench(rows: Sequence[dict], model_name: str) -> str:
    """The table ``bench`` prints: our figures beside MiniMind's published ones (%)."""
    names = list(PUBLISHED)
    head = ["task", "acc %", "acc_norm %", "other", *[f"{n} acc %" for n in names]]
    lines = [f"model: {model_name}", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    for row in rows:
        other = ", ".join(f"{k} {v:.4g}" for k, v in row.items()
                          if k not in ("task", "acc", "acc_norm"))
        cells = [row["task"], _pct(row.get("acc")), _pct(row.get("acc_norm")), other or "",
                 *[_pct(PUBLISHED[n].get(row["task"]), scale=1) for n in names]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _pct(value: float | None, scale: float = 100) -> str:
    return "-" if value is None else f"{value * scale:.2f}"


def bench(model: str, tasks: Sequence[str], *, include_path: str | None = None,
          limit: int | None = None, batch_size: int = 32, device: str | None = None,
          apply_chat_template: bool = False, num_fewshot: int | None = None,
          as_json: bool = False) -> str:
    """``python -m minimind_lib bench``: the model on lm-eval's ``tasks``, one table (or JSON)."""
    lm = MiniMindLM(model, batch_size=batch_size, device=device)
    results = run_tasks(lm, tasks, include_path=include_path, limit=limit,
                        apply_chat_template=apply_chat_template, num_fewshot=num_fewshot)
    rows = summary_rows(results, tasks)
    if as_json:
        return json.dumps({"model": model, "tasks": rows, "published": PUBLISHED}, indent=2)
    return format_bench(rows, model)
