"""Training (notebooks 04-06, 09, 10): the one engine and the losses that plug into it.

* ``settings``: ``TrainSettings`` (hyper-parameters, budget), ``RunOptions``, ``TrainConfig``;
* ``loop``: ``train`` = ``start_run`` + ``train_step`` + logging, checkpoints, bit-exact resume;
* ``logprobs``: per-token and per-sequence log-probabilities of answers;
* ``sft``, ``dpo``, ``grpo``, ``ppo``, ``lora``, ``distill``: each a ``loss_fn`` (or a step) for
  ``train``;
* ``rollout``: the model's own answers to checkable questions, graded;
* ``memory``: what training holds in memory, counted and measured.

>>> from minimind_lib.training import TrainConfig
>>> config = TrainConfig(max_steps=10, warmup_steps=2, learning_rate=1e-3)
>>> [config.lr(step) for step in (0, 1)]
[0.0005, 0.001]
"""

from minimind_lib.training.loop import train
from minimind_lib.training.settings import TrainConfig, TrainSettings

__all__ = ["TrainConfig", "TrainSettings", "train"]
