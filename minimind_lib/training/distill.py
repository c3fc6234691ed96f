"""Knowledge distillation: a small student learns from a bigger teacher's whole distribution
(Hinton, Vinyals and Dean 2015, "Distilling the Knowledge in a Neural Network").

On the answer tokens ``S`` of an SFT batch (the positions ``data.conversations.sft_example``
labels), with the student's logits ``s`` and the teacher's ``t`` softened by a temperature ``T``:

    L = alpha * CE(s, y) + (1 - alpha) * T^2 * (1 / |S|) * sum_{i in S} KL(softmax(t_i / T)
                                                                     || softmax(s_i / T))

``CE`` is the SFT loss on the reference answer ``y`` (hard labels); the KL term asks the student
to match the teacher's probabilities for *every* token of the vocabulary (soft labels: that
"的" is likely, "之" plausible, "猫" absurd), far more signal per position than one right id.
``T > 1`` flattens both distributions so the small probabilities count; the ``T^2`` keeps the
term's gradients at the CE's scale as ``T`` changes (Hinton et al., section 2). MiniMind's
``trainer/train_distillation.py`` uses the same loss (``alpha`` 0.5, ``T`` 1.5 by default) and
cuts a bigger teacher vocabulary to the student's; so does ``kd_loss`` here.

``DistillLoss`` is the loss for the course's one training engine
(``training.loop.train(loss_fn=...)``): the teacher runs frozen under ``torch.no_grad``, and
both heads run on the answer positions only (the output head is most of a small model's
compute, and the prompt positions are never scored).

Black-box distillation needs no logits: the student is fine-tuned (plain SFT) on answers the
teacher *generated* (``teacher_answers``), as when the teacher is an API.

>>> s, t = torch.zeros(2, 5), torch.zeros(2, 5)      # two positions, both uniform
>>> kd_loss(s, t, temperature=2.0).item()            # equal distributions: nothing to learn
0.0
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minimind_lib.core.device import pick_device
from minimind_lib.data.conversations import SFTDataset
from minimind_lib.evaluation.questions import generate_answers
from minimind_lib.model.chunked_loss import IGNORE_INDEX
from minimind_lib.model.config import MiniMindConfig
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.training.loop import default_loss, train
from minimind_lib.training.settings import RunOptions, TrainConfig, TrainSettings, require_positive

#: what the student learns from: the teacher's logits (white-box), its generated answers
#: (black-box), or neither (the reference answers alone: the baseline at equal steps)
MODES = ("logits", "answers", "none")


@dataclass(frozen=True)
class DistillSettings(TrainSettings):
    """The ``distill`` stage's hyper-parameters: a ``TrainSettings`` for the student's run, the
    loss (``alpha``, ``temperature``: MiniMind's defaults), what the student learns from
    (``mode``, see ``MODES``), the teacher's answer budget in black-box mode, and the student's
    shape: the teacher's config with these fields changed (``student_config``).

    >>> DistillSettings(mode="soft")
    Traceback (most recent call last):
    ...
    ValueError: DistillSettings.mode is 'soft'; choose one of logits, answers, none
    """

    alpha: float = 0.5
    temperature: float = 1.5
    mode: str = "logits"
    answer_tokens: int = 64  # black-box: the teacher's budget per answer
    student_hidden_size: int = 128
    student_layers: int = 4
    student_heads: int = 4
    student_kv_heads: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        require_positive(self, "temperature", "answer_tokens", "student_hidden_size",
                         "student_layers", "student_heads", "student_kv_heads")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"{name}.alpha must be in [0, 1], got {self.alpha}")
        if self.mode not in MODES:
            raise ValueError(f"{name}.mode is {self.mode!r}; choose one of {', '.join(MODES)}")
        if (self.student_hidden_size % self.student_heads
                or self.student_heads % self.student_kv_heads):
            raise ValueError(f"{name}: student_hidden_size ({self.student_hidden_size}) must be a "
                             f"multiple of student_heads ({self.student_heads}), and that of "
                             f"student_kv_heads ({self.student_kv_heads})")


def student_config(teacher: MiniMindConfig, settings: DistillSettings) -> MiniMindConfig:
    """The teacher's config (vocabulary, positions, RoPE, norms) at the student's size.

    >>> c = student_config(MiniMindConfig(hidden_size=256), DistillSettings())
    >>> c.hidden_size, c.num_hidden_layers, c.intermediate_size, c.vocab_size
    (128, 4, 384, 6400)
    """
    return replace(teacher, hidden_size=settings.student_hidden_size,
                   num_hidden_layers=settings.student_layers,
                   num_attention_heads=settings.student_heads,
                   num_key_value_heads=settings.student_kv_heads, intermediate_size=None,
                   head_dim=None, use_moe=False)


def kd_loss(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """``T^2 * KL(softmax(t / T) || softmax(s / T))``, summed over the vocabulary and averaged
    over the N positions (``F.kl_div``'s ``batchmean``): ``student_logits`` (N, V),
    ``teacher_logits`` (N, V') with V' >= V (a bigger teacher vocabulary is cut to the
    student's, as MiniMind does). The teacher side carries no gradient. fp32 inside.

    >>> s = torch.tensor([[0.0, 0.0]]); t = torch.tensor([[0.0, 100.0]])  # teacher: certain
    >>> round(kd_loss(s, t).item(), 4)                                     # = ln 2
    0.6931
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if student_logits.dim() != 2 or teacher_logits.dim() != 2 or \
            student_logits.shape[0] != teacher_logits.shape[0]:
        raise ValueError(f"logits must be (N, V) with the same N, got "
                         f"{tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}")
    vocab = student_logits.shape[-1]
    if teacher_logits.shape[-1] < vocab:
        raise ValueError(f"the teacher's vocabulary ({teacher_logits.shape[-1]}) is smaller than "
                         f"the student's ({vocab})")
    log_p_student = F.log_softmax(student_logits.float() / temperature, dim=-1)  # (N, V)
    with torch.no_grad():
        log_p_teacher = F.log_softmax(teacher_logits[:, :vocab].float() / temperature, dim=-1)
    # KL(p_t || p_s) = sum_v p_t (log p_t - log p_s): log_target keeps log p_t exact
    kl = F.kl_div(log_p_student, log_p_teacher, reduction="batchmean", log_target=True)
    return temperature ** 2 * kl


def answer_logits(model: nn.Module, input_ids: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """The logits (N, V) that predict the tokens after positions ``(rows, cols)`` (N,) each: the
    trunk runs on the whole batch, the head only there. ``model`` is a ``MiniMindForCausalLM``."""
    hidden, _ = model.model(input_ids)  # (B, T, C)
    return model.lm_head(hidden[rows, cols])  # (N, V)


@dataclass
class DistillLoss:
    """``loss_fn`` for ``training.loop.train`` on SFT batches (``input_ids``, ``labels``):
    ``alpha`` x the answer tokens' cross-entropy + ``(1 - alpha)`` x ``kd_loss`` against the
    frozen ``teacher`` at ``temperature`` (module docstring). Logs ``ce`` and ``kd``.
    ``alpha = 1`` is plain SFT (the teacher is not run).
    """

    teacher: nn.Module
    alpha: float = 0.5
    temperature: float = 1.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        self.teacher.eval().requires_grad_(False)

    def __call__(self, model: nn.Module, batch: dict) -> tuple[Tensor, dict[str, Tensor]]:
        input_ids, labels = batch["input_ids"], batch["labels"]  # (B, T) each
        targets = labels[:, 1:]  # (B, T-1): position t predicts token t+1
        rows, cols = (targets != IGNORE_INDEX).nonzero(as_tuple=True)  # (N,) each
        student = answer_logits(model, input_ids, rows, cols)  # (N, V)
        ce = F.cross_entropy(student.float(), targets[rows, cols])
        if self.alpha == 1.0:
            return ce, {"ce": ce.detach()}
        with torch.no_grad():
            teacher = answer_logits(self.teacher, input_ids, rows, cols)  # (N, V')
        kd = kd_loss(student, teacher, self.temperature)
        loss = self.alpha * ce + (1 - self.alpha) * kd
        return loss, {"ce": ce.detach(), "kd": kd.detach()}


def teacher_answers(teacher: nn.Module, tokenizer: BPETokenizer,
                    conversations: Sequence[Sequence[dict]], max_new_tokens: int, *,
                    batch_size: int = 64, progress: bool = False) -> list[list[dict]]:
    """Black-box distillation's data: each conversation's last assistant turn replaced by the
    teacher's greedy answer to the turns before it (``evaluation.questions.generate_answers``:
    continuous batching). A conversation the teacher did not finish within ``max_new_tokens``
    (no ``<|im_end|>``) is dropped: an answer cut mid-way is not one to imitate."""
    contexts = []
    for messages in conversations:
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
        if last is None:
            raise ValueError("every conversation needs an assistant turn to replace")
        contexts.append(list(messages[:last]))
    answers = generate_answers(teacher, tokenizer, contexts, max_new_tokens,
                               batch_size=batch_size, progress=progress)
    return [context + [{"role": "assistant", "content": answer.text}]
            for context, answer in zip(contexts, answers, strict=True) if answer.follows_format]


def train_distill(student: nn.Module, teacher: nn.Module, tokenizer: BPETokenizer,
                  conversations: Sequence[Sequence[dict]], settings: DistillSettings, *,
                  held_out: Iterable[dict], seed: int, options: RunOptions | None = None,
                  out_dir: str | Path | None = None, resume: bool = False,
                  precision: str = "auto", device: str | None = None, progress: bool = True,
                  callbacks: Iterable[Callable[[dict], None]] = ()) -> list[dict]:
    """Train ``student`` in place on ``conversations`` as ``settings.mode`` says: the teacher's
    logits (``DistillLoss``), the teacher's answers (``teacher_answers``, then the plain
    answer-only loss), or the reference answers alone. The validation curve is the same for
    every mode: the answer tokens' cross-entropy on the ``held_out`` records' reference replies
    (``val_loss``), so the modes compare. Returns the metrics rows."""
    conversations = list(itertools.islice(conversations, settings.max_examples))
    teacher.to(pick_device(device))
    if settings.mode == "answers":
        conversations = teacher_answers(teacher, tokenizer, conversations, settings.answer_tokens,
                                        batch_size=64, progress=progress)
        print(f"distill: the teacher finished {len(conversations):,} answers")
    train_set = SFTDataset(({"conversations": c} for c in conversations), tokenizer,
                           settings.seq_len, progress=progress)
    validation = SFTDataset(held_out, tokenizer, settings.seq_len, progress=False)
    config = TrainConfig.from_stage(settings, options, out_dir=out_dir, precision=precision,
                                    device=device, seed=seed, progress=progress)
    loss_fn = (DistillLoss(teacher, settings.alpha, settings.temperature)
               if settings.mode == "logits" else default_loss)
    return train(student, train_set, config, loss_fn=loss_fn, collate_fn=train_set.collate,
                 eval_dataset=validation, eval_loss_fn=default_loss, resume=resume,
                 callbacks=list(callbacks))
