"""Tokenizer: byte-level BPE from scratch, identical to HF ``tokenizers`` (notebook 01).

MiniMind's tokenizer is a GPT-2 style byte-level BPE with 6,400 tokens: ids 0, 1, 2
are ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, then the 256 byte symbols,
then one token per learned merge.  The pipeline, one function per step:

1. ``pretokenize``: GPT-2's regex cuts text into words (merges never cross them);
2. ``to_byte_level``: each word's UTF-8 bytes become printable characters
   (``bytes_to_unicode``), so a "word" is a plain string over a 256-symbol alphabet;
3. ``learn_merges``: repeatedly merge the most frequent adjacent pair (Sennrich et
   al. 2016, "Neural Machine Translation of Rare Words with Subword Units", Alg. 1),
   with HF's tie-breaking, so ``train_bpe`` gives the same merges and ids as
   ``tokenizers.BpeTrainer``;
4. ``BPETokenizer.encode``: split out special tokens, pre-tokenize, apply the merges
   in rank order; ``decode`` maps ids back to bytes, then to text.

>>> tok = train_bpe(["low lower lowest"] * 3, vocab_size=262, show_progress=False)
>>> tok.merges
[('l', 'o'), ('lo', 'w'), ('Ġ', 'low')]
>>> tok.encode("lowest<|im_end|>")
[260, 71, 85, 86, 2]
>>> tok.decode(tok.encode("lowest<|im_end|>"))
'lowest<|im_end|>'

The package: ``bpe`` (the byte map, pre-tokenization, ``BPETokenizer``, ``load_tokenizer``),
``training`` (``count_words``, ``merge_pair``, ``learn_merges`` and its faster twin
``learn_merges_fast``, ``train_bpe``, ``train_bpe_fast``), ``special`` (the special tokens and
the chat template, the only home of their strings) and ``chat`` (``apply_chat_template``,
``encode_chat``, MiniMind2's template or MiniMind-3's by name, whose renderer is ``chat3``).
The names the course uses most are importable from here.
"""

from minimind_lib.tokenizer.bpe import BPETokenizer, load_tokenizer
from minimind_lib.tokenizer.chat import apply_chat_template, encode_chat
from minimind_lib.tokenizer.special import END_OF_TEXT, IM_END, IM_START, SPECIAL_TOKENS
from minimind_lib.tokenizer.training import train_bpe, train_bpe_fast

__all__ = ["BPETokenizer", "END_OF_TEXT", "IM_END", "IM_START", "SPECIAL_TOKENS",
           "apply_chat_template", "encode_chat", "load_tokenizer", "train_bpe", "train_bpe_fast"]
