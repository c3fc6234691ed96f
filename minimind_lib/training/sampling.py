"""The order of the training data (notebook 04): which examples each optimizer step of each
rank reads, a seeded function of the epoch so a resumed run reads exactly what the
interrupted one would have (``StepBatchSampler``), optionally in steps of alike lengths
(``group_by_length``: SFT's tool conversations pad only one another).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

#: ``group_by_length``: optimizer steps whose examples are sorted by length together
GROUP_STEPS = 32


class StepBatchSampler:
    """Micro-batch index lists for optimizer steps ``start_step .. max_steps - 1`` of one rank.

    >>> s = StepBatchSampler(8, batch_size=2, accumulation_steps=2, world_size=1, rank=0,
    ...                      seed=0, start_step=0, max_steps=2)
    >>> batches = list(s)
    >>> len(batches), sorted(sum(batches[:2], []) + sum(batches[2:], [])) == list(range(8))
    (4, True)
    """

    def __init__(self, num_examples: int, *, batch_size: int, accumulation_steps: int,
                 world_size: int, rank: int, seed: int, start_step: int, max_steps: int,
                 lengths: Sequence[int] | None = None):
        self.global_batch = batch_size * accumulation_steps * world_size
        self.steps_per_epoch = num_examples // self.global_batch
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"the dataset has {num_examples} examples, fewer than one optimizer step needs "
                f"(batch_size {batch_size} x accumulation_steps {accumulation_steps} x "
                f"world_size {world_size} = {self.global_batch}); lower batch_size or add data")
        self.num_examples, self.batch_size = num_examples, batch_size
        self.accumulation_steps, self.rank, self.seed = accumulation_steps, rank, seed
        self.start_step, self.max_steps = start_step, max_steps
        if lengths is not None and len(lengths) != num_examples:
            raise ValueError(f"lengths has {len(lengths)} entries for {num_examples} examples")
        self.lengths = None if lengths is None else torch.as_tensor(lengths)

    def permutation(self, epoch: int) -> torch.Tensor:
        """Epoch ``epoch``'s order of the examples: a seeded shuffle, length-grouped when the
        sampler was given ``lengths`` (``group_by_length``)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        perm = torch.randperm(self.num_examples, generator=g)
        return perm if self.lengths is None else self._grouped(perm, g)

    def _grouped(self, perm: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """``perm`` cut into windows of ``GROUP_STEPS`` optimizer steps; in each, the examples
        sorted by length into steps, and the steps shuffled: a step's sequences are alike in
        length, so padding to the longest wastes little, while a window still mixes every kind
        (the order stays a function of the epoch: resumable)."""
        window = self.global_batch * GROUP_STEPS
        out = []
        for start in range(0, len(perm), window):
            chunk = perm[start:start + window]
            chunk = chunk[torch.argsort(self.lengths[chunk], stable=True)]
            steps = len(chunk) // self.global_batch
            if steps == 0:
                out.append(chunk)
                continue
            blocks = chunk[:steps * self.global_batch].view(steps, self.global_batch)
            out += [blocks[torch.randperm(steps, generator=g)].flatten(),
                    chunk[steps * self.global_batch:]]
        return torch.cat(out)

    def __iter__(self) -> Iterator[list[int]]:
        epoch, perm = -1, None
        for step in range(self.start_step, self.max_steps):
            e, k = divmod(step, self.steps_per_epoch)
            if e != epoch:
                epoch, perm = e, self.permutation(e)
            for m in range(self.accumulation_steps):  # rank r owns micro-batches r*A .. r*A+A-1
                start = (k * self.global_batch
                         + (self.rank * self.accumulation_steps + m) * self.batch_size)
                yield perm[start:start + self.batch_size].tolist()

    def __len__(self) -> int:
        return max(0, self.max_steps - self.start_step) * self.accumulation_steps
