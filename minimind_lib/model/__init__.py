"""The model (notebooks 02, 03, 07, 11, 12): MiniMind's Llama-style decoder, piece by piece.

* ``config``: ``MiniMindConfig`` (MiniMind's field names) and its checks;
* ``positions``: RoPE (with PI, NTK and YaRN scaling) and ALiBi;
* ``attention``: causal multi-head attention with GQA and a KV cache;
* ``layers``: RMSNorm and the SwiGLU feed-forward;
* ``moe``: the mixture-of-experts feed-forward and its load-balancing loss;
* ``decoder``: the block, ``MiniMindForCausalLM``, the loss (``IGNORE_INDEX``), generation;
* ``chunked_loss``: the output head and its cross-entropy chunk by chunk, without the (B, T, V)
  logits (what ``model(ids, labels=labels)`` and the training losses run);
* ``kv_cache``: the static KV cache (preallocated, written in place, rows of their own lengths);
* ``generation``: batched decoding of prompts of different lengths (left padding, as
  transformers), finished rows leaving the batch;
* ``sampling``: temperature, top-k and top-p;
* ``checkpoint``: model folders and training checkpoints; ``quantize``: int8 weight-only layers;
* ``hf``: to and from ``transformers`` (``to_hf``, ``from_hf``, ``load_pretrained``): Llama for
  MiniMind2, Qwen3 for MiniMind-3;
* ``presets``: MiniMind's released sizes (``preset("minimind-3")``).

>>> from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
>>> MiniMindForCausalLM(MiniMindConfig(hidden_size=64, num_hidden_layers=2)).num_parameters()
504128
"""

from minimind_lib.model.config import MiniMindConfig
from minimind_lib.model.decoder import IGNORE_INDEX, MiniMindForCausalLM
from minimind_lib.model.positions import alibi_slopes
from minimind_lib.model.presets import PRESETS, preset

__all__ = ["IGNORE_INDEX", "PRESETS", "MiniMindConfig", "MiniMindForCausalLM", "alibi_slopes",
           "preset"]
