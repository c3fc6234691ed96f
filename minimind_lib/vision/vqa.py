"""Visual question answering on the synthetic scenes (notebook 13): training examples whose
answer alone is supervised (``vqa_example``, ``VQADataset``), greedy answers to held-out
questions and their exact-match scores per question kind (``score_vqa``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from minimind_lib.evaluation.questions import Answer, exact_match
from minimind_lib.model.decoder import (
    IGNORE_INDEX,
)
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.tokenizer.special import END_OF_TEXT, IM_END
from minimind_lib.vision.clip import (
    to_pixels,
)
from minimind_lib.vision.scenes import (
    LANGUAGES,
    QUESTION_KINDS,
    Scene,
    answers,
    check_shares,
    make_scene,
    questions,
    render,
    training_scene,
)
from minimind_lib.vision.vlm import VisionLanguageModel, encode_image_chat


def vqa_example(tokenizer: BPETokenizer, question: str, answer: str,
                image_tokens: int) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of one question about a picture: the prompt with its image
    slots, then the answer and ``<|im_end|>``, the only supervised tokens (answer-only loss,
    as ``data.sft_example`` labels an SFT reply)."""
    prompt = encode_image_chat(tokenizer, [{"role": "user", "content": question}], image_tokens,
                               add_generation_prompt=True)
    reply = tokenizer.encode(answer, allowed_special=set()) + [tokenizer.token_to_id(IM_END)]
    return prompt + reply, [IGNORE_INDEX] * len(prompt) + reply


# --- training data -------------------------------------------------------------------------

QUESTIONS_PER_SCENE = len(QUESTION_KINDS) * len(LANGUAGES)


class VQADataset(Dataset):
    """Questions about pictures for ``training.loop.train``: item ``k`` is question ``k % 10`` about
    scene ``k // 10`` (drawn on demand) of ``split``; of the training set
    (``scenes.training_scene``) when ``split`` is "train", with its ``recoloured`` and
    ``reshaped`` shares. A recoloured or reshaped scene has eight questions, not ten: its
    items 8 and 9 ask its first two again. ``collate`` pads a batch."""

    def __init__(self, tokenizer: BPETokenizer, images: int, *, seed: int, image_tokens: int,
                 split: str = "train", recoloured: float = 0.0, reshaped: float = 0.0) -> None:
        if images <= 0:
            raise ValueError(f"a VQA dataset needs at least one picture, got {images}")
        if split != "train" and (recoloured or reshaped):
            raise ValueError(f"recoloured and reshaped shares are for the training split, not "
                             f"{split!r}")
        self.tokenizer, self.images, self.seed = tokenizer, images, seed
        self.image_tokens, self.split = image_tokens, split
        self.recoloured, self.reshaped = check_shares(recoloured, reshaped)
        self.pad_id = tokenizer.token_to_id(END_OF_TEXT)

    def __len__(self) -> int:
        return self.images * QUESTIONS_PER_SCENE

    def scene(self, i: int) -> Scene:
        if self.split != "train":
            return make_scene(self.seed, self.split, i)
        return training_scene(self.seed, i, self.images, self.recoloured, self.reshaped)

    def __getitem__(self, k: int) -> dict:
        scene = self.scene(k // QUESTIONS_PER_SCENE)
        records = questions(scene)
        record = records[k % QUESTIONS_PER_SCENE % len(records)]
        ids, labels = vqa_example(self.tokenizer, record["question"], record["answer"],
                                  self.image_tokens)
        return {"image": render(scene), "ids": ids, "labels": labels}

    def collate(self, items: Sequence[dict]) -> dict:
        longest = max(len(it["ids"]) for it in items)
        ids = torch.full((len(items), longest), self.pad_id, dtype=torch.long)
        labels = torch.full((len(items), longest), IGNORE_INDEX, dtype=torch.long)
        for i, it in enumerate(items):
            ids[i, :len(it["ids"])] = torch.tensor(it["ids"])
            labels[i, :len(it["labels"])] = torch.tensor(it["labels"])
        return {"input_ids": ids, "labels": labels,
                "pixel_values": to_pixels(np.stack([it["image"] for it in items]))}


def vqa_loss(model: nn.Module, batch: dict) -> tuple[Tensor, dict]:
    """``training.loop.train``'s ``loss_fn`` for the VLM: the answer-only cross-entropy."""
    return model.answer_loss(batch["input_ids"], batch["pixel_values"], batch["labels"]), {}


# --- answering and scoring -----------------------------------------------------------------


def vqa_records(seed: int, split: str, images: int) -> list[dict]:
    """All ten questions about each of the first ``images`` scenes of ``split``; each record
    holds its ``scene`` too."""
    return [{**q, "scene": scene} for scene in (make_scene(seed, split, i) for i in range(images))
            for q in questions(scene)]


@torch.inference_mode()
def answer_questions(vlm: VisionLanguageModel, tokenizer: BPETokenizer, records: Sequence[dict],
                     max_new_tokens: int = 8, batch_size: int = 64,
                     progress: bool = False) -> list[Answer]:
    """Greedy answers to ``records`` (``question`` about ``scene``), prompts of equal length
    batched together (no padding: each answer is what the model says to that prompt alone)."""
    end_turn, end_text = tokenizer.token_to_id(IM_END), tokenizer.token_to_id(END_OF_TEXT)
    prompts = [encode_image_chat(tokenizer, [{"role": "user", "content": r["question"]}],
                                 vlm.image_tokens, add_generation_prompt=True) for r in records]
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(prompts):
        by_length[len(p)].append(i)
    device, was_training = next(vlm.parameters()).device, vlm.training
    vlm.eval()
    out: list[Answer | None] = [None] * len(records)
    bar = tqdm(total=len(records), desc="answer", disable=not progress)
    for group in by_length.values():
        for k in range(0, len(group), batch_size):
            idx = group[k:k + batch_size]
            ids = torch.tensor([prompts[i] for i in idx], device=device)  # (B, T)
            pixels = to_pixels(np.stack([render(records[i]["scene"]) for i in idx])).to(device)
            steps = list(vlm.stream(ids, max_new_tokens, temperature=0, eos_token_id=end_turn,
                                    pixel_values=pixels))
            for i, row in zip(idx, torch.stack(steps, dim=1).tolist(), strict=True):
                stop = next((j for j, t in enumerate(row) if t in (end_turn, end_text)), len(row))
                out[i] = Answer(tokenizer.decode(row[:stop]),
                                ended=stop < len(row) and row[stop] == end_turn)
            bar.update(len(idx))
    bar.close()
    vlm.train(was_training)
    return out


@dataclass(frozen=True)
class VQAScore:
    """Exact-match over ``n`` questions, and what guessing among the possible answers scores."""

    n: int
    exact_match: float
    chance: float


def score_vqa(records: Sequence[dict], replies: Sequence[Answer]) -> dict[str, VQAScore]:
    """Scores over all questions ("all"), per kind ("colour", ...), per language ("en", "zh")
    and per kind and language ("colour/zh").

    >>> s = make_scene(0, "held_out", 0)
    >>> recs = [{**q, "scene": s} for q in questions(s)][:2]     # colour, shape (English)
    >>> score_vqa(recs, [Answer(recs[0]["answer"], True), Answer("nothing", True)])["all"]
    VQAScore(n=2, exact_match=0.5, chance=0.225)
    """
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r, a in zip(records, replies, strict=True):
        row = (float(exact_match(a.text, r["answer"])), 1 / len(answers(r["kind"], r["language"])))
        for key in ("all", r["kind"], r["language"], f"{r['kind']}/{r['language']}"):
            groups[key].append(row)
    return {key: VQAScore(len(rows), sum(x for x, _ in rows) / len(rows),
                          sum(c for _, c in rows) / len(rows)) for key, rows in groups.items()}
