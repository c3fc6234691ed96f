"""Speed and exactness of minimind_lib.tokenizer, side by side with HF tokenizers in one run.

1. merge equality: ``train_bpe`` (pure Python) vs ``tokenizers.BpeTrainer`` on the bundled
   pretraining sample (all of it, its Chinese and English halves, a slice) at several
   vocab sizes: identical tokenizer.json or not;
2. training time for vocab 6400 on the whole sample: from-scratch / HF (goal <= 1.5x;
   ``train_bpe`` runs ``learn_merges_fast``; the readable ``learn_merges`` is timed too);
3. encoding throughput on the whole sample: ours (cold and warm word cache) vs HF's
   ``encode`` per document and ``encode_batch`` (Rust, all cores), with identical ids.

Runs alternate between the two sides and report the median, so a noisy shared CPU hits
both alike.  Usage: ``python benchmarks/tokenizer_bench.py [--reps N]`` (about 75 s of
CPU time; longer in wall time on a busy machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

from tokenizers import Tokenizer

from minimind_lib.data import read_jsonl
from minimind_lib.tokenizer import SPECIAL_TOKENS, BPETokenizer, train_bpe, train_bpe_fast
from minimind_lib.tokenizer.bpe import COURSE_CORPUS, COURSE_VOCAB_SIZE, bytes_to_unicode
from minimind_lib.tokenizer.training import count_words, learn_merges


def alternate(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median seconds per call of each function, calls interleaved."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def is_chinese(text: str) -> bool:
    cjk = sum("\u4e00" <= c <= "\u9fff" for c in text)
    return cjk > 0.3 * len(text)


def merge_equality(texts: list[str]) -> None:
    zh = [t for t in texts if is_chinese(t)]
    en = [t for t in texts if not is_chinese(t)]
    runs = [("whole sample", texts, 1000, 0), ("whole sample", texts, 3000, 2),
            ("whole sample", texts, COURSE_VOCAB_SIZE, 0),
            ("Chinese docs", zh, COURSE_VOCAB_SIZE, 0),
            ("English docs", en, COURSE_VOCAB_SIZE, 0), ("first 1000 docs", texts[:1000], 2000, 3)]
    print("1. merge equality, train_bpe vs tokenizers.BpeTrainer (whole tokenizer.json):")
    for name, docs, vocab_size, min_frequency in runs:
        ours = train_bpe(docs, vocab_size, min_frequency=min_frequency, show_progress=False)
        theirs = train_bpe_fast(docs, vocab_size, min_frequency=min_frequency)
        print(f"  {name:16s} {len(docs):5d} docs  vocab {vocab_size:5d}  min_freq {min_frequency}"
              f"  -> {len(ours)} tokens, {len(ours.merges)} merges, identical: "
              f"{ours.to_dict() == theirs.to_dict()}")


def learn_readable(texts: list[str]) -> None:
    """``train_bpe``'s merges from the readable ``learn_merges`` (no tokenizer built)."""
    id_to_token = SPECIAL_TOKENS + sorted(bytes_to_unicode().values())
    learn_merges(count_words(texts), id_to_token, COURSE_VOCAB_SIZE, show_progress=False)


def training_time(texts: list[str], reps: int) -> None:
    t = alternate({"ours": lambda: train_bpe(texts, COURSE_VOCAB_SIZE, show_progress=False),
                   "hf": lambda: train_bpe_fast(texts, COURSE_VOCAB_SIZE),
                   "readable": lambda: learn_readable(texts)}, reps)
    print(f"2. training, vocab {COURSE_VOCAB_SIZE}, whole sample (median of {reps}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs):")
    print(f"  from scratch {t['ours']:6.2f} s   HF {t['hf']:6.2f} s   "
          f"from-scratch / HF = {t['ours'] / t['hf']:.2f}x  (goal <= 1.5x)")
    print(f"  readable learn_merges {t['readable']:6.2f} s = {t['readable'] / t['hf']:.2f}x HF")


def encoding_speed(texts: list[str], path: str, reps: int) -> None:
    hf = Tokenizer.from_file(path)
    warm = BPETokenizer.from_file(path)
    warm_ids = [warm.encode(t) for t in texts]
    same = warm_ids == [e.ids for e in hf.encode_batch(texts)]
    n_tokens, n_chars = sum(map(len, warm_ids)), sum(map(len, texts))

    def cold() -> None:
        fresh = BPETokenizer.from_file(path)  # empty word cache (loading is ~0.05 s of it)
        for text in texts:
            fresh.encode(text)

    t = alternate({
        "ours_cold": cold,
        "ours_warm": lambda: [warm.encode(text) for text in texts],
        "hf_encode": lambda: [hf.encode(text) for text in texts],
        "hf_batch": lambda: hf.encode_batch(texts),
    }, reps)
    print(f"3. encoding the whole sample ({n_chars:,} chars -> {n_tokens:,} tokens, "
          f"median of {reps}); identical ids: {same}")
    for name, label in [("ours_cold", "ours, cold word cache"), ("ours_warm", "ours, warm cache"),
                        ("hf_encode", "HF encode per doc"), ("hf_batch", "HF encode_batch")]:
        print(f"  {label:22s} {t[name]:6.2f} s  {n_tokens / t[name] / 1e3:8.0f}k tokens/s")
    print(f"  throughput ours(cold) / HF encode = {t['hf_encode'] / t['ours_cold']:.2f}x   "
          f"ours(warm) / HF encode = {t['hf_encode'] / t['ours_warm']:.2f}x   "
          f"ours(cold) / HF encode_batch = {t['hf_batch'] / t['ours_cold']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions per side")
    args = parser.parse_args()
    texts = [r["text"] for r in read_jsonl(COURSE_CORPUS, "pretrain")]
    print(f"{COURSE_CORPUS.name}: {len(texts)} docs, {sum(map(len, texts)):,} chars; "
          f"{os.cpu_count()} CPUs")
    merge_equality(texts)
    training_time(texts, args.reps)
    with tempfile.TemporaryDirectory() as tmp:
        path = train_bpe_fast(texts, COURSE_VOCAB_SIZE).save(os.path.join(tmp, "tokenizer.json"))
        encoding_speed(texts, str(path), args.reps)


if __name__ == "__main__":
    main()
