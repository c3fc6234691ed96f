"""Direct Preference Optimization: sequence log-probs, the DPO loss, pairs, the stage (notebook 06).

DPO (Rafailov et al. 2023, "Direct Preference Optimization: Your Language Model is Secretly a
Reward Model") aligns a model with preference pairs ``(x, y_w, y_l)`` -- a prompt, a preferred
("chosen") and a dispreferred ("rejected") answer -- without a reward model or RL. The optimum
of the KL-regularised RLHF objective (eq. 3) is ``pi*(y|x) = pi_ref(y|x) exp(r(x,y) / beta) / Z(x)``
(eq. 4); solved for the reward, ``r(x,y) = beta log pi*(y|x)/pi_ref(y|x) + beta log Z(x)``
(eq. 5), and put into the Bradley-Terry preference model, ``Z`` cancels, leaving a plain
classification loss on the policy (eq. 7)::

    L = -log sigmoid( beta * [log pi(y_w|x)/pi_ref(y_w|x) - log pi(y_l|x)/pi_ref(y_l|x)] )

The pieces, one function each:

1. ``sequence_logprobs``: ``log pi(y|x)``, summed over the answer tokens only;
2. ``dpo_loss``: eq. 7 plus the implicit rewards ``beta log pi/pi_ref`` of both answers;
3. ``DPODataset`` / ``collate_pairs``: pairs tokenised with the SFT answer-only mask
   (``minimind_lib.data.conversations.sft_example``), chosen and rejected stacked into one batch
   (the on-policy pairs, the model's own graded answers: ``minimind_lib.training.on_policy``);
4. ``DPOLoss``: the loss function the training engine (``minimind_lib.training.loop.train``) calls,
   against a frozen reference model or reference log-probs computed once beforehand;
5. ``train_dpo``, and the held-out evaluation; the ``dpo`` stage (``minimind_lib.course.stages``,
   ``python -m minimind_lib dpo``) runs them on the SFT model.

>>> loss, chosen, rejected = dpo_loss(torch.tensor([-5.0]), torch.tensor([-9.0]),
...                                   torch.tensor([-6.0]), torch.tensor([-8.0]), beta=0.1)
>>> chosen.item(), round(rejected.item(), 6)   # beta * (policy - reference) per answer
(0.10000000149011612, -0.1)
>>> round(loss.item(), 4)                       # -log sigmoid(0.1 - (-0.1))
0.5981
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from minimind_lib.core.checked_files import FileProblem, read_json
from minimind_lib.core.device import Precision, pick_device, pick_precision
from minimind_lib.core.filenames import EVAL_FILE
from minimind_lib.data.conversations import pad_sft_batch, sft_example
from minimind_lib.data.readers import read_jsonl
from minimind_lib.evaluation.model_eval import ModelEval, read_eval
from minimind_lib.evaluation.preferences import (
    PreferenceScores,
    preference_table,
    score_preferences,
)
from minimind_lib.evaluation.questions import eval_files, select_per_task
from minimind_lib.model.decoder import IGNORE_INDEX
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.tokenizer.special import END_OF_TEXT
from minimind_lib.training.logprobs import _answer_counts, frozen_copy, sequence_logprobs
from minimind_lib.training.loop import train
from minimind_lib.training.settings import TrainConfig, TrainSettings

T = TypeVar("T")
PAIR_SOURCES = ("on_policy", "offline")  # DPOSettings.pairs
#: one tokenised pair: chosen ids, chosen labels, rejected ids, rejected labels, task, family
PairExample = tuple[Sequence[int], Sequence[int], Sequence[int], Sequence[int], str | None,
                    str | None]


@dataclass(frozen=True)
class DPOSettings(TrainSettings):
    """A DPO run's hyper-parameters: the training ones, plus ``beta``, the strength of the KL
    anchor to the reference (eq. 3's beta: larger keeps the policy closer to it), and where the
    pairs come from.

    ``pairs="on_policy"``: ``questions`` training questions of the ``tasks`` named (task or
    family names, ``rollout.select_tasks``; a seeded sample), each answered greedily plus
    ``samples - 1`` times at ``temperature`` by the starting model, paired right vs wrong
    (``on_policy_pairs``). ``pairs="offline"``: the bundled (or MiniMind's) DPO pairs.
    ``nll_weight``: the weight of the chosen answers' NLL added to the loss (``DPOLoss``).
    ``val_questions``: on-policy, further training questions (none of the ``questions``) whose
    pairs, made the same way, are the validation set (``val_loss``): the held-out loss on the
    kind of pairs the stage trains on. 0: validate on the offline held-out pairs only.
    ``replay_weight``: the weight of a language-model loss on windows of pretraining text, one
    window of ``replay_window`` tokens beside every pair (``PairsWithText``; 0: none), which
    keeps the model modelling text (InstructGPT's "PPO-ptx" term, Ouyang et al. 2022, eq. 2)."""

    beta: float = 0.1
    pairs: str = "on_policy"
    samples: int = 4
    temperature: float = 1.0
    questions: int | None = 2000
    tasks: str = "skill"
    nll_weight: float = 0.0
    pairs_per_question: int = 1  # on-policy: the chosen answer against up to this many wrong ones
    val_questions: int = 200
    replay_weight: float = 0.0
    replay_window: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.beta <= 0:
            raise ValueError(f"DPOSettings.beta must be positive, got {self.beta}")
        if self.pairs not in PAIR_SOURCES:
            raise ValueError(f"DPOSettings.pairs is {self.pairs!r}; choose one of "
                             f"{', '.join(PAIR_SOURCES)}")
        if self.samples < 2:
            raise ValueError(f"DPOSettings.samples must be at least 2 (the greedy answer and "
                             f"one sample), got {self.samples}")
        if self.temperature <= 0 or self.nll_weight < 0:
            raise ValueError(f"DPOSettings: temperature must be positive and nll_weight >= 0, "
                             f"got {self.temperature} and {self.nll_weight}")
        if self.pairs_per_question < 1:
            raise ValueError(f"DPOSettings.pairs_per_question must be at least 1, got "
                             f"{self.pairs_per_question}")
        if self.val_questions < 0 or self.replay_weight < 0:
            raise ValueError(f"DPOSettings: val_questions and replay_weight must be >= 0, got "
                             f"{self.val_questions} and {self.replay_weight}")
        if not 2 <= self.replay_window <= self.seq_len:
            raise ValueError(f"DPOSettings.replay_window must be in [2, seq_len={self.seq_len}], "
                             f"got {self.replay_window}")
        if self.questions is not None and self.questions <= 0:
            raise ValueError(f"DPOSettings.questions must be positive or None, got "
                             f"{self.questions}")


# --- 2. the loss -----------------------------------------------------------------------


def dpo_loss(policy_chosen: Tensor, policy_rejected: Tensor, ref_chosen: Tensor,
             ref_rejected: Tensor, beta: float = 0.1) -> tuple[Tensor, Tensor, Tensor]:
    """DPO loss (Rafailov et al. 2023, eq. 7) and the implicit rewards of both answers.

    Inputs are summed log-probs ``log pi(y|x)``, each (B,). The implicit reward of an answer
    is ``beta * log pi(y|x)/pi_ref(y|x)`` (eq. 5 without the prompt-only ``beta log Z(x)``,
    which cancels in a pair); the loss is ``-log sigmoid(r_chosen - r_rejected)``, the
    Bradley-Terry likelihood of the preference, averaged over the batch. Returns
    ``(loss, chosen_rewards (B,), rejected_rewards (B,))``, the rewards detached (for logging).
    When the policy equals the reference every reward is 0 and the loss is ``ln 2``.

    >>> x = torch.tensor([-3.0, -7.0])
    >>> loss, rc, rr = dpo_loss(x, x - 1, x, x - 1)     # policy == reference
    >>> round(loss.item(), 6), rc.tolist(), rr.tolist()        # ln 2 = 0.693147...
    (0.693147, [0.0, 0.0], [0.0, 0.0])
    """
    if beta <= 0:
        raise ValueError(f"beta must be positive, got {beta}")
    chosen_rewards = beta * (policy_chosen - ref_chosen)  # (B,)
    rejected_rewards = beta * (policy_rejected - ref_rejected)  # (B,)
    # subtle: logsigmoid, not log(sigmoid(.)): exact for large margins, where sigmoid rounds to 1
    loss = -F.logsigmoid(chosen_rewards - rejected_rewards).mean()
    return loss, chosen_rewards.detach(), rejected_rewards.detach()


# --- 3. preference pairs ---------------------------------------------------------------


class DPODataset(Dataset):
    """Preference pairs tokenised with the SFT answer-only mask (``data.sft_example``).

    Each record is ``{"chosen": [messages], "rejected": [messages]}`` whose messages agree up
    to the last (assistant) one: the same prompt ``x``, two answers. Item ``i`` holds both
    sequences and their labels (-100 everywhere but the answer content and its ``<|im_end|>``),
    plus ``ref_logps`` (2,) once reference log-probs are attached (``set_reference``).
    Pairs whose answer is cut off entirely by ``seq_len`` are dropped (counted in
    ``dropped``): with no answer token left there is nothing to prefer.
    ``tasks`` / ``families`` keep each pair's ``"task"`` / ``"family"`` (None when absent).
    """

    def __init__(self, records: Iterable[dict], tokenizer: BPETokenizer, seq_len: int,
                 source: str = "records"):
        examples = []
        for n, record in enumerate(records, start=1):
            chosen, rejected = record["chosen"], record["rejected"]
            if chosen[:-1] != rejected[:-1]:
                raise ValueError(f"{source}: record {n}: 'chosen' and 'rejected' must share the "
                                 "prompt (every message but the last assistant answer)")
            examples.append((*sft_example(tokenizer, chosen, seq_len),
                             *sft_example(tokenizer, rejected, seq_len),
                             record.get("task"), record.get("family")))
        self._fill(examples, tokenizer.token_to_id(END_OF_TEXT), f"{source} (seq_len={seq_len})")

    @classmethod
    def from_examples(cls, examples: Iterable[PairExample], pad_id: int,
                      source: str = "examples") -> DPODataset:
        """Pairs already tokenised: ``(chosen_ids, chosen_labels, rejected_ids, rejected_labels,
        task, family)`` with SFT-style labels (e.g. the model's own sampled answers:
        ``on_policy_pairs``)."""
        dataset = cls.__new__(cls)
        dataset._fill(examples, pad_id, source)
        return dataset

    def _fill(self, examples: Iterable[PairExample], pad_id: int, source: str) -> None:
        self.pairs: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
        self.tasks: list[str | None] = []
        self.families: list[str | None] = []
        self.dropped = 0
        self.pad_id = pad_id
        for *sides, task, family in examples:
            c_ids, c_labels, r_ids, r_labels = (torch.as_tensor(t, dtype=torch.long) for t in sides)
            if not ((c_labels[1:] != IGNORE_INDEX).any() and (r_labels[1:] != IGNORE_INDEX).any()):
                self.dropped += 1
                continue
            self.pairs.append((c_ids, c_labels, r_ids, r_labels))
            self.tasks.append(task)
            self.families.append(family)
        if not self.pairs:
            raise ValueError(f"{source}: no usable preference pair ({self.dropped} pairs had "
                             "their answers cut off)")
        self.ref_logps: Tensor | None = None  # (N, 2): reference log pi of chosen, rejected

    @classmethod
    def from_files(cls, paths: Sequence[str | Path], tokenizer: BPETokenizer, seq_len: int, *,
                   max_examples: int | None = None, sample: int | None = None,
                   seed: int = 0) -> DPODataset:
        """The first ``max_examples`` pairs (None: all) of DPO jsonl ``paths``, validated; with
        ``sample``, a seeded uniform sample of that many of them (``reservoir_sample``)."""
        records = itertools.islice(
            itertools.chain.from_iterable(read_jsonl(p, "dpo") for p in paths), max_examples)
        if sample is not None:
            records = reservoir_sample(records, sample, seed)
        return cls(records, tokenizer, seq_len, source=", ".join(str(p) for p in paths))

    def set_reference(self, ref_logps: Tensor) -> None:
        """Attach reference log-probs (N, 2) (``pair_logprobs(reference, self)``): batches then
        carry them and the reference model is not needed during training."""
        if ref_logps.shape != (len(self), 2):
            raise ValueError(f"ref_logps must have shape ({len(self)}, 2), "
                             f"got {tuple(ref_logps.shape)}")
        self.ref_logps = ref_logps.detach().float().cpu()

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        c_ids, c_labels, r_ids, r_labels = self.pairs[i]
        item = {"chosen_input_ids": c_ids, "chosen_labels": c_labels,
                "rejected_input_ids": r_ids, "rejected_labels": r_labels}
        if self.ref_logps is not None:
            item["ref_logps"] = self.ref_logps[i]  # (2,)
        return item

    def collate(self, items: Sequence[dict[str, Tensor]]) -> dict[str, Tensor]:
        """``collate_pairs`` with this tokenizer's pad id
        (``train(..., collate_fn=ds.collate)``)."""
        return collate_pairs(items, self.pad_id)


def reservoir_sample(items: Iterable[T], k: int, seed: int) -> list[T]:
    """``k`` items drawn uniformly without replacement from a stream of unknown length, kept in
    stream order (Vitter 1985, "Random Sampling with a Reservoir", Algorithm R); all items
    when there are at most ``k``. Memory: ``k`` items, never the whole stream.

    >>> reservoir_sample(range(10), 4, seed=0), reservoir_sample("abc", 5, seed=0)
    ([1, 2, 5, 6], ['a', 'b', 'c'])
    """
    rng = random.Random(seed)
    kept: list[tuple[int, T]] = []
    for i, item in enumerate(items):
        if i < k:
            kept.append((i, item))
        elif (j := rng.randrange(i + 1)) < k:  # item i stays with probability k / (i + 1)
            kept[j] = (i, item)
    return [item for _, item in sorted(kept, key=lambda pair: pair[0])]


def collate_pairs(items: Sequence[dict[str, Tensor]], pad_id: int = 0) -> dict[str, Tensor]:
    """Stack B pairs into one batch of 2B rows: the B chosen sequences, then the B rejected.

    Rows are right-padded like SFT batches (``data.conversations.pad_sft_batch``: ``pad_id``,
    labels -100), so one forward pass scores both answers of every pair. ``pad_id`` 0 is
    ``<|endoftext|>``.

    >>> item = {"chosen_input_ids": torch.tensor([5, 6, 7]),
    ...         "chosen_labels": torch.tensor([-100, 6, 7]),
    ...         "rejected_input_ids": torch.tensor([5, 8]),
    ...         "rejected_labels": torch.tensor([-100, 8])}
    >>> batch = collate_pairs([item])
    >>> batch["input_ids"].tolist(), batch["labels"].tolist()
    ([[5, 6, 7], [5, 8, 0]], [[-100, 6, 7], [-100, 8, -100]])
    """
    rows = [{"input_ids": it[f"{side}_input_ids"], "labels": it[f"{side}_labels"]}
            for side in ("chosen", "rejected") for it in items]
    batch = pad_sft_batch(rows, pad_id)  # (2B, T) each
    if "ref_logps" in items[0]:
        ref = torch.stack([it["ref_logps"] for it in items])  # (B, 2)
        batch["ref_logps"] = torch.cat([ref[:, 0], ref[:, 1]])  # (2B,) in row order
    return batch


class PairsWithText(Dataset):
    """Preference pairs, each with a window of pretraining text beside it (drawn without
    repetition, seeded, while the text lasts): a batch of B pairs also carries
    ``text_ids`` (B, window), on which ``DPOLoss`` adds ``replay_weight`` times the
    next-token loss.

    >>> import tempfile
    >>> import numpy as np
    >>> from minimind_lib.data.pretraining import PretrainDataset
    >>> p = Path(tempfile.mkdtemp()) / "train.bin"
    >>> np.arange(100, dtype=np.uint16).tofile(p)
    >>> pairs = DPODataset.from_examples([([1, 2], [-100, 2], [1, 3], [-100, 3], None, None)], 0)
    >>> batch = PairsWithText(pairs, PretrainDataset(p, seq_len=7), seed=0).collate(
    ...     [PairsWithText(pairs, PretrainDataset(p, seq_len=7), seed=0)[0]])
    >>> batch["input_ids"].shape, batch["text_ids"].shape   # 2B rows of pairs, B of text
    (torch.Size([2, 2]), torch.Size([1, 8]))
    """

    def __init__(self, pairs: DPODataset, text: Dataset, seed: int) -> None:
        self.pairs, self.text = pairs, text
        rng = torch.Generator().manual_seed(seed)
        rounds = -(-len(pairs) // len(text))
        self._picks = torch.cat([torch.randperm(len(text), generator=rng)
                                 for _ in range(rounds)])[:len(pairs)]  # (N,) window per pair

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {**self.pairs[i], "text_ids": self.text[int(self._picks[i])]["input_ids"]}

    def collate(self, items: Sequence[dict[str, Tensor]]) -> dict[str, Tensor]:
        batch = self.pairs.collate(items)
        if "text_ids" in items[0]:  # (validation pairs, collated alike, carry none)
            batch["text_ids"] = torch.stack([it["text_ids"] for it in items])  # (B, window)
        return batch


@torch.no_grad()
def pair_logprobs(model: nn.Module, dataset: DPODataset, *, batch_size: int = 32,
                  device: str | torch.device | None = None, precision: str | Precision = "auto",
                  average: bool = False) -> Tensor:
    """``log pi(y|x)`` of both answers of every pair, (N, 2) = [chosen, rejected], in order.

    Runs ``model`` in eval mode without gradients (its mode is restored afterwards). Used for
    the reference log-probs (``DPODataset.set_reference``) and for preference accuracy.
    """
    device = pick_device(device) if device is None or isinstance(device, str) else device
    precision = precision if isinstance(precision, Precision) else pick_precision(device, precision)
    was_training = model.training
    model.to(device).eval()
    out = []
    for batch in DataLoader(dataset, batch_size=batch_size, shuffle=False,
                            collate_fn=dataset.collate):
        with precision.context(device):
            logps = sequence_logprobs(model, batch["input_ids"].to(device),
                                      batch["labels"].to(device), average)  # (2b,)
        out.append(torch.stack(logps.float().cpu().chunk(2), dim=1))  # (b, 2)
    model.train(was_training)
    return torch.cat(out)  # (N, 2)


@dataclass
class DPOLoss:
    """``loss_fn`` for ``minimind_lib.training.loop.train``: the DPO loss of a ``collate_pairs``
    batch.

    The reference log-probs come from the batch (``"ref_logps"``, precomputed) or, when absent,
    from ``reference`` run under ``torch.no_grad``. Metrics logged per optimizer step:
    ``reward_accuracy`` (share of pairs whose chosen reward is higher), ``reward_margin``
    (mean chosen - rejected reward), ``chosen_reward`` / ``rejected_reward`` (means) and the
    policy's mean ``chosen_logp`` / ``rejected_logp``.

    ``nll_weight`` > 0 adds ``nll_weight`` times the chosen answers' negative log-likelihood
    per token (the SFT loss on the chosen side; logged as ``nll``): DPO + NLL, as in Pang et al.
    2024, "Iterative Reasoning Preference Optimization" (eq. 1). DPO alone only asks for a
    *margin*, and often lowers the chosen answer's own probability along with the rejected one;
    on pairs graded right / wrong that costs exactly the greedy answers the grader checks.

    ``replay_weight`` > 0 adds that times the next-token loss on the batch's ``text_ids``
    (pretraining text, ``PairsWithText``; logged as ``text_nll``): the term that keeps the model
    modelling text while it learns the preferences. Batches without ``text_ids`` (validation)
    get no such term.
    """

    beta: float = 0.1
    reference: nn.Module | None = None
    average: bool = False  # length-normalised log-probs (see sequence_logprobs)
    nll_weight: float = 0.0
    replay_weight: float = 0.0

    def __post_init__(self) -> None:
        if self.beta <= 0:
            raise ValueError(f"DPOLoss.beta must be positive, got {self.beta}")
        if self.nll_weight < 0 or self.replay_weight < 0:
            raise ValueError(f"DPOLoss: nll_weight and replay_weight must be >= 0, got "
                             f"{self.nll_weight} and {self.replay_weight}")

    def __call__(self, model: nn.Module, batch: dict) -> tuple[Tensor, dict[str, Tensor]]:
        input_ids, labels = batch["input_ids"], batch["labels"]  # (2B, T) each
        logps = sequence_logprobs(model, input_ids, labels, self.average)  # (2B,)
        if "ref_logps" in batch:
            ref_logps = batch["ref_logps"]  # (2B,)
        elif self.reference is not None:
            self.reference.to(input_ids.device)  # a no-op once it is there
            with torch.no_grad():
                ref_logps = sequence_logprobs(self.reference, input_ids, labels, self.average)
        else:
            raise ValueError("DPOLoss needs a reference model or batches with 'ref_logps' "
                             "(DPODataset.set_reference)")
        policy_chosen, policy_rejected = logps.chunk(2)  # (B,) each
        ref_chosen, ref_rejected = ref_logps.chunk(2)
        loss, chosen, rejected = dpo_loss(policy_chosen, policy_rejected, ref_chosen,
                                          ref_rejected, self.beta)
        metrics = {"reward_accuracy": (chosen > rejected).float().mean(),
                   "reward_margin": (chosen - rejected).mean(),
                   "chosen_reward": chosen.mean(), "rejected_reward": rejected.mean(),
                   "chosen_logp": policy_chosen.detach().mean(),
                   "rejected_logp": policy_rejected.detach().mean(),
                   "dpo_loss": loss.detach()}  # eq. 7 alone, before the terms below
        if self.nll_weight > 0:
            chosen_tokens = _answer_counts(labels.chunk(2)[0])  # (B,)
            nll = -(policy_chosen if self.average else policy_chosen / chosen_tokens).mean()
            loss = loss + self.nll_weight * nll
            metrics["nll"] = nll.detach()
        if self.replay_weight > 0 and "text_ids" in batch:
            text = batch["text_ids"]  # (B, window)
            text_nll = model(text, labels=text).loss
            loss = loss + self.replay_weight * text_nll
            metrics["text_nll"] = text_nll.detach()
        return loss, metrics


def train_dpo(policy: nn.Module, train_set: DPODataset, config: TrainConfig, *,
              beta: float = 0.1, nll_weight: float = 0.0, reference: nn.Module | None = None,
              precompute_reference: bool = True,
              eval_set: DPODataset | Mapping[str, DPODataset] | None = None,
              resume: bool = False, callbacks: Sequence[Callable[[dict], None]] = (),
              replay_text: Dataset | None = None, replay_weight: float = 0.0,
              seed: int = 0) -> list[dict]:
    """DPO-train ``policy`` in place with the training engine; return its metrics rows.

    ``reference`` defaults to ``policy`` as it is now (the SFT model). With
    ``precompute_reference=True`` every pair is scored by the reference once, before training,
    and the log-probs are attached to the datasets: each step then runs one forward pass
    instead of two, and no second model is kept in memory (with the default reference it is
    never even copied: the policy scores the pairs before its first update). Otherwise the
    reference is a frozen copy (``frozen_copy``) run on every batch. ``eval_set`` is the
    validation set (``val_loss``), or ``{metric name: pairs}`` for several (``loop.train``).
    With ``replay_weight`` > 0, every training pair gets a window of ``replay_text``
    (``PairsWithText``, seeded by ``seed``) and the loss its next-token term.
    """
    if replay_weight > 0 and replay_text is None:
        raise ValueError("replay_weight > 0 needs replay_text (pretraining windows)")
    reference = reference if reference is not None else policy
    eval_sets = (dict(eval_set) if isinstance(eval_set, Mapping)
                 else {} if eval_set is None else {"val_loss": eval_set})
    if precompute_reference:
        device = pick_device(config.device)
        precision = pick_precision(device, config.precision)
        for dataset in (train_set, *eval_sets.values()):
            dataset.set_reference(pair_logprobs(reference, dataset, device=device,
                                                precision=precision))
        loss_fn = DPOLoss(beta, nll_weight=nll_weight, replay_weight=replay_weight)
    else:
        loss_fn = DPOLoss(beta, frozen_copy(reference), nll_weight=nll_weight,
                          replay_weight=replay_weight)
    data = PairsWithText(train_set, replay_text, seed) if replay_weight > 0 else train_set
    return train(policy, data, config, loss_fn=loss_fn, eval_dataset=eval_sets or None,
                 collate_fn=data.collate, resume=resume, callbacks=list(callbacks))


# --- 5. held-out evaluation ------------------------------------------------------------


def held_out_pairs(tokenizer: BPETokenizer, seq_len: int,
                   per_task: int | None = None) -> DPODataset:
    """The held-out preference pairs (``data/eval/dpo_eval*.jsonl``): the first ``per_task``
    of every task. No held-out prompt occurs in any training file."""
    records = [r for path in eval_files("dpo") for r in read_jsonl(path, "dpo")]
    return DPODataset(select_per_task(records, per_task), tokenizer, seq_len,
                      source="held-out DPO pairs")


@dataclass
class PreferenceEval:
    """Held-out preference accuracy of the SFT model (log-prob) and the DPO model (log-prob and
    implicit reward), and both models' exact-match / format rate
    (``evaluation.model_eval.ModelEval``)."""

    sft: dict[str, PreferenceScores]
    dpo: dict[str, PreferenceScores]

    def table(self) -> str:
        return preference_table({"SFT": self.sft, "DPO": self.dpo})

    def to_dict(self) -> dict:
        """What the dpo stage writes under ``eval.json``'s ``"preference"``."""
        return {name: {k: asdict(v) for k, v in res.items()}
                for name, res in (("sft", self.sft), ("dpo", self.dpo))}


def evaluate_preferences(policy: nn.Module, pairs: DPODataset, reference_logps: Tensor, *,
                         precision: str = "auto", device: str | None = None) -> PreferenceEval:
    """Preference accuracy on ``pairs`` before (``reference_logps``: the SFT model's) and after."""
    logps = pair_logprobs(policy, pairs, device=device, precision=precision)  # (N, 2)
    return PreferenceEval(score_preferences(pairs.tasks, pairs.families, reference_logps),
                          score_preferences(pairs.tasks, pairs.families, logps, reference_logps))


def read_dpo_eval(stage_dir: str | Path) -> tuple[PreferenceEval, dict[str, ModelEval]]:
    """The ``eval.json`` of a ``dpo`` stage folder: preference accuracy, and the SFT and DPO
    models' held-out question scores ({"sft": ..., "dpo": ...})."""
    path = Path(stage_dir) / EVAL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (run the dpo stage first)")
    data = read_json(path)
    try:
        prefs = {name: {k: PreferenceScores(**v) for k, v in res.items()}
                 for name, res in data["preference"].items()}
    except (KeyError, TypeError, AttributeError) as e:
        raise FileProblem(f"{path}: not a dpo stage's eval.json ({type(e).__name__}: {e})"
                          ) from None
    return PreferenceEval(prefs["sft"], prefs["dpo"]), read_eval(stage_dir)
