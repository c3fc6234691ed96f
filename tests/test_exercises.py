"""Every notebook exercise can fail: each registered check (minimind_lib.course.exercises) rejects a
plausible wrong answer, and every exercise a notebook asks for has a check and a worked answer
in notebooks/solutions/ (which nbval runs, so the worked answers pass their checks)."""

from __future__ import annotations

import ast
import json
import math
import operator
import re
from pathlib import Path

import pytest
import torch

from minimind_lib import REPO_ROOT
from minimind_lib.course.exercises import CHECKS, exercise
from minimind_lib.data import sft_example
from minimind_lib.model import MiniMindForCausalLM
from minimind_lib.model.moe import load_balancing_loss
from minimind_lib.tokenizer import apply_chat_template
from minimind_lib.training.dpo import dpo_loss
from minimind_lib.training.logprobs import answer_logprobs

NOTEBOOKS = REPO_ROOT / "notebooks"
CALL = re.compile(r"""exercise\(\s*["'](\d\d\.\d+)["']""")


# --- plausible wrong answers: the mistake a student is likely to make, one per exercise -------


def _knowledge_share(records):  # 00.1: the other family
    return sum(r.get("family") == "knowledge" for r in records) / len(records)


def _valid_pair():  # 00.2: a pair read_jsonl accepts
    return {"chosen": [{"role": "user", "content": "2 + 2?"},
                       {"role": "assistant", "content": "4"}],
            "rejected": [{"role": "user", "content": "2 + 2?"},
                         {"role": "assistant", "content": "5"}]}


def _merge_overlapping(ids, pair, new_id):  # 01.1: forgets to skip the merged symbol
    out = list(ids)
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            out[i] = new_id
            out[i + 1] = None
    return [t for t in out if t is not None]


def _encode_rendered(tokenizer, messages, add_generation_prompt=False):  # 01.3: the injection
    return tokenizer.encode(apply_chat_template(messages, add_generation_prompt))


def _window_off_by_one(T, window):  # 02.1: i - j <= window
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return (j <= i) & (i - j <= window)


def _kv_bytes_without_gqa(config, seq_len, bytes_per_value):  # 02.2: one KV head per query head
    return (2 * config.num_hidden_layers * config.num_attention_heads * config.head_dim * seq_len
            * bytes_per_value)


def _causal_only(attention_mask):  # 02.3: forgets the pads
    B, T = attention_mask.shape
    return torch.ones(T, T, dtype=torch.bool).tril().expand(B, 1, T, T)


def _count_untied(c):  # 03.1: counts the head even when tied
    attn = c.hidden_size * c.head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    mlp = 3 * c.hidden_size * c.intermediate_size
    return (2 * c.vocab_size * c.hidden_size + c.hidden_size
            + c.num_hidden_layers * (attn + mlp + 2 * c.hidden_size))


def _rope_interleaved(x, position, theta):  # 03.3: pairs (0, 1), (2, 3)... (GPT-J), not halves
    d = x.shape[-1]
    z = torch.complex(x[0::2], x[1::2])
    freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    z = z * torch.polar(torch.ones(d // 2), position * freq)
    return torch.stack([z.real, z.imag], dim=-1).flatten()


def _lr_to_zero(step, max_steps, peak, warmup, min_ratio=0.1):  # 04.2: decays to 0
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (1 - (step - warmup) / max(1, max_steps - 1 - warmup))


def _every_turn(tokenizer, messages, max_length):  # 05.1: the default mask, every reply
    return sft_example(tokenizer, messages, max_length)


def _char_f1_sets(prediction, reference):  # 05.2: sets instead of multisets
    p, r = set(prediction) - {" "}, set(reference) - {" "}
    if not p or not r:
        return float(p == r)
    shared = len(p & r)
    return 0.0 if shared == 0 else 2 * shared / (len(p) + len(r))


def _unsigned_levels(w, bits):  # 07.1: 2^bits - 1 levels, as if unsigned
    qmax = 2 ** bits - 1
    s = w.abs().amax(dim=1, keepdim=True) / qmax
    return torch.round(w / s).clamp(-qmax, qmax), s


def _per_channel_error(w, g):  # 07.2: ignores g (one group per row)
    s = w.abs().amax(dim=1, keepdim=True) / 127
    return float((w - torch.round(w / s) * s).abs().mean())


def _int8_bytes_no_scales(c):  # 07.3: forgets the fp32 scales
    norms = (2 * c.num_hidden_layers + 1) * c.hidden_size
    return MiniMindForCausalLM(c).num_parameters() - norms + 4 * norms


def _min_p_on_logits(logits, min_p):  # 08.1: the threshold on logits, not probabilities
    return torch.softmax(logits.masked_fill(logits < min_p * logits.max(), float("-inf")), -1)


def _sign_aware_penalty(logits, seen_ids, theta):  # 08.2: Hugging Face's rule, not CTRL's
    z = logits.clone()
    seen = torch.tensor(sorted(set(seen_ids)))
    z[seen] = torch.where(z[seen] > 0, z[seen] / theta, z[seen] * theta)
    return z


def _penalty_without_cache(model, prompt_ids, n_new, theta):  # 08.3: right tokens, no cache
    ids = list(prompt_ids)
    for _ in range(n_new):
        with torch.no_grad():
            z = model(torch.tensor([ids])).logits[0, -1]
        ids.append(int(_sign_aware_penalty(z, ids, theta).argmax()))
    return ids[len(prompt_ids):]


def _switch_renormalised(logits):  # 11.1: renormalises the one weight to 1
    expert = logits.argmax(dim=-1)
    return expert, torch.ones(len(expert))


def _per_sequence_aux(probs, chosen, alpha):  # 11.2: MiniMind's per-sequence loss
    return load_balancing_loss(probs, chosen, alpha, seq_aux=True)


def _all_experts_active(c):  # 11.3: every routed expert counted as active
    model = MiniMindForCausalLM(c)
    return model.num_parameters(), model.num_parameters()


def _slopes_any_h(H):  # 12.2: 2^(-8h/H), right only when H is a power of two
    return [2 ** (-8 * h / H) for h in range(1, H + 1)]


def _yarn_band_unclamped(d, theta, L, beta_fast, beta_slow):  # 12.3: no clamps
    at = lambda r: d * math.log(L / (2 * math.pi * r)) / (2 * math.log(theta))  # noqa: E731
    return math.floor(at(beta_fast)), math.ceil(at(beta_slow))


def _gae_returns(rewards, values, gamma, lam):
    """GAE's recursion, but returning A + V (the returns) instead of A."""
    adv, nxt_v, nxt_a = [0.0] * len(rewards), 0.0, 0.0
    for t in reversed(range(len(rewards))):
        nxt_a = float(rewards[t]) + gamma * nxt_v - float(values[t]) + gamma * lam * nxt_a
        nxt_v = float(values[t])
        adv[t] = nxt_a + nxt_v
    return adv


#: exercise id -> a plausible wrong answer (added with each exercise)
def _walker_with_power(node):
    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.Pow: operator.pow}
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_walker_with_power(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in ops:
        return ops[type(node.op)](_walker_with_power(node.left), _walker_with_power(node.right))
    raise ValueError(f"not allowed: {type(node).__name__}")


WRONG: dict[str, object] = {
    "00.1": _knowledge_share,
    "00.2": _valid_pair,
    "01.1": _merge_overlapping,
    "01.2": lambda: [("a", "b"), ("Ġ", "c")],  # ties to the first pair seen
    "01.3": _encode_rendered,
    "02.1": _window_off_by_one,
    "02.2": _kv_bytes_without_gqa,
    "02.3": _causal_only,
    "03.1": _count_untied,
    "03.2": lambda h: int(8 * h / 3),  # not rounded up to a multiple of 64
    "03.3": _rope_interleaved,
    "04.1": lambda settings, world_size=1: settings.batch_size * settings.seq_len * world_size,
    "04.2": _lr_to_zero,
    "04.3": lambda g: 2.0 ** 16,  # GradScaler's initial scale: safe, but not the smallest
    "05.1": _every_turn,
    "05.2": _char_f1_sets,
    "05.3": lambda dataset: dataset.num_targets / len(dataset),  # targets per example
    "07.1": _unsigned_levels,
    "07.2": _per_channel_error,
    "07.3": _int8_bytes_no_scales,
    "08.1": _min_p_on_logits,
    "08.2": _sign_aware_penalty,
    "08.3": _penalty_without_cache,
    "11.1": _switch_renormalised,
    "11.2": _per_sequence_aux,
    "11.3": _all_experts_active,
    "12.1": lambda positions, s: positions * s,  # stretches instead of squeezing
    "12.2": _slopes_any_h,
    "12.3": _yarn_band_unclamped,
    # 13.1: the right shape without the permute: each "patch" is a strip of one channel's rows
    "13.1": lambda pixels, p: pixels.reshape(pixels.shape[0], -1, pixels.shape[1] * p * p),
    # 13.2: per row (each picture picks a caption) instead of per column
    "13.2": lambda s: (s.argmax(dim=1) == torch.arange(len(s))).float().mean(),
    # 13.3: every slot gets the mean of the picture's vectors
    "13.3": lambda e, i, m: torch.where((i == -200)[..., None], m.mean(1, keepdim=True), e),
    # 09: LoRA without the alpha / r scaling; scaled by alpha, not alpha / r; every matrix
    # taken as square (hidden x hidden), which GQA's k/v and the MLP's are not
    "09.1": lambda x, W, A, B, alpha: x @ W.T + (x @ A.T) @ B.T,
    "09.2": lambda W, A, B, alpha: W + alpha * B @ A,
    "09.3": lambda config, rank, targets: (config.num_hidden_layers * len(targets) * rank
                                           * 2 * config.hidden_size),
    # notebook 06: the sign of eq. 8 flipped; the sum instead of the mean; >= counts ties;
    # the NLL summed over the answer instead of per token
    "06.1": lambda margin, beta, B: beta / B * torch.sigmoid(-margin),
    "06.2": lambda logits, labels: answer_logprobs(logits, labels),
    "06.3": lambda pol, ref: ((pol - ref)[:, 0] >= (pol - ref)[:, 1]).float().mean(),
    "06.4": lambda pi_w, pi_l, ref_w, ref_l, n_w, beta, alpha: (
        dpo_loss(pi_w, pi_l, ref_w, ref_l, beta)[0] - alpha * pi_w.mean()),
    # notebook 10: the mean of the whole group as baseline; k1 instead of k2; clipping
    # counted wherever the ratio leaves [1 - eps, 1 + eps], whatever the advantage's sign
    "10.1": lambda rewards: rewards - rewards.mean(dim=1, keepdim=True),
    "10.2": lambda logp, ref: logp - ref,
    "10.3": lambda ratio, adv, mask, eps: (((ratio - 1).abs() > eps) & mask).sum() / mask.sum(),
    # notebook 14: every block read with json.loads, a malformed one raising; a walker that
    # lets ** through (9**9**9 would run for ever); calls compared as they are, so 3 != 3.0
    "14.1": lambda text: [json.loads(b) for b in re.findall(r"<tool_call>(.*?)</tool_call>",
                                                            text, re.S)],
    "14.2": _walker_with_power,
    "14.3": lambda got, want: got == want,
    # notebook 15: observations left in the mask; CISPO's weight not detached (the ratio's
    # gradient leaks in); the returns (A + V) instead of the advantages
    "15.1": lambda prompt, turns: (prompt + [t for s, o in turns for t in s + o],
                                   [0] * len(prompt) + [1 for s, o in turns for _ in s + o]),
    "15.2": lambda logp, old, adv, m: torch.exp(logp - old).clamp(max=m) * adv[:, None] * logp,
    "15.3": _gae_returns,
    # notebook 16: the gradient without the T^2 in front of the KL; the teacher's top token as
    # a hard label instead of its distribution; every teacher answer kept, finished or not
    "16.1": lambda s, t, T: (torch.softmax(s / T, -1) - torch.softmax(t / T, -1)) / (T * len(s)),
    "16.2": lambda s, t, T: T ** 2 * torch.nn.functional.cross_entropy(s / T, t.argmax(-1)),
    "16.3": lambda conversations, answers: [c[:-1] + [{"role": "assistant", "content": a.text}]
                                            for c, a in zip(conversations, answers, strict=True)],
    # notebook 18: only a token's first byte walked; values not escaped (1.5 matches 105);
    # distances counting the stop token (accepting states 1 away)
    "18.1": lambda dfa, tokens, state: [i for i, b in enumerate(tokens)
                                        if b and dfa.step(state, b[0]) != -1],
    "18.2": lambda values: "(" + "|".join(json.dumps(v, ensure_ascii=False) for v in values) + ")",
    "18.3": lambda moves, accepting: _distances_plus_one(moves, accepting),
    # encoded apart: " three" after "two," loses nothing here, but "France is " + "Paris" does
    "17.1": lambda tok, ctx, cont: (tok.encode(ctx, set()), tok.encode(cont, set())),
    # per UTF-8 byte, not per character: Chinese choices weigh 3x
    "17.2": lambda lls, choices: (max(range(len(lls)), key=lambda k: (lls[k], -k)),
                                  max(range(len(lls)),
                                      key=lambda k: (lls[k] / len(choices[k].encode()), -k))),
}


def _distances_plus_one(moves, accepting):
    """Fewest tokens to a state where the stop token may come, plus that stop token."""
    far = len(moves) + 1
    dist = [1 if s in accepting else far for s in range(len(moves))]
    for _ in moves:
        for s, m in enumerate(moves):
            for t in m.values():
                if t != -1:
                    dist[s] = min(dist[s], dist[t] + 1)
    return dist


def _asked(notebook: Path) -> set[str]:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return {m for c in cells if c["cell_type"] == "code"
            for m in CALL.findall("".join(c["source"]))}


def test_every_exercise_a_notebook_asks_for_has_a_check_a_wrong_answer_and_a_solution():
    for notebook in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        asked = _asked(notebook)
        assert asked <= set(CHECKS), f"{notebook.name}: no check for {sorted(asked - set(CHECKS))}"
        assert asked <= set(WRONG), (f"{notebook.name}: no wrong answer for "
                                     f"{sorted(asked - set(WRONG))}")
        if asked:
            solution = NOTEBOOKS / "solutions" / notebook.name
            assert solution.is_file(), f"{notebook.name} has exercises but no {solution}"
            assert _asked(solution) == asked, f"{solution.name} answers other exercises"


@pytest.mark.parametrize("exercise_id", sorted(WRONG))
def test_a_wrong_answer_fails_its_check(exercise_id):
    with pytest.raises(AssertionError):
        exercise(exercise_id, WRONG[exercise_id])


def test_a_stub_is_not_done_yet(capsys):
    def stub(*args):
        raise NotImplementedError("exercise")

    for exercise_id in CHECKS:
        assert exercise(exercise_id, stub) is False
    assert capsys.readouterr().out.count("not done yet") == len(CHECKS)


#: answers that ignore the question: constants, the input handed back, nothing
DEGENERATE = {"the constant 0.0": lambda *a, **k: 0.0,
              "a zero tensor": lambda *a, **k: torch.tensor(0.0),
              "its first argument": lambda *a, **k: a[0] if a else None,
              "None": lambda *a, **k: None, "an empty list": lambda *a, **k: [],
              "True": lambda *a, **k: True}


@pytest.mark.parametrize("exercise_id", sorted(CHECKS))
def test_a_degenerate_answer_fails_its_check(exercise_id):
    for name, answer in DEGENERATE.items():
        try:
            exercise(exercise_id, answer)
        except NotImplementedError:
            raise AssertionError(f"{exercise_id}: {name} read as the stub") from None
        except Exception:  # noqa: BLE001 - an AssertionError or the error a wrong type raises
            continue
        raise AssertionError(f"exercise {exercise_id} accepts {name}")


def test_every_solution_asserts_that_its_checks_say_correct():
    """nbval runs the solution notebooks; each answer's check must be asserted, so a check that
    says "wrong" (or "not done yet") fails the run."""
    for solution in sorted((NOTEBOOKS / "solutions").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(solution.read_text(encoding="utf-8"))["cells"]
        source = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        asserted = set(re.findall(r"""assert exercise\(\s*["'](\d\d\.\d+)["']""", source))
        assert asserted == _asked(solution), (
            f"{solution.name}: not asserted: {sorted(_asked(solution) - asserted)}")


def test_a_right_answer_computed_in_float32_is_right():
    """Issue 49.11: 16.2 rejected a correct float32 answer ("got 4.130373, expected 4.130373")."""
    def soft_ce_float32(s, t, T):
        p_t, log_p_s = torch.softmax(t.float() / T, -1), torch.log_softmax(s.float() / T, -1)
        return T ** 2 * -(p_t * log_p_s).sum(-1).mean()

    def kd_gradient_float32(s, t, T):
        s, t = s.float(), t.float()
        return T * (torch.softmax(s / T, -1) - torch.softmax(t / T, -1)) / len(s)

    assert exercise("16.2", soft_ce_float32) and exercise("16.1", kd_gradient_float32)


def _parser_keeping_everything(text):
    """14.1, wrong: does not check the name and the arguments' types, keeps extra keys."""
    calls = []
    for block in re.findall(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL):
        try:
            call = json.loads(block)
        except json.JSONDecodeError:
            continue
        if isinstance(call, dict) and "name" in call:
            args = call.get("arguments", {})
            calls.append({**call, "arguments": json.loads(args) if isinstance(args, str)
                          else args})
    return calls


def _walker_allowing(*extra):
    """14.2, wrong: the four operators and unary minus, plus ``extra`` AST node types."""
    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.Mod: operator.mod, ast.FloorDiv: operator.floordiv,
           ast.Lt: operator.lt}

    def walk(node):
        if isinstance(node, ast.Constant) and not isinstance(node.value, str | bool | None):
            if isinstance(node.value, complex) and complex not in extra:
                raise ValueError("complex")
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.UnaryOp) and type(node.op) in extra:
            return operator.pos(walk(node.operand)) if isinstance(node.op, ast.UAdd) else \
                not walk(node.operand)
        if isinstance(node, ast.BinOp) and (type(node.op) in (ast.Add, ast.Sub, ast.Mult,
                                                               ast.Div) or type(node.op) in extra):
            return ops[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Compare) and ast.Compare in extra:
            return ops[type(node.ops[0])](walk(node.left), walk(node.comparators[0]))
        raise ValueError(type(node).__name__)
    return walk


def _same_call_loosely(extra_keys=False, bool_as_int=False, any_case=False):
    """14.3, wrong in one way each."""
    def same(got, want):
        if got is None or got["name"] != want["name"]:
            return False
        a, b = got["arguments"], want["arguments"]
        if not extra_keys and set(a) != set(b) or not set(b) <= set(a):
            return False
        for key, expected in b.items():
            value = a[key]
            if isinstance(expected, int | float):
                if (isinstance(value, bool) and not bool_as_int) or isinstance(value, str) \
                        or value != expected:
                    return False
            elif (value.strip().lower() != expected.strip().lower() if any_case
                  else value.strip() != expected.strip()):
                return False
        return True
    return same


@pytest.mark.parametrize("exercise_id, wrong", [
    ("14.1", _parser_keeping_everything),
    ("14.2", _walker_allowing(ast.Mod, ast.FloorDiv)),
    ("14.2", _walker_allowing(ast.UAdd, ast.Not)),
    ("14.2", _walker_allowing(ast.Compare, complex)),
    ("14.3", _same_call_loosely(extra_keys=True)),
    ("14.3", _same_call_loosely(bool_as_int=True)),
    ("14.3", _same_call_loosely(any_case=True)),
], ids=["14.1 keeps anything", "14.2 % and //", "14.2 +x and not", "14.2 < and complex",
        "14.3 extra keys", "14.3 True as 1", "14.3 any case"])
def test_notebook_14s_checks_refuse_the_wrong_answers_issue_49_found(exercise_id, wrong):
    with pytest.raises(AssertionError):
        exercise(exercise_id, wrong)
