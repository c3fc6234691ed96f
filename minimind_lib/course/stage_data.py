"""What the stages train on, read from the profile's data (notebooks 05-10): the files a stage
reads (its ``sources``, which enter its fingerprint), the checkable questions of the RL and
on-policy stages (and the DPO stage's pairs of graded answers to them), the pretraining text
the fine-tuning stages replay, and the LoRA stage's conversations.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from minimind_lib.core.device import pick_device, pick_precision
from minimind_lib.course.profiles import Profile
from minimind_lib.data.hanzi_codes import task_records
from minimind_lib.data.pretraining import PretrainDataset, load_pretrain_split, tokenize_corpus
from minimind_lib.data.readers import dataset_files, read_jsonl
from minimind_lib.evaluation.questions import answer_budget, load_eval_records, select_per_task
from minimind_lib.model.decoder import MiniMindForCausalLM
from minimind_lib.tokenizer.bpe import COURSE_TOKENIZER_DIR, BPETokenizer
from minimind_lib.tokenizer.chat3 import offers_tools
from minimind_lib.training.distributed import init_distributed
from minimind_lib.training.dpo import DPODataset, reservoir_sample
from minimind_lib.training.lora import LoRASettings, with_replay
from minimind_lib.training.on_policy import on_policy_pairs, pair_table
from minimind_lib.training.rollout import Question, select_tasks, verifiable_questions
from minimind_lib.training.sft import sft_records

#: Training conversations per task of the lora stage's generated data (``data.hanzi_codes``).
LORA_TRAIN_PER_TASK = 5000
#: The SFT conversations the lora stage's replay samples from: the first ones of the files.
REPLAY_POOL = 20_000


def training_data(schema: str) -> Callable[[Profile], list[Path]]:
    """``sources`` of a stage training on ``schema`` data: the profile's files of that kind."""
    return lambda profile: dataset_files(schema, profile.data_dir)


def sft_sources(profile: Profile) -> list[Path]:
    """The SFT data, and the pretraining text too when SFT replays it (``sft.replay``)."""
    files = dataset_files("sft", profile.data_dir)
    return files + dataset_files("pretrain", profile.data_dir) if profile.sft.replay else files


def pretraining_tokens(profile: Profile, tokenizer_file: Path, data_dir: Path,
                       progress: bool = True) -> Path:
    """The profile's pretraining text tokenised into ``data_dir`` (``tokenize_corpus``, reused
    while its sources are unchanged): rank 0 tokenises, the other ranks wait, then all read."""
    info = init_distributed()
    if info.is_main:
        tokenize_corpus(dataset_files("pretrain", profile.data_dir), tokenizer_file, data_dir,
                        max_examples=profile.pretrain.max_examples, progress=progress)
    if info.world_size > 1:
        torch.distributed.barrier()
    return data_dir


def replay_text(profile: Profile, tokenizer_file: Path, data_dir: Path, window: int,
                progress: bool = True) -> PretrainDataset:
    """The pretraining text a fine-tuning stage replays (SFT's ``replay``, DPO's
    ``replay_weight``): the corpus's training split (``pretraining_tokens``), in windows of
    ``window`` tokens."""
    pretraining_tokens(profile, tokenizer_file, data_dir, progress)
    return load_pretrain_split(data_dir, "train", window - 1)


def course_tokenizer_files(_: Profile) -> list[Path]:
    """The tokenizer stage's sources: the files of the course tokenizer (``data/tokenizer``)."""
    return sorted(f for f in COURSE_TOKENIZER_DIR.iterdir() if f.is_file())


def dpo_sources(profile: Profile) -> list[Path]:
    """On-policy DPO samples questions from the SFT data; offline DPO reads the DPO pairs; the
    pretraining text too when DPO replays it (``dpo.replay_weight``)."""
    files = dataset_files("sft" if profile.dpo.pairs == "on_policy" else "dpo", profile.data_dir)
    if profile.dpo.replay_weight:
        files += dataset_files("pretrain", profile.data_dir)
    return files


def training_questions(profile: Profile, tasks: str, count: int | None, stage: str,
                       held_out: int = 0) -> tuple[list[Question], list[Question]]:
    """A seeded sample of ``count`` checkable training questions of ``tasks`` (None: all) from
    the profile's SFT data, and a second seeded sample of ``held_out`` questions whose prompts
    are none of the first's (a validation set of the same kind); ``stage`` names who asks, for
    the error when there are none."""
    records = (r for path in dataset_files("sft", profile.data_dir)
               for r in read_jsonl(path, "sft"))
    questions = verifiable_questions(records, None)
    if not questions:
        raise ValueError(f"{stage}: no SFT record carries a 'task', so no answer can be checked "
                         "(MiniMind's own SFT data has none); train on the bundled data"
                         + (", or use --set dpo.pairs=offline" if stage == "dpo" else ""))
    wanted = select_tasks(tasks, {q.task: q.family for q in questions})
    questions = [q for q in questions if q.task in wanted]
    train = questions if count is None else reservoir_sample(questions, count, profile.seed)
    if not held_out:
        return train, []
    seen = {_prompt_key(q) for q in train}
    rest = [q for q in questions if _prompt_key(q) not in seen]
    return train, reservoir_sample(rest, held_out, profile.seed + 1)


def held_out_questions(profile: Profile, tasks: str, per_task: int = 50) -> list[Question]:
    """The held-out questions of ``tasks`` an RL stage validates on (greedy, every
    ``eval_every`` steps): the first ``per_task`` of each (at most the profile's
    ``eval_per_task``)."""
    records = select_per_task(load_eval_records(), min(per_task, profile.eval_per_task))
    return verifiable_questions(records, tasks)


def _prompt_key(question: Question) -> tuple:
    return tuple((m["role"], m.get("content")) for m in question.messages)


def lora_training_records(settings: LoRASettings, profile: Profile) -> list[dict]:
    """The lora stage's training conversations: the new task's (``hanzi_codes.task_records``),
    plus ``settings.replay`` of them from the profile's SFT data (``lora.with_replay``)."""
    new = task_records("train", LORA_TRAIN_PER_TASK, profile.seed)
    if settings.replay == 0:
        return new
    # subtle: not the tool-use conversations: their tools prompt alone (~300-750 tokens) is
    # longer than a LoRA window, so none would keep a supervised token
    old = list(itertools.islice((r for r in sft_records(dataset_files("sft", profile.data_dir))
                                 if not offers_tools(r["conversations"])), REPLAY_POOL))
    return with_replay(new, old, settings.replay, profile.seed)


def dpo_pairs(profile: Profile, policy: MiniMindForCausalLM, tokenizer: BPETokenizer, *,
              device: str | None, precision: str, progress: bool
              ) -> tuple[DPODataset, DPODataset | None, dict]:
    """The DPO stage's training pairs, its on-policy validation pairs (None: offline pairs, or
    ``val_questions`` 0 or without a pair), and (on-policy) what became of the training
    questions per task."""
    settings = profile.dpo
    if settings.pairs == "offline":
        # subtle: a run visits at most max_steps x batch pairs. Keep a seeded uniform sample of
        # that many instead of tokenising and scoring every pair of a big file (MiniMind's
        # dpo.jsonl: ~200k pairs; the full profile visits 16,000): the same distribution
        visited = (None if settings.max_steps is None
                   else settings.max_steps * settings.batch_size * settings.accumulation_steps)
        return DPODataset.from_files(dataset_files("dpo", profile.data_dir), tokenizer,
                                     settings.seq_len, max_examples=settings.max_examples,
                                     sample=visited, seed=profile.seed), None, {}
    questions, val_questions = training_questions(profile, settings.tasks, settings.questions,
                                                  "dpo", held_out=settings.val_questions)
    device = pick_device(device)
    autocast = pick_precision(device, precision)
    policy.to(device)
    generator = torch.Generator(device).manual_seed(profile.seed)
    budget = answer_budget(tokenizer, [{"answer": q.answer} for q in questions])

    def pairs(asked: list) -> tuple[DPODataset, dict]:
        with autocast.context(device):
            return on_policy_pairs(policy, tokenizer, asked, samples=settings.samples,
                                   temperature=settings.temperature, max_new_tokens=budget,
                                   seq_len=settings.seq_len,
                                   pairs_per_question=settings.pairs_per_question,
                                   generator=generator, progress=progress)

    train_set, counts = pairs(questions)
    print("on-policy pairs (greedy answer + samples, graded by exact-match)\n" + pair_table(counts))
    per_task = {task: asdict(c) for task, c in counts.items()}
    if not val_questions:
        return train_set, None, per_task
    try:
        val_set, _ = pairs(val_questions)
        print(f"validation: {len(val_set):,} on-policy pairs from {len(val_questions):,} held-out "
              "training questions")
    except ValueError:  # DPODataset: no usable pair (every sample right, or all too long)
        print(f"validation: none of the {len(val_questions):,} held-out questions gave a pair; "
              "the validation loss is the offline pairs'")
        val_set = None
    return train_set, val_set, per_task


def distill_conversations(profile: Profile, max_examples: int | None) -> list[list[dict]]:
    """The ``distill`` stage's training conversations: the SFT data's first ``max_examples``
    (None: all) without tools offered (a small student has no room for the tool schemas)."""
    records = (r["conversations"] for r in sft_records(dataset_files("sft", profile.data_dir))
               if not offers_tools(r["conversations"]))
    return list(itertools.islice(records, max_examples))
