"""What ``sft.group_by_length`` saves: the tokens a profile's SFT run computes (rows padded to
the longest of each micro-batch) with the plain shuffled order and with length-grouped steps,
side by side for the same examples and steps, and their ratio. Padding costs as much compute
as a real token, and since the tool-use conversations (data/sft_tools.jsonl: 440-750 tokens)
joined the SFT data, one of them pads a whole batch of short answers.

    python benchmarks/sft_padding.py [--profile cpu]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from minimind_lib.course.profiles import get_profile
from minimind_lib.data.conversations import SFTDataset
from minimind_lib.data.readers import dataset_files
from minimind_lib.tokenizer import load_tokenizer
from minimind_lib.training.sampling import StepBatchSampler
from minimind_lib.training.sft import sft_records


def computed_tokens(lengths: np.ndarray, settings, seed: int, grouped: bool) -> tuple[int, int]:
    """(tokens computed, padding included; real tokens) over the run's micro-batches."""
    sampler = StepBatchSampler(len(lengths), batch_size=settings.batch_size,
                               accumulation_steps=settings.accumulation_steps, world_size=1,
                               rank=0, seed=seed, start_step=0, max_steps=settings.max_steps,
                               lengths=lengths if grouped else None)
    padded = real = 0
    for batch in sampler:
        rows = lengths[batch]
        padded += int(rows.max()) * len(rows)
        real += int(rows.sum())
    return padded, real


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="cpu")
    args = parser.parse_args()
    profile = get_profile(args.profile)
    settings = profile.sft
    start = time.perf_counter()
    data = SFTDataset(sft_records(dataset_files("sft", profile.data_dir)), load_tokenizer(),
                      settings.seq_len, max_examples=settings.max_examples, progress=False)
    lengths = data.lengths
    if settings.replay:  # the replayed text windows: ~as many as the stage adds, all alike
        windows = round(settings.replay / (1 - settings.replay) * data.num_targets
                        / settings.window)
        lengths = np.concatenate([lengths, np.full(windows, settings.window)])
    print(f"profile {profile.name}: {len(data):,} conversations (+ {len(lengths) - len(data):,} "
          f"replay windows), {settings.max_steps:,} steps x {settings.batch_size}, "
          f"tokenised in {time.perf_counter() - start:.0f} s")
    rows = {}
    for grouped in (False, True):
        rows[grouped] = computed_tokens(lengths, settings, profile.seed, grouped)
        padded, real = rows[grouped]
        print(f"{'length-grouped' if grouped else 'shuffled      '}: {padded / 1e6:6.2f}M tokens "
              f"computed for {real / 1e6:.2f}M real ({padded / real:.2f}x)")
    print(f"group_by_length computes {rows[False][0] / rows[True][0]:.2f}x fewer tokens")


if __name__ == "__main__":
    main()
