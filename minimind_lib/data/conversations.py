"""SFT conversations as training examples (notebook 05): ``sft_example`` renders the chat
template and labels only the assistant's replies and their ``<|im_end|>`` (everything else is
``IGNORE_INDEX``), ``SFTDataset`` reads jsonl files into such examples, ``pad_sft_batch`` pads.

Under MiniMind-3's template (``template="minimind-3"``) a reply is its think block, content and
tool calls; tool responses, like user turns, are never supervised.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from minimind_lib.model.decoder import IGNORE_INDEX
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.tokenizer.chat import TemplateMismatch, chat_parts, marker_id, template_of
from minimind_lib.tokenizer.chat3 import minimind3_pieces
from minimind_lib.tokenizer.special import END_OF_TEXT, IM_END, IM_START, THINK_END

# --- SFT: ChatML conversations with answer-only labels (notebook 05) ---------------------

def sft_segments(messages: Sequence[dict],
                 template: str = "minimind-3") -> list[tuple[str, bool, bool]]:
    """The rendered conversation (``apply_chat_template``) as ``(text, is_special, supervised)``
    pieces: the assistant's content and the ``<|im_end|>`` closing its turn are supervised;
    system and user turns, role markers and newlines are not. Under ``template="minimind-3"``
    (the default) the pieces are ``minimind3_pieces``' (think block and tool calls supervised
    too); MiniMind2's:

    >>> for seg in sft_segments([{"role": "user", "content": "1+1?"},
    ...                          {"role": "assistant", "content": "2"}], "minimind2")[4:]:
    ...     print(seg)
    ('<|im_start|>', True, False)
    ('user\\n1+1?', False, False)
    ('<|im_end|>', True, False)
    ('\\n', False, False)
    ('<|im_start|>', True, False)
    ('assistant\\n', False, False)
    ('2', False, True)
    ('<|im_end|>', True, True)
    ('\\n', False, False)
    """
    if template == "minimind-3":
        return minimind3_pieces(messages)
    segments: list[tuple[str, bool, bool]] = []
    parts = chat_parts(messages, template=template)
    in_reply = False
    for k, (text, special) in enumerate(parts):
        if special:
            segments.append((text, True, in_reply and text == IM_END))
            in_reply = False
            continue
        role, _, content = text.partition("\n")
        if k > 0 and parts[k - 1][0] == IM_START and role == "assistant":
            # subtle: the role header and the reply are encoded apart, exactly as at inference,
            # where the prompt ends with the generation prompt "assistant\n" and the model
            # writes the reply's tokens after it (joined, BPE could merge across the "\n").
            segments += [("assistant\n", False, False), (content, False, True)]
            in_reply = True
        else:
            segments.append((text, False, False))
    return segments


def _assemble(tokenizer: BPETokenizer, segments: Sequence[tuple[str, bool, bool]],
              encoded: Iterator[list[int]], seq_len: int,
              template: str = "minimind-3") -> tuple[list[int], list[int]]:
    """Join segment ids (``encoded`` holds the non-special ones, in order) and their labels.

    The ``"\n\n"`` closing an empty think block (a reply's text starts with it) is context
    too: with the block, it ends the thinking-off generation prompt, so a reply's targets are
    exactly what the model writes after that prompt (measured, cpu profile: supervising these
    two easy tokens per reply took SFT's skill exact match from 32.2% to 25.5%).
    """
    ids: list[int] = []
    labels: list[int] = []
    after_empty_think, prompt_end = False, None
    for text, special, supervised in segments:
        piece = [marker_id(tokenizer, text, template)] if special else next(encoded)
        ids += piece
        if not supervised:
            labels += [IGNORE_INDEX] * len(piece)
        elif after_empty_think and text.startswith(PROMPT_END):
            prompt_end = prompt_end or tokenizer.encode(PROMPT_END)  # once per conversation
            lead = len(prompt_end) if piece[:len(prompt_end)] == prompt_end else 0
            labels += [IGNORE_INDEX] * lead + piece[lead:]
        else:
            labels += piece
        after_empty_think = special and text == THINK_END and not supervised
    return ids[:seq_len], labels[:seq_len]


#: what the thinking-off generation prompt holds after its empty block's ``</think>``
PROMPT_END = "\n\n"


_longest_token: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def text_budget(tokenizer: BPETokenizer, seq_len: int) -> int:
    """The characters of one text that can reach the first ``seq_len`` tokens: ``seq_len + 1``
    times the longest token's bytes (a character is at least one byte), plus that again. A
    longer text is cut to this before it is tokenised, so a 100 MB message costs what a short
    one does (issue 49). The tokens kept are the same unless one word (a run the pre-tokeniser
    does not split, such as unbroken Chinese text) crosses the cut, where BPE may merge its
    last pieces differently; those lie past the window in all but contrived cases.

    >>> from minimind_lib.tokenizer.bpe import load_tokenizer
    >>> text_budget(load_tokenizer(), 10) > 10
    True
    """
    if tokenizer not in _longest_token:
        special = set(tokenizer.special_tokens)
        _longest_token[tokenizer] = max(len(tokenizer.token_bytes(i)) for i in range(len(tokenizer))
                                        if tokenizer.id_to_token(i) not in special)
    return (seq_len + 2) * _longest_token[tokenizer]


def sft_example(tokenizer: BPETokenizer, messages: Sequence[dict], seq_len: int,
                template: str | None = None) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of one conversation, cut to ``seq_len`` tokens.

    ``input_ids`` is the ChatML rendering; ``labels`` equals it on the assistant's content
    tokens and the ``<|im_end|>`` closing each assistant turn (every turn of a multi-turn
    chat), and is ``IGNORE_INDEX`` (-100) everywhere else. Labels are aligned with the inputs
    (the model shifts them). Truncation can leave no supervised token: ``SFTDataset`` skips
    and counts such examples.

    >>> from minimind_lib.tokenizer.bpe import load_tokenizer
    >>> tokenizer = load_tokenizer()
    >>> ids, labels = sft_example(tokenizer, [{"role": "user", "content": "Hi"},
    ...                                 {"role": "assistant", "content": "Hello!"}], 64)
    >>> tokenizer.decode([t for t in labels if t != IGNORE_INDEX])
    'Hello!<|im_end|>'
    >>> sum(t != IGNORE_INDEX for t in sft_example(tokenizer, [{"role": "user", "content": "Hi"},
    ...                                          {"role": "assistant", "content": "Hello!"}], 8)[1])
    0
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    template = template or template_of(tokenizer)
    segments = sft_segments(messages, template)
    limit = text_budget(tokenizer, seq_len)
    encoded = (tokenizer.encode(t[:limit], allowed_special=set()) for t, special, _ in segments
               if not special)
    return _assemble(tokenizer, segments, encoded, seq_len, template)


class SFTDataset(Dataset):
    """Conversations as ``sft_example``s, for ``train(..., collate_fn=dataset.collate)``.

    ``answer_only=False`` puts the loss on every token instead (the notebook's ablation);
    the examples kept are the same either way. ``template`` is the chat format
    (``sft_segments``; None: the tokenizer's, ``template_of``); MiniMind's tool-use and
    thinking records need ``"minimind-3"`` and a tokenizer that reserves its markers; under
    MiniMind2's they are skipped and counted in ``unrenderable``. Examples whose truncation to
    ``seq_len`` leaves no supervised token are dropped and counted in ``skipped``. Tokenisation runs
    once, in batches through ``BPETokenizer.encode_batch`` (the fast path, identical ids); ids
    live in one flat array.

    >>> from minimind_lib.tokenizer.bpe import load_tokenizer
    >>> chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    >>> ds = SFTDataset([{"conversations": chat}] * 2, load_tokenizer(), seq_len=64,
    ...                 progress=False)
    >>> batch = ds.collate([ds[0], ds[1]])
    >>> len(ds), ds.skipped, batch["input_ids"].shape == batch["labels"].shape
    (2, 0, True)
    >>> ds.lengths.tolist(), ds.num_targets   # per chat: "Hello!" (4 tokens) + <|im_end|>
    ([25, 25], 10)
    """

    def __init__(self, records: Iterable[dict], tokenizer: BPETokenizer, seq_len: int, *,
                 answer_only: bool = True, max_examples: int | None = None,
                 chunk_size: int = 2048, progress: bool = True, template: str | None = None):
        if seq_len <= 0:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        self.seq_len, self.answer_only = seq_len, answer_only
        template = template or template_of(tokenizer)
        self.pad_id = tokenizer.token_to_id(END_OF_TEXT)  # pads are never a target
        # 2 bytes per id when the vocabulary fits (MiniMind's 6,400 does): half of int32
        id_dtype = np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max + 1 else np.int32
        self.skipped = 0
        self.unrenderable = 0  # records the template cannot express (tools under MiniMind2's)
        ids_parts: list[np.ndarray] = []
        mask_parts: list[np.ndarray] = []
        lengths: list[int] = []
        bar = tqdm(total=max_examples, unit="chat", desc="tokenise SFT", disable=not progress)
        records = iter(itertools.islice(records, max_examples))
        while chunk := list(itertools.islice(records, chunk_size)):
            all_segments = []
            for record in chunk:
                try:
                    all_segments.append(sft_segments(record["conversations"], template))
                except TemplateMismatch:
                    self.unrenderable += 1
            limit = text_budget(tokenizer, seq_len)  # cut before tokenising: a huge message
            texts = [t[:limit] for segs in all_segments for t, special, _ in segs if not special]
            encoded = iter(tokenizer.encode_batch(texts, allowed_special=set()))
            for segments in all_segments:
                ids, labels = _assemble(tokenizer, segments, encoded, seq_len, template)
                supervised = np.asarray(labels) != IGNORE_INDEX  # (L,)
                if not supervised.any():
                    self.skipped += 1
                    continue
                ids_parts.append(np.asarray(ids, dtype=id_dtype))
                mask_parts.append(supervised)
                lengths.append(len(ids))
            bar.update(len(chunk))
        bar.close()
        if not lengths:
            raise ValueError(f"no SFT example has a supervised token within seq_len "
                             f"{seq_len} ({self.skipped} skipped, {self.unrenderable} not "
                             f"expressible in the {template} template)")
        self._ids = np.concatenate(ids_parts)  # (total tokens,)
        self._supervised = np.concatenate(mask_parts)  # (total tokens,)
        self._offsets = np.concatenate([[0], np.cumsum(lengths)])  # (N + 1,)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """Tokens of every example, (N,)."""
        return np.diff(self._offsets)

    @property
    def num_targets(self) -> int:
        """Tokens that get a loss, over all examples (every token when not ``answer_only``)."""
        return int(self._supervised.sum()) if self.answer_only else len(self._ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        start, end = self._offsets[i], self._offsets[i + 1]
        ids = torch.from_numpy(self._ids[start:end].astype(np.int64))  # (L,)
        if not self.answer_only:
            return {"input_ids": ids, "labels": ids.clone()}
        keep = torch.from_numpy(self._supervised[start:end])  # (L,)
        return {"input_ids": ids, "labels": ids.masked_fill(~keep, IGNORE_INDEX)}

    def collate(self, batch: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Right-pad to the longest example of the batch: pad id in the inputs, -100 in the
        labels (causal attention keeps real tokens from seeing the pads on their right)."""
        return pad_sft_batch(batch, self.pad_id)


def pad_sft_batch(batch: Sequence[dict[str, torch.Tensor]], pad_id: int) -> dict[str, torch.Tensor]:
    """Stack ``{"input_ids", "labels"}`` examples of different lengths into (B, T_max) tensors.

    >>> b = pad_sft_batch([{"input_ids": torch.tensor([5, 6, 7]),
    ...                     "labels": torch.tensor([-100, 6, 7])},
    ...                    {"input_ids": torch.tensor([5]), "labels": torch.tensor([-100])}],
    ...                   pad_id=0)
    >>> b["input_ids"].tolist(), b["labels"].tolist()
    ([[5, 6, 7], [5, 0, 0]], [[-100, 6, 7], [-100, -100, -100]])
    """
    width = max(len(x["input_ids"]) for x in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)  # (B, T)
    labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)  # (B, T)
    for row, x in enumerate(batch):
        input_ids[row, :len(x["input_ids"])] = x["input_ids"]
        labels[row, :len(x["labels"])] = x["labels"]
    return {"input_ids": input_ids, "labels": labels}
