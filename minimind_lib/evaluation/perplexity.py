"""Held-out text scores that need no generation (notebooks 05 and 07):

* **perplexity**: ``exp(-(1/N) sum_t log p(x_t | x_<t))`` over the ``N`` predicted tokens of one
  token stream (documents joined by ``<|endoftext|>``, as in pretraining);
* **bits per byte**: the summed NLL divided by ``ln 2`` times the UTF-8 bytes the predicted
  tokens spell. Perplexity is per *token*, so it only compares models that share a tokenizer;
  bits per byte compares any two (ours, MiniMind2-Small, a Hugging Face model).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from minimind_lib.data.readers import read_jsonl
from minimind_lib.evaluation.multiple_choice import continuation_logprobs
from minimind_lib.model.decoder import IGNORE_INDEX
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.tokenizer.special import END_OF_TEXT

# --- perplexity --------------------------------------------------------------------------


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.inference_mode()
def perplexity(model: nn.Module, tokenizer: BPETokenizer,
               texts_or_path: Sequence[str] | str | Path, seq_len: int, *, batch_size: int = 8,
               max_tokens: int | None = None, progress: bool = False,
               per_text: bool = False) -> float:
    """Perplexity of ``model`` on held-out text: ``exp`` of the mean next-token NLL.

    ``texts_or_path``: a list of texts or a pretraining-format jsonl file. Texts are encoded,
    each followed by ``<|endoftext|>``, into one stream (cut to ``max_tokens``), read in
    windows of ``seq_len + 1`` tokens that overlap by one, so every token after the first is
    predicted exactly once, with up to ``seq_len`` tokens of context (the same windows the
    pretraining data uses).

    ``per_text=True`` scores each text on its own instead, every token of it predicted after an
    ``<|endoftext|>`` (``text_logprobs``: lm-evaluation-harness's ``loglikelihood_rolling``,
    which its perplexity tasks such as wikitext use); ``max_tokens`` does not apply.

    >>> from minimind_lib.model.config import MiniMindConfig
    >>> from minimind_lib.model.decoder import MiniMindForCausalLM
    >>> from minimind_lib.tokenizer.bpe import load_tokenizer
    >>> _ = torch.manual_seed(0)
    >>> tiny = MiniMindForCausalLM(MiniMindConfig(hidden_size=16, num_hidden_layers=1,
    ...                            num_attention_heads=2, num_key_value_heads=1))
    >>> ppl = perplexity(tiny, load_tokenizer(), ["a held-out sentence."] * 4, seq_len=8)
    >>> 5000 < ppl < 8000   # untrained: about the vocabulary size, 6400
    True
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    if per_text:
        lls, count = _rolling(model, tokenizer, _texts(texts_or_path), seq_len, batch_size)
        if count == 0:
            raise ValueError("perplexity needs at least 1 token of text")
        return math.exp(-sum(lls) / count)
    eos = tokenizer.token_to_id(END_OF_TEXT)
    encoded = tokenizer.encode_batch(_texts(texts_or_path), allowed_special=set())
    stream = [i for ids in encoded for i in ids + [eos]][:max_tokens]
    if len(stream) < 2:
        raise ValueError("perplexity needs at least 2 tokens of text")
    tokens = torch.tensor(stream)  # (N,)
    starts = list(range(0, len(stream) - 1, seq_len))
    device, was_training = _device(model), model.training
    model.eval()
    total_nll, count = 0.0, 0
    batches = [starts[i:i + batch_size] for i in range(0, len(starts), batch_size)]
    for batch in tqdm(batches, desc="perplexity", disable=not progress):
        # subtle: only the last window can be short; give it a batch of its own
        groups = [[s for s in batch if s + seq_len + 1 <= len(stream)],
                  [s for s in batch if s + seq_len + 1 > len(stream)]]
        for group in filter(None, groups):
            ids = torch.stack([tokens[s:s + seq_len + 1] for s in group]).to(device)  # (B, T+1)
            logits = model(ids[:, :-1]).logits.float()  # (B, T, V)
            total_nll += F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(),
                                         reduction="sum").item()
            count += ids[:, 1:].numel()
    model.train(was_training)
    return math.exp(total_nll / count)


def rolling_windows(ids: Sequence[int], prefix: int,
                    seq_len: int) -> list[tuple[list[int], list[int]]]:
    """(context, predicted) id windows that predict every token of ``ids`` exactly once, each
    window at most ``seq_len`` inputs: the first after ``prefix``, the next ones ``seq_len``
    tokens at a time, the last with a full ``seq_len`` of context before its few predicted
    tokens (lm-eval's ``get_rolling_token_windows`` with ``context_len=1`` and
    ``make_disjoint_window``).

    >>> rolling_windows([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], prefix=-1, seq_len=4)
    [([-1], [0, 1, 2, 3]), ([3], [4, 5, 6, 7]), ([5, 6, 7], [8, 9])]
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    ids = list(ids)
    windows = [([prefix], ids[:seq_len])] if ids else []
    for start in range(seq_len, len(ids), seq_len):
        end = min(start + seq_len, len(ids))
        windows.append((ids[max(end - seq_len - 1, 0):start], ids[start:end]))
    return windows


def text_logprobs(model: nn.Module, tokenizer: BPETokenizer, texts: Sequence[str],
                  seq_len: int | None = None, *, batch_size: int = 8) -> list[float]:
    """The log-likelihood of each text on its own: every token predicted once, the first after
    ``<|endoftext|>``, in ``rolling_windows`` of ``seq_len`` (default: the model's context);
    special-token strings in a text are text. lm-eval's ``loglikelihood_rolling``."""
    return _rolling(model, tokenizer, texts, seq_len, batch_size)[0]


def _rolling(model: nn.Module, tokenizer: BPETokenizer, texts: Sequence[str],
             seq_len: int | None, batch_size: int) -> tuple[list[float], int]:
    """(``text_logprobs``, the number of tokens they predict)."""
    seq_len = seq_len or model.config.max_position_embeddings
    eos = tokenizer.token_to_id(END_OF_TEXT)
    encoded = tokenizer.encode_batch(list(texts), allowed_special=set())
    windows = [rolling_windows(ids, eos, seq_len) for ids in encoded]
    scores = iter(ll for ll, _ in continuation_logprobs(model, [w for ws in windows for w in ws],
                                                        batch_size))
    return [sum(next(scores) for _ in ws) for ws in windows], sum(map(len, encoded))


def _texts(texts_or_path: Sequence[str] | str | Path) -> list[str]:
    """A list of texts as given, or the ``"text"`` fields of a pretraining-format jsonl file."""
    if isinstance(texts_or_path, str | Path):
        return [r["text"] for r in read_jsonl(texts_or_path, "pretrain")]
    return list(texts_or_path)


# --- bits per byte -----------------------------------------------------------------------


@torch.inference_mode()
def bits_per_byte(model: nn.Module, tokenizer: BPETokenizer,
                  texts_or_path: Sequence[str] | str | Path, *, context: int | None = None,
                  max_tokens: int | None = None, batch_size: int = 8,
                  progress: bool = False) -> float:
    """Bits per UTF-8 byte of held-out text: how many bits the model needs, on average, to
    encode each byte of it (lower is better; a tokenizer-independent form of perplexity).

    Each text is encoded without special tokens and cut to its first ``context`` tokens
    (default: the model's ``max_position_embeddings``); tokens 2..n of it are predicted
    from the tokens before them. With ``B`` the UTF-8 bytes those predicted tokens spell::

        bits/byte = sum_texts sum_{t=2..n} -ln p(x_t | x_<t)  /  (ln 2 * sum_texts B)

    (the measure of Gao et al. 2020, "The Pile"; over the same ``N`` predicted tokens,
    ``perplexity = 2 ** (bits/byte * B / N)``). ``max_tokens`` keeps only the first texts whose
    predicted tokens fit in that budget (at least one text).

    ``model``: ours or a ``transformers`` causal LM (anything whose output has ``.logits``);
    ``tokenizer``: anything with ``encode_batch(texts, allowed_special=set())`` and
    ``token_bytes(id)``: a ``BPETokenizer``, or ``hf.ByteLevelTokenizer`` around a Hugging Face
    tokenizer.

    >>> from minimind_lib.model.config import MiniMindConfig
    >>> from minimind_lib.model.decoder import MiniMindForCausalLM
    >>> from minimind_lib.tokenizer.bpe import load_tokenizer
    >>> _ = torch.manual_seed(0)
    >>> tiny = MiniMindForCausalLM(MiniMindConfig(hidden_size=16, num_hidden_layers=1,
    ...                            num_attention_heads=2, num_key_value_heads=1))
    >>> bpb = bits_per_byte(tiny, load_tokenizer(), ["a held-out sentence."] * 4)
    >>> 3 < bpb < 5   # untrained: log2(6400) = 12.6 bits per token, ~3 bytes a token
    True
    """
    context = context or model.config.max_position_embeddings
    if context < 2:
        raise ValueError(f"context must be at least 2 tokens, got {context}")
    encoded = [ids[:context] for ids in tokenizer.encode_batch(_texts(texts_or_path),
                                                               allowed_special=set())]
    encoded = _within_budget([ids for ids in encoded if len(ids) >= 2], max_tokens)
    if not encoded:
        raise ValueError("bits_per_byte needs a text of at least 2 tokens")
    n_bytes = sum(len(tokenizer.token_bytes(t)) for ids in encoded for t in ids[1:])
    # similar lengths share a batch (less padding); right padding never changes the logits of
    # the real tokens before it (causal attention), and its targets are ignored
    encoded.sort(key=len)
    device, was_training = _device(model), model.training
    model.eval()
    total_nll = 0.0
    batches = [encoded[i:i + batch_size] for i in range(0, len(encoded), batch_size)]
    for batch in tqdm(batches, desc="bits per byte", disable=not progress):
        width = max(len(ids) for ids in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)  # (B, T)
        targets = torch.full((len(batch), width - 1), IGNORE_INDEX)  # (B, T-1)
        for row, text_ids in enumerate(batch):
            ids[row, :len(text_ids)] = torch.tensor(text_ids)
            targets[row, :len(text_ids) - 1] = torch.tensor(text_ids[1:])
        logits = model(ids[:, :-1].to(device)).logits.float()  # (B, T-1, V)
        total_nll += F.cross_entropy(logits.flatten(0, 1), targets.flatten().to(device),
                                     ignore_index=IGNORE_INDEX, reduction="sum").item()
    model.train(was_training)
    return total_nll / (math.log(2) * n_bytes)


def _within_budget(encoded: list[list[int]], max_tokens: int | None) -> list[list[int]]:
    """The first texts whose predicted tokens (all but each text's first) fit ``max_tokens``.

    >>> _within_budget([[1, 2, 3], [4, 5], [6, 7]], max_tokens=3)
    [[1, 2, 3], [4, 5]]
    """
    if max_tokens is None:
        return encoded
    kept, used = [], 0
    for ids in encoded:
        if kept and used + len(ids) - 1 > max_tokens:
            break
        kept.append(ids)
        used += len(ids) - 1
    return kept
