"""Training on several processes (``torchrun``): which rank this process is, and joining the
process group once. The engine (``loop.train``) asks ``init_distributed`` and, with more than
one rank, wraps the model in ``DistributedDataParallel`` and gives each rank its micro-batches.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

# --- distributed -------------------------------------------------------------------------


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed() -> DistInfo:
    """Join the process group ``torchrun`` describes (``WORLD_SIZE`` > 1), once.

    NCCL on CUDA, gloo on CPU. Without torchrun (or with one process) nothing happens.
    """
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(),
                        int(os.environ.get("LOCAL_RANK", 0)))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistInfo()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank)
