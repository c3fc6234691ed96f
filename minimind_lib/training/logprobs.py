"""Log-probabilities of answers under a model (notebooks 06 and 10): per token
(``token_logprobs``) and summed or averaged over the supervised tokens (``sequence_logprobs``,
``answer_logprobs``), as DPO and GRPO need them, and ``frozen_copy`` for a reference model.
"""

from __future__ import annotations

import copy

import torch.nn.functional as F
from torch import Tensor, nn

from minimind_lib.model.chunked_loss import chunked_token_logprobs, head_weight
from minimind_lib.model.decoder import IGNORE_INDEX, MiniMindForCausalLM

# --- 1. log pi(y|x) --------------------------------------------------------------------


def answer_logprobs(logits: Tensor, labels: Tensor, average: bool = False) -> Tensor:
    """Per-row log-probability of the supervised tokens, from logits (B, T, V) and labels (B, T).

    ``labels`` are aligned with the inputs, -100 where a token is not scored (prompt, padding):
    position t's logits score token t+1, as in ``minimind_lib.model.decoder.causal_lm_loss``. The
    sum is ``log pi(y|x) = sum_t log pi(y_t | x, y_<t)``; ``average=True`` divides by the number
    of answer tokens (see ``sequence_logprobs`` for what that changes). Computed in fp32.

    >>> import torch
    >>> logits = torch.zeros(1, 4, 2)                     # uniform over 2 tokens
    >>> labels = torch.tensor([[-100, -100, 1, 0]])       # the last two tokens are the answer
    >>> answer_logprobs(logits, labels)                   # 2 * log(1/2)
    tensor([-1.3863])
    >>> answer_logprobs(logits, labels, average=True)
    tensor([-0.6931])
    """
    if labels.shape != logits.shape[:2]:
        raise ValueError(f"labels shape {tuple(labels.shape)} must equal the logits' "
                         f"(batch, seq_len) {tuple(logits.shape[:2])}")
    counts = _answer_counts(labels)  # (B,)
    per_token = -F.cross_entropy(logits[:, :-1].float().transpose(1, 2), labels[:, 1:],  # (B, T-1)
                                 ignore_index=IGNORE_INDEX, reduction="none")  # 0 where ignored
    total = per_token.sum(dim=1)  # (B,)
    return total / counts if average else total


def _answer_counts(labels: Tensor) -> Tensor:
    """Answer tokens per row (B,) (position t scores token t+1); an error for an empty answer."""
    counts = (labels[:, 1:] != IGNORE_INDEX).sum(dim=1)  # (B,)
    if bool((counts == 0).any()):
        row = int((counts == 0).nonzero()[0, 0])
        raise ValueError(f"row {row} has no supervised token (its labels are all -100 after the "
                         "first position); a pair needs a non-empty answer")
    return counts


def sequence_logprobs(model: nn.Module, input_ids: Tensor, labels: Tensor,
                      average: bool = False) -> Tensor:
    """``log pi(y|x)`` of each row (B,): the model's log-probability of the answer tokens.

    As in the paper (eq. 7), this is the **sum** over the answer tokens: the log-probability
    of the whole answer, so ``log pi/pi_ref`` is the log-ratio of two sequence probabilities
    and the DPO derivation holds exactly. Some implementations **average** over the answer
    tokens instead (``average=True``; e.g. SimPO, and MiniMind's own ``train_dpo.py``). That
    changes the objective: every answer's log-ratio is divided by its own length, so long
    answers get a smaller effective ``beta`` (a weaker pull towards / away from them) and a
    pair's margin no longer grows with answer length; the result is length-normalised and
    no longer the optimum of the KL-regularised RLHF objective. Prompt and padding tokens
    (labels -100) never count.

    >>> from minimind_lib.model.config import MiniMindConfig
    >>> from minimind_lib.model.decoder import MiniMindForCausalLM
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> model = MiniMindForCausalLM(MiniMindConfig(vocab_size=16, hidden_size=8,
    ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
    ...     max_position_embeddings=8))
    >>> ids = torch.tensor([[3, 4, 5, 6]])
    >>> sequence_logprobs(model, ids, torch.tensor([[-100, -100, 5, 6]])).shape
    torch.Size([1])
    """
    counts = _answer_counts(labels)  # (B,)
    total = token_logprobs(model, input_ids, labels).sum(dim=1)  # (B,)
    return total / counts if average else total


def token_logprobs(model: nn.Module, input_ids: Tensor, labels: Tensor,
                   temperature: float = 1.0) -> Tensor:
    """``log pi(y_t | x, y_<t)`` per position (B, T-1): entry t scores token t+1 where its label
    is supervised, and is 0 where it is not (prompt, padding). Computed in fp32. Its row sums
    are ``sequence_logprobs``; GRPO (notebook 10) needs the tokens one by one. ``temperature``
    scores the tokens under the tempered distribution ``softmax(logits / temperature)``: the
    policy that sampled them at that temperature.

    >>> from minimind_lib.model.config import MiniMindConfig
    >>> from minimind_lib.model.decoder import MiniMindForCausalLM
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> model = MiniMindForCausalLM(MiniMindConfig(vocab_size=16, hidden_size=8,
    ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
    ...     max_position_embeddings=8))
    >>> logps = token_logprobs(model, torch.tensor([[3, 4, 5, 6]]),
    ...                        torch.tensor([[-100, -100, 5, 6]]))
    >>> logps.shape, logps[0, 0].item(), bool((logps[0, 1:] < 0).all())
    (torch.Size([1, 3]), 0.0, True)
    """
    targets = labels[:, 1:]  # (B, T-1): position t predicts token t+1
    if not isinstance(model, MiniMindForCausalLM):  # e.g. wrapped in DDP: the plain forward
        logits = model(input_ids).logits[:, :-1]  # (B, T-1, V)
        return -F.cross_entropy(logits.float().transpose(1, 2) / temperature, targets,
                                ignore_index=IGNORE_INDEX, reduction="none")  # 0 where ignored
    # subtle: only the answer positions need logits. The output head (V x C) is most of a small
    # model's compute and answers are a fraction of each sequence, so run the trunk, then the
    # head on the answer positions only: the same numbers as ``answer_logprobs(model(x).logits)``.
    # The head and the log-softmax run chunk by chunk (``chunked_token_logprobs``): autograd
    # keeps no (N, V) tensor, backward recomputes each chunk's logits
    hidden, _ = model.model(input_ids)  # (B, T, C)
    rows, cols = (targets != IGNORE_INDEX).nonzero(as_tuple=True)  # (N,) each: answer positions
    answers, weight = targets[rows, cols], head_weight(model.lm_head)  # answers (N,)
    if weight is not None:
        per_token = chunked_token_logprobs(hidden[rows, cols], weight, answers,
                                           temperature)  # (N,)
    else:  # an int8 or LoRA-wrapped head runs as a module
        logits = model.lm_head(hidden[rows, cols])  # (N, V)
        per_token = -F.cross_entropy(logits.float() / temperature, answers,
                                     reduction="none")  # (N,)
    return per_token.new_zeros(targets.shape).index_put((rows, cols), per_token)  # (B, T-1)


# --- 4. the loss function the training engine calls --------------------------------------


def frozen_copy(model: nn.Module) -> nn.Module:
    """The DPO reference: a copy of ``model`` in eval mode whose parameters take no gradient."""
    reference = copy.deepcopy(model).eval()
    reference.requires_grad_(False)
    return reference
