"""Data (notebooks 00, 04-06): MiniMind's jsonl formats read and checked, the pretraining
token stream, the SFT conversations and the task families the course generates.

* ``readers``: ``read_jsonl`` (a bad line is an error naming file, line and field), the
  bundled files and MiniMind's (``dataset_files``);
* ``pretraining``: the corpus tokenized once into memory-mapped ``train.bin`` / ``val.bin``;
* ``conversations``: ``sft_example`` (the answer-only labels), ``SFTDataset``, padding;
* ``hanzi_codes``: the LoRA stage's new task (codes read in Chinese numerals and back).

>>> from minimind_lib.data import sft_example
>>> from minimind_lib.tokenizer import load_tokenizer
>>> ids, labels = sft_example(load_tokenizer(), [{"role": "user", "content": "hi"},
...                                             {"role": "assistant", "content": "hello"}], 64)
>>> len(ids) == len(labels)
True
"""

from minimind_lib.data.conversations import sft_example
from minimind_lib.data.readers import DataFormatError, read_jsonl

__all__ = ["DataFormatError", "read_jsonl", "sft_example"]
