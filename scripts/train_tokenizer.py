#!/usr/bin/env python
"""Rebuild the course tokenizer, data/tokenizer/, with the from-scratch trainer.

    python scripts/train_tokenizer.py            # data/pretrain_sample.jsonl -> data/tokenizer/

``minimind_lib.tokenizer.training.train_bpe`` (pure Python) learns 6,400 tokens from the bundled
pretraining sample (ids 0-8 reserved: ChatML's three markers and MiniMind-3's six tool and
thinking markers); HF ``tokenizers.BpeTrainer`` is then trained on the same texts and
the two tokenizer.json files must be identical (use ``--no-check`` to skip that).
The folder gets tokenizer.json, tokenizer_config.json (ChatML chat template) and
special_tokens_map.json, which ``transformers.AutoTokenizer`` loads.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from minimind_lib.data import read_jsonl
from minimind_lib.tokenizer import train_bpe, train_bpe_fast
from minimind_lib.tokenizer.bpe import COURSE_CORPUS, COURSE_TOKENIZER, COURSE_VOCAB_SIZE
from minimind_lib.tokenizer.special import COURSE_SPECIAL_TOKENS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--input", type=Path, default=COURSE_CORPUS, help="pretraining jsonl")
    parser.add_argument("--out", type=Path, default=COURSE_TOKENIZER.parent, help="output folder")
    parser.add_argument("--vocab-size", type=int, default=COURSE_VOCAB_SIZE)
    parser.add_argument("--no-check", action="store_true", help="skip the comparison with HF")
    args = parser.parse_args()

    texts = [record["text"] for record in read_jsonl(args.input, "pretrain")]
    print(f"{args.input}: {len(texts)} documents, {sum(map(len, texts)):,} characters")
    start = time.perf_counter()
    tok = train_bpe(texts, args.vocab_size, COURSE_SPECIAL_TOKENS)
    print(f"train_bpe: {len(tok)} tokens, {len(tok.merges)} merges in "
          f"{time.perf_counter() - start:.1f} s")
    if not args.no_check:
        fast = train_bpe_fast(texts, args.vocab_size, COURSE_SPECIAL_TOKENS)
        same = tok.to_dict() == fast.to_dict()
        print(f"identical to tokenizers.BpeTrainer (vocab, merges, whole tokenizer.json): {same}")
        if not same:
            raise SystemExit("the from-scratch trainer disagrees with HF; not writing")
    tok.save_pretrained(args.out)
    print(f"wrote {', '.join(sorted(p.name for p in args.out.iterdir()))} to {args.out}")


if __name__ == "__main__":
    main()
