"""The course's stages: each turns the previous stage's folder into its own (notebooks 04-08).

This is the stage layer: it imports the concept modules (tokenizer, data, model, train, sft,
dpo, quantize, formats, evaluate, checkpoint) and never the other way round. A stage is a
function ``fn(ctx: StageContext) -> dict`` registered with ``@register``
(``course.stage_registry``, re-exported here): it writes
``ctx.out_dir`` and returns a json-able summary. ``minimind_lib.course.pipeline.ensure`` runs
it (and its prerequisites) when its output is missing or stale, and each registered stage is a
CLI command (``python -m minimind_lib <stage>``). The registry is the one list of stages: its
order is the stage order everywhere (``all``, the report, the default model of ``serve``).

A new stage goes here::

    @register("lora", requires=("tokenizer", "sft"), starts_from="sft", description="...",
              in_all=False)
    def lora_stage(ctx: StageContext) -> dict:
        base = load_model(ctx.start_dir())      # the sft model, or --init DIR
        ...                                     # train into ctx.out_dir; return a summary

>>> list(STAGES)
['tokenizer', 'pretrain', 'sft', 'dpo', 'grpo', 'quantize', 'vision', 'lora', 'distill',
 'agent', 'ppo']
>>> STAGES["sft"].requires, STAGES["sft"].starts_from
(('tokenizer', 'pretrain'), 'pretrain')
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict

import torch

from minimind_lib.core.atomic import atomic_write_text, read_json_lines
from minimind_lib.core.checked_files import read_json
from minimind_lib.core.device import seed_everything
from minimind_lib.core.filenames import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
    CLIP_DIR,
    EVAL_FILE,
    FORMATS_FILE,
    MERGED_DIR,
    METRICS_FILE,
    PRETOKENIZED_META,
    TOKENIZER_FILE,
    VLM_DIR,
)
from minimind_lib.course.stage_data import (
    course_tokenizer_files,
    distill_conversations,
    dpo_pairs,
    dpo_sources,
    held_out_questions,
    lora_training_records,
    pretraining_tokens,
    replay_text,
    sft_sources,
    training_data,
    training_questions,
)
from minimind_lib.course.stage_eval import (
    domain_eval,
    profile_eval,
    rl_summary,
    start_eval,
    stored_start_eval,
    training_summary,
    write_eval,
)
from minimind_lib.course.stage_registry import (  # noqa: F401 (re-exported)
    STAGES,
    Stage,
    StageContext,
    get_stage,
    read_marker,
    register,
)
from minimind_lib.data.hanzi_codes import task_records
from minimind_lib.data.pretraining import PretrainDataset, load_pretrain_split
from minimind_lib.data.readers import dataset_files
from minimind_lib.evaluation.model_eval import eval_report
from minimind_lib.evaluation.precision import formats_table, measure_formats
from minimind_lib.evaluation.preferences import summarize_preferences
from minimind_lib.evaluation.questions import (
    load_eval_records,
    summarize,
)
from minimind_lib.model.checkpoint import load_model, save_model
from minimind_lib.model.decoder import MiniMindForCausalLM
from minimind_lib.model.int8 import FORMAT as INT8_FORMAT
from minimind_lib.model.quantize import quantize_int8
from minimind_lib.tokenizer.bpe import COURSE_TOKENIZER_DIR, copy_tokenizer_files
from minimind_lib.training.distill import student_config, train_distill
from minimind_lib.training.distributed import init_distributed
from minimind_lib.training.dpo import (
    evaluate_preferences,
    held_out_pairs,
    train_dpo,
)
from minimind_lib.training.grpo import train_grpo
from minimind_lib.training.loop import train
from minimind_lib.training.lora import (
    add_lora,
    count_parameters,
    finetune,
    merge_lora,
    save_adapter,
)
from minimind_lib.training.settings import TrainConfig
from minimind_lib.training.sft import train_sft
from minimind_lib.vision.clip import CLIP, save_clip
from minimind_lib.vision.recipe import (
    evaluate_clip,
    evaluate_vqa,
    train_clip,
    train_vlm,
    vision_eval,
    vision_table,
)
from minimind_lib.vision.vlm import build_vlm, save_vlm

# --- the stages, in order ------------------------------------------------------------------


@register("tokenizer", sources=course_tokenizer_files,
          description="copy the course tokenizer (data/tokenizer/) into the run")
def tokenizer_stage(ctx: StageContext) -> dict:
    source = COURSE_TOKENIZER_DIR / TOKENIZER_FILE
    if not source.is_file():
        raise FileNotFoundError(f"{source}: the course tokenizer is missing; rebuild data/ with "
                                "`make data` (scripts/build_data.py) or train one in notebook 01")
    for f in course_tokenizer_files(ctx.profile):
        shutil.copyfile(f, ctx.out_dir / f.name)
    return {"source": str(COURSE_TOKENIZER_DIR)}


@register("pretrain", requires=("tokenizer",), distributed=True, sources=training_data("pretrain"),
          serves=True, settings="pretrain", title="Pretraining", curves=(),
          validation="cross-entropy per token (nats) on the held-out split of the pretraining "
                     "text (every 50th document); e^loss is its perplexity",
          training="cross-entropy per token on the training batches of pretraining text",
          description="pretrain the profile's model on the pretraining text")
def pretrain_stage(ctx: StageContext) -> dict:
    """Tokenise the corpus into ``data/`` (a uint16 memmap), then train the profile's model
    from scratch on its windows, validating on the held-out split."""
    settings, info = ctx.profile.pretrain, init_distributed()
    data_dir = pretraining_tokens(ctx.profile, ctx.dir("tokenizer") / TOKENIZER_FILE,
                                  ctx.out_dir / "data", ctx.progress)
    meta = read_json(data_dir / PRETOKENIZED_META)
    if meta["vocab_size"] > ctx.profile.model.vocab_size:
        raise ValueError(f"the tokenizer has {meta['vocab_size']} tokens but the profile's model "
                         f"vocab_size is {ctx.profile.model.vocab_size}")
    train_set = load_pretrain_split(data_dir, "train", settings.seq_len)
    has_val = meta["splits"]["val"]["tokens"] > settings.seq_len + 1
    val_set = load_pretrain_split(data_dir, "val", settings.seq_len) if has_val else None

    seed_everything(ctx.profile.seed)
    model = MiniMindForCausalLM(ctx.profile.model)
    config = TrainConfig.from_stage(settings, ctx.profile.train, out_dir=ctx.out_dir,
                                    precision=ctx.precision, device=ctx.device,
                                    seed=ctx.profile.seed, progress=ctx.progress)
    rows = train(model, train_set, config, eval_dataset=val_set, resume=ctx.resume,
                 callbacks=ctx.callbacks)
    if info.is_main:
        save_model(model.cpu(), ctx.out_dir)
    return {**training_summary(rows), "train_windows": len(train_set),
            "val_windows": len(val_set) if val_set is not None else 0}


@register("sft", requires=("tokenizer", "pretrain"), starts_from="pretrain", distributed=True,
          sources=sft_sources, serves=True, settings="sft", evaluates=True,
          title="Supervised fine-tuning", curves=(),
          validation="answer-only cross-entropy on the reference replies of the held-out "
                     "questions (data/eval/sft_eval*.jsonl); not text modelling, which the "
                     "held-out text perplexity below measures",
          training="cross-entropy over the batch's supervised tokens: the replies' and, with "
                   "sft.replay > 0, the replayed pretraining text's (every token of a window)",
          description="supervised fine-tuning: ChatML, loss on the assistant's replies only; "
                      "evaluates before and after")
def sft_stage(ctx: StageContext) -> dict:
    """``ctx.start_dir()`` (pretrain) → fine-tuned model in ``ctx.out_dir`` (model.safetensors,
    config.json, metrics.jsonl, eval.json with the held-out scores before and after)."""
    profile, info = ctx.profile, init_distributed()
    tokenizer = ctx.tokenizer()
    model = load_model(ctx.start_dir())
    if model.config.vocab_size < len(tokenizer):
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the pretrained model's "
                         f"vocab_size is {model.config.vocab_size}")
    before = profile_eval(model, tokenizer, ctx.profile, ctx.progress) if info.is_main else None
    run = train_sft(model, tokenizer, profile.sft, seed=profile.seed,
                    files=dataset_files("sft", profile.data_dir), options=profile.train,
                    out_dir=ctx.out_dir, resume=ctx.resume, precision=ctx.precision,
                    device=ctx.device, progress=ctx.progress, callbacks=ctx.callbacks,
                    replay_text=_replay_text(ctx, profile.sft.window)
                    if profile.sft.replay else None)
    if not info.is_main:
        return {}
    model = model.cpu()
    save_model(model, ctx.out_dir)
    after = profile_eval(model, tokenizer, profile, ctx.progress, tools=True)
    evals = {"pretrain": before, "sft": after}
    write_eval(ctx.out_dir, profile.eval_per_task, evals)
    print(eval_report(evals))
    return {**training_summary(run.rows), "examples": run.examples,
            "skipped": run.skipped, "unrenderable": run.unrenderable, "eval": EVAL_FILE,
            "exact_match": {n: summarize(e.tasks)["all"].exact_match for n, e in evals.items()},
            "perplexity": {n: e.perplexity for n, e in evals.items()}}


@register("dpo", requires=("tokenizer", "sft"), starts_from="sft", sources=dpo_sources,
          serves=True, settings="dpo", evaluates=True, title="DPO",
          curves=("reward_margin", "reward_accuracy", "offline_val_loss", "text_nll"),
          validation="the DPO loss (with its NLL term when nll_weight > 0) on held-out pairs of "
                     "the kind the stage trains on: on-policy, the SFT model's own graded answers "
                     "to dpo.val_questions training questions it never trains on (offline: the "
                     "held-out pairs of data/eval/dpo_eval*.jsonl). offline_val_loss, on-policy "
                     "only: the same loss on those offline pairs, answers other models wrote; it "
                     "can rise while exact match improves, as the policy leaves their style",
          training="the DPO loss of the training pairs, plus nll_weight times the chosen answers' "
                   "NLL (the nll curve) and replay_weight times the replayed text's (text_nll)",
          description="direct preference optimization of the SFT model against its frozen copy, "
                      "on pairs of its own graded answers (or the offline pairs); evaluates "
                      "before and after")
def dpo_stage(ctx: StageContext) -> dict:
    """``ctx.start_dir()`` (sft) → DPO-aligned model in ``ctx.out_dir`` with ``profile.dpo``; the
    reference is the SFT model, its log-probs precomputed. The pairs are the model's own
    answers graded by the evaluation's checker (``dpo.on_policy_pairs``; ``dpo.pairs=offline``:
    the DPO files). Prints the held-out before/after tables: preference accuracy, then
    exact-match and format rate."""
    profile, settings = ctx.profile, ctx.profile.dpo
    tokenizer = ctx.tokenizer()
    policy = load_model(ctx.start_dir())
    sft_eval = start_eval(ctx, policy, tokenizer)
    train_set, val_set, pair_counts = dpo_pairs(profile, policy, tokenizer, device=ctx.device,
                                                precision=ctx.precision,
                                                progress=ctx.progress)
    held_out = held_out_pairs(tokenizer, settings.seq_len, profile.eval_per_task)
    validation = ({"val_loss": val_set, "offline_val_loss": held_out} if val_set is not None
                  else {"val_loss": held_out})
    config = TrainConfig.from_stage(settings, profile.train, out_dir=ctx.out_dir,
                                    precision=ctx.precision, device=ctx.device, seed=profile.seed,
                                    progress=ctx.progress)
    rows = train_dpo(policy, train_set, config, beta=settings.beta,
                     nll_weight=settings.nll_weight, eval_set=validation, resume=ctx.resume,
                     callbacks=ctx.callbacks, replay_weight=settings.replay_weight,
                     replay_text=_replay_text(ctx, settings.replay_window)
                     if settings.replay_weight else None, seed=profile.seed)
    prefs = evaluate_preferences(policy, held_out, held_out.ref_logps, precision=ctx.precision,
                                 device=ctx.device)
    policy = policy.cpu()
    save_model(policy, ctx.out_dir)
    evals = {"sft": sft_eval, "dpo": profile_eval(policy, tokenizer, ctx.profile, ctx.progress)}
    write_eval(ctx.out_dir, profile.eval_per_task, evals, beta=settings.beta,
                pairs=settings.pairs, pair_counts=pair_counts, preference=prefs.to_dict())
    print("held-out preference accuracy\n" + prefs.table() + "\n\nheld-out questions\n"
          + eval_report(evals))
    before, after = (summarize_preferences(p)["all"] for p in (prefs.sft, prefs.dpo))
    return {**training_summary(rows), "pairs": len(train_set), "pair_source": settings.pairs,
            "val_pairs": len(val_set) if val_set is not None else 0,
            "final_offline_val_loss": _last(rows, "offline_val_loss"),
            "dropped": train_set.dropped, "eval": EVAL_FILE,
            "preference_accuracy": {"sft_logprob": before.logprob_accuracy,
                                    "dpo_logprob": after.logprob_accuracy,
                                    "dpo_reward": after.reward_accuracy},
            "exact_match": {n: summarize(e.tasks)["all"].exact_match for n, e in evals.items()}}


def _replay_text(ctx: StageContext, window: int) -> PretrainDataset:
    """The pretraining text a fine-tuning stage replays, tokenised into its ``replay_data``."""
    return replay_text(ctx.profile, ctx.dir("tokenizer") / TOKENIZER_FILE,
                       ctx.out_dir / "replay_data", window, ctx.progress)


def _last(rows: list[dict], key: str) -> float | None:
    """The last value of ``key`` in metrics ``rows`` (None when never logged)."""
    return next((r[key] for r in reversed(rows) if key in r), None)


@register("grpo", requires=("tokenizer", "sft"), starts_from="sft", sources=training_data("sft"),
          serves=True, in_all=False, settings="grpo", evaluates=True, title="GRPO",
          curves=("reward", "kl", "response_length"),
          validation="val_accuracy: the share of held-out questions answered right, greedily",
          training="the GRPO policy loss of each step's sampled groups (reward: exact match)",
          description="GRPO with verifiable rewards: groups of sampled answers to checkable "
                      "questions, rewarded by the exact-match checker; evaluates before and after")
def grpo_stage(ctx: StageContext) -> dict:
    """``ctx.start_dir()`` (sft, or ``--init DIR``) → GRPO-trained model in ``ctx.out_dir`` with
    ``profile.grpo`` (``metrics.jsonl``: reward, kl, response_length per step; ``eval.json``:
    the held-out scores before and after). Not part of ``all``: DPO is the course's default
    alignment step; GRPO is its RL sibling (notebook 10)."""
    profile, settings = ctx.profile, ctx.profile.grpo
    tokenizer = ctx.tokenizer()
    policy = load_model(ctx.start_dir())
    questions, _ = training_questions(profile, settings.tasks, None, "grpo")
    held_out = held_out_questions(profile, settings.tasks)  # greedy, every eval_every steps
    before = start_eval(ctx, policy, tokenizer)
    config = TrainConfig.from_stage(settings, profile.train, out_dir=ctx.out_dir,
                                    precision=ctx.precision, device=ctx.device, seed=profile.seed,
                                    progress=ctx.progress)
    train_grpo(policy, tokenizer, questions, settings, config, resume=ctx.resume,
               held_out=held_out, callbacks=ctx.callbacks)
    rows = read_json_lines(ctx.out_dir / METRICS_FILE)  # every step, also those before a resume
    if all(r["signal"] == 0 for r in rows):
        print(f"grpo: no group ever disagreed (every answer earned the same reward), so nothing "
              f"was learned: the starting model never answers the tasks {settings.tasks!r} "
              "right. Start from a model that sometimes does, e.g. --init data/reference/sft")
    policy = policy.cpu()
    save_model(policy, ctx.out_dir)
    evals = {"sft": before, "grpo": profile_eval(policy, tokenizer, ctx.profile, ctx.progress)}
    write_eval(ctx.out_dir, profile.eval_per_task, evals, tasks=settings.tasks)
    print("held-out questions\n" + eval_report(evals))
    return {**rl_summary(rows, evals), "questions": len(questions)}


@register("quantize", requires=("tokenizer", "dpo"), starts_from="dpo", evaluates=True,
          title="Quantisation",
          description="int8 weight-only quantisation of the DPO model; size, speed and quality "
                      "of fp32/fp16/bf16/int8")
def quantize_stage(ctx: StageContext) -> dict:
    """The ``dpo`` stage's model in int8 (a ``load_model`` folder with the tokenizer files beside
    it, so ``serve --model`` works on it), and the format table measured on it: ``eval.json``
    (per format: held-out perplexity and question scores), ``formats.md`` and ``metrics.jsonl``
    (one row per format: size, prefill and decode speed, perplexity, exact-match)."""
    source, profile = ctx.start_dir(), ctx.profile
    model = load_model(source)
    qmodel = quantize_int8(model)
    save_model(qmodel, ctx.out_dir)
    with torch.no_grad():  # what is on disk is what we made (and load_model is strict)
        probe = torch.arange(min(16, model.config.vocab_size))[None]  # (1, 16)
        if not torch.equal(load_model(ctx.out_dir)(probe).logits, qmodel(probe).logits):
            raise RuntimeError(f"{ctx.out_dir}: the reloaded int8 model differs from the saved one")
    copy_tokenizer_files(ctx.dir("tokenizer"), ctx.out_dir)  # the folder is self-contained

    result = measure_formats(model, ctx.tokenizer(), eval_per_task=profile.eval_per_task,
                             seq_len=profile.pretrain.seq_len,
                             prompt_len=min(256, profile.pretrain.seq_len), device=ctx.device,
                             progress=ctx.progress)
    rows = result.rows
    write_eval(ctx.out_dir, result.per_task, result.evals,
                perplexity_tokens=result.perplexity_tokens)
    atomic_write_text(ctx.out_dir / METRICS_FILE,
                      "".join(json.dumps(asdict(r)) + "\n" for r in rows))
    table = formats_table(rows)
    atomic_write_text(ctx.out_dir / FORMATS_FILE, table + "\n")
    print(table)
    done = [r for r in rows if not r.note]
    return {"source": source.name if ctx.init is None else str(source), "format": INT8_FORMAT,
            "eval": EVAL_FILE, "table": FORMATS_FILE,
            "size_bytes": {r.name: r.size_bytes for r in done},
            "perplexity": {r.name: r.metrics["perplexity"] for r in done},
            "exact_match": {r.name: r.metrics["exact_match"] for r in done},
            "skipped": {r.name: r.note for r in rows if r.note}}


# --- optional stages (not part of `all`) ------------------------------------------------------

@register("vision", requires=("tokenizer", "sft"), starts_from="sft", in_all=False,
          settings="vision",
          description="a tiny CLIP on synthetic pictures, then a MiniMind-V style VLM on the SFT "
                      "model; zero-shot and held-out VQA exact-match (notebook 13)")
def vision_stage(ctx: StageContext) -> dict:
    """Train the tiny CLIP (``clip/``), then the VLM on ``ctx.start_dir()`` (the sft model, or
    ``--init data/reference/sft``) with CLIP's frozen image encoder (``vlm/``: a VLM folder with
    the tokenizer beside it), and score both on pictures of held-out (colour, shape) pairs:
    ``eval.json`` (``vision.recipe.vision_eval``) and ``metrics.jsonl`` (both runs' rows, by
    ``phase``)."""
    profile, settings = ctx.profile, ctx.profile.vision
    tokenizer = ctx.tokenizer()
    lm = load_model(ctx.start_dir())
    if lm.config.vocab_size < len(tokenizer):
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size "
                         f"is {lm.config.vocab_size}")
    run = {"seed": profile.seed, "options": profile.train, "resume": ctx.resume,
           "precision": ctx.precision, "device": ctx.device, "progress": ctx.progress,
           "callbacks": ctx.callbacks}
    seed_everything(profile.seed)
    clip = CLIP(settings.clip_config(len(tokenizer)))
    train_clip(clip, tokenizer, settings, out_dir=ctx.out_dir / CLIP_DIR, **run)
    clip = clip.cpu().eval()
    save_clip(clip, ctx.out_dir / CLIP_DIR)
    vlm = build_vlm(lm, clip, settings.merge)
    train_vlm(vlm, tokenizer, settings, out_dir=ctx.out_dir / VLM_DIR, **run)
    vlm = vlm.cpu().eval()
    save_vlm(vlm, ctx.out_dir / VLM_DIR)
    copy_tokenizer_files(ctx.dir("tokenizer"), ctx.out_dir / VLM_DIR)  # serve --model finds it
    result = vision_eval(evaluate_clip(clip, tokenizer, profile.seed, settings.eval_images),
                         evaluate_vqa(vlm, tokenizer, profile.seed, settings.eval_images,
                                      progress=ctx.progress),
                         eval_images=settings.eval_images, lm=str(ctx.start_dir()))
    atomic_write_text(ctx.out_dir / EVAL_FILE, json.dumps(result, indent=2) + "\n")
    rows = [{"phase": phase, **row} for phase in (CLIP_DIR, VLM_DIR)
            for row in read_json_lines(ctx.out_dir / phase / METRICS_FILE)]
    atomic_write_text(ctx.out_dir / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in rows))
    print(vision_table(result))
    return {key: result[key] for key in ("zero_shot_accuracy", "zero_shot_chance",
                                         "vqa_exact_match", "vqa_chance")} | {
        "eval": EVAL_FILE, "metrics": METRICS_FILE, "models": [CLIP_DIR, VLM_DIR],
        "final_loss": {phase: next(r["loss"] for r in reversed(rows) if r["phase"] == phase)
                       for phase in (CLIP_DIR, VLM_DIR)}}
def _save_merged(model: MiniMindForCausalLM, ctx: StageContext) -> MiniMindForCausalLM:
    """Fold the adapters into the weights and save the result in ``merged/`` (a model folder
    with the tokenizer files); refuse if it does not compute what the adapted model did."""
    probe = torch.arange(min(32, model.config.vocab_size))[None]  # (1, 32)
    with torch.no_grad():
        adapted = model.eval()(probe).logits  # (1, 32, V)
        merged = merge_lora(model).eval()
        # the same sums in another order (x W^T + s x A^T B^T vs x (W + s B A)^T): fp32
        # rounding, ~1e-6 of the logits' scale; 1e-4 of it flags a real difference
        tolerance = 1e-4 * max(1.0, adapted.abs().max().item())
        if (merged(probe).logits - adapted).abs().max().item() > tolerance:
            raise RuntimeError("the merged model's logits differ from the adapted model's")
    merged_dir = ctx.out_dir / MERGED_DIR
    save_model(merged, merged_dir)
    copy_tokenizer_files(ctx.dir("tokenizer"), merged_dir)  # serve --model finds it
    return merged


@register("lora", requires=("tokenizer", "sft"), starts_from="sft", in_all=False,
          sources=training_data("sft"), settings="lora", evaluates=True, title="LoRA", curves=(),
          validation="answer-only cross-entropy on held-out questions of the new task",
          training="answer-only cross-entropy on the new task's conversations (and the "
                   "replayed SFT conversations, lora.replay)",
          description="LoRA fine-tune of the SFT model on a new task (codes read in Chinese "
                      "numerals and back); the adapter in PEFT's format, the merged model in "
                      "merged/; evaluates before and after")
def lora_stage(ctx: StageContext) -> dict:
    """``ctx.start_dir()`` (sft, or ``--init DIR``) + LoRA adapters trained with
    ``profile.lora`` on the generated task family of ``minimind_lib.data.hanzi_codes`` ->
    ``ctx.out_dir``: ``adapter_config.json`` + ``adapter_model.safetensors`` (PEFT's format),
    ``merged/`` (the model with the adapters folded in: a ``load_model`` folder, tokenizer files
    beside it), ``metrics.jsonl`` and ``eval.json`` (the new task's and the SFT tasks'
    held-out questions, before and after: what was learnt, and what was forgotten)."""
    profile, settings = ctx.profile, ctx.profile.lora
    tokenizer, start = ctx.tokenizer(), ctx.start_dir()
    model = load_model(start)
    before = domain_eval(model, tokenizer, profile, stored_start_eval(ctx), ctx.progress)
    seed_everything(profile.seed)  # the adapters' random A: the same run, the same start
    adapted = add_lora(model, rank=settings.rank, alpha=settings.alpha, dropout=settings.dropout,
                       target_modules=settings.target_modules)
    counts = count_parameters(model)
    print(f"LoRA r={settings.rank} on {len(adapted)} projections: {counts}")
    rows = finetune(model, tokenizer, lora_training_records(settings, profile), settings,
                    seed=profile.seed,
                    eval_records=task_records("eval", profile.eval_per_task),
                    options=profile.train, out_dir=ctx.out_dir, resume=ctx.resume,
                    precision=ctx.precision, device=ctx.device, progress=ctx.progress,
                    callbacks=ctx.callbacks)
    model = model.cpu()
    save_adapter(model, ctx.out_dir, base_model_name_or_path=str(start))
    merged = _save_merged(model, ctx)
    evals = {"sft": before, "lora": domain_eval(merged, tokenizer, profile, None, ctx.progress)}
    adapter = {"rank": settings.rank, "alpha": settings.alpha,
               "target_modules": list(settings.target_modules),
               "trainable_parameters": counts.trainable, "total_parameters": counts.total}
    write_eval(ctx.out_dir, profile.eval_per_task, evals, adapter=adapter)
    print(eval_report(evals))
    return {**training_summary(rows), **adapter, "eval": EVAL_FILE,
            "adapter_files": [ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE], "merged": MERGED_DIR,
            "exact_match": {n: {fam: s.exact_match for fam, s in summarize(e.tasks).items()}
                            for n, e in evals.items()}}


@register("distill", requires=("tokenizer", "sft"), starts_from="sft", in_all=False,
          sources=training_data("sft"), settings="distill", evaluates=True,
          title="Distillation", curves=("ce", "kd"),
          validation="answer-only cross-entropy of the held-out questions' reference replies "
                     "(the same in every mode, so the modes compare)",
          training="alpha x the answer tokens' cross-entropy + (1 - alpha) x T^2 KL(teacher || "
                   "student) on them (mode logits); the answer-only cross-entropy on the "
                   "teacher's answers (answers) or the reference ones (none)",
          description="knowledge distillation of the SFT model (the teacher) into a smaller "
                      "student: its logits (distill.mode=logits), its generated answers "
                      "(answers), or neither, the baseline at equal steps (none); evaluates the "
                      "teacher and the student")
def distill_stage(ctx: StageContext) -> dict:
    """``ctx.start_dir()`` (sft, or ``--init DIR``: the teacher) -> a new, smaller student
    trained with ``profile.distill`` on the SFT data's task conversations -> ``ctx.out_dir``
    (a ``load_model`` folder, ``metrics.jsonl``, ``eval.json`` with the teacher and the student
    on the held-out questions). Not part of ``all``: the student is a side branch, not a step
    toward the served model."""
    profile, settings = ctx.profile, ctx.profile.distill
    tokenizer = ctx.tokenizer()
    teacher = load_model(ctx.start_dir()).eval()
    conversations = distill_conversations(profile, settings.max_examples)
    seed_everything(profile.seed)
    student = MiniMindForCausalLM(student_config(teacher.config, settings))
    print(f"distill: teacher {teacher.num_parameters() / 1e6:.2f}M parameters, student "
          f"{student.num_parameters() / 1e6:.2f}M, mode {settings.mode}, "
          f"{len(conversations):,} conversations")
    rows = train_distill(student, teacher, tokenizer, conversations, settings,
                         held_out=load_eval_records(), seed=profile.seed, options=profile.train,
                         out_dir=ctx.out_dir, resume=ctx.resume, precision=ctx.precision,
                         device=ctx.device, progress=ctx.progress, callbacks=ctx.callbacks)
    student, teacher = student.cpu(), teacher.cpu()
    save_model(student, ctx.out_dir)
    copy_tokenizer_files(ctx.dir("tokenizer"), ctx.out_dir)
    evals = {"teacher": start_eval(ctx, teacher, tokenizer),
             "student": profile_eval(student, tokenizer, profile, ctx.progress)}
    write_eval(ctx.out_dir, profile.eval_per_task, evals, mode=settings.mode,
               alpha=settings.alpha, temperature=settings.temperature,
               parameters={"teacher": teacher.num_parameters(),
                           "student": student.num_parameters()})
    print("held-out questions\n" + eval_report(evals))
    return {**training_summary(rows), "mode": settings.mode, "eval": EVAL_FILE,
            "student_parameters": student.num_parameters(),
            "exact_match": {n: summarize(e.tasks)["all"].exact_match for n, e in evals.items()},
            "perplexity": {n: e.perplexity for n, e in evals.items()}}


import minimind_lib.course.stages_agent  # noqa: E402, F401 (registers agent, after the above)
import minimind_lib.course.stages_ppo  # noqa: E402, F401 (registers ppo, after the stages above)
