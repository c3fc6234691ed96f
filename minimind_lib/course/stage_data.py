"""What the stages train on, read from the profile's data (notebooks 05-10): the files a stage
reads (its ``sources``, which enter its fingerprint), the checkable questions of the RL and
on-policy stages, the pretraining text SFT replays, and the LoRA stage's conversations.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import torch

from minimind_lib.course.profiles import Profile
from minimind_lib.data.hanzi_codes import task_records
from minimind_lib.data.pretraining import PretrainDataset, load_pretrain_split, tokenize_corpus
from minimind_lib.data.readers import dataset_files, read_jsonl
from minimind_lib.tokenizer.bpe import COURSE_TOKENIZER_DIR
from minimind_lib.training.distributed import init_distributed
from minimind_lib.training.dpo import reservoir_sample
from minimind_lib.training.lora import LoRASettings, with_replay
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


def _prompt_key(question: Question) -> tuple:
    return tuple((m["role"], m.get("content")) for m in question.messages)


def lora_training_records(settings: LoRASettings, profile: Profile) -> list[dict]:
    """The lora stage's training conversations: the new task's (``hanzi_codes.task_records``),
    plus ``settings.replay`` of them from the profile's SFT data (``lora.with_replay``)."""
    new = task_records("train", LORA_TRAIN_PER_TASK, profile.seed)
    if settings.replay == 0:
        return new
    old = list(itertools.islice(sft_records(dataset_files("sft", profile.data_dir)),
                                REPLAY_POOL))
    return with_replay(new, old, settings.replay, profile.seed)
