"""Batched generation (``minimind_lib.model.generation``, ``kv_cache``): prompts of different
lengths in one left-padded batch get, row by row, the greedy answer each gets alone; the static
cache holds what the concatenating cache holds; finished rows leave without changing the rest.

Tolerances: logits are compared at 1e-5 (fp32; the batched and lone paths multiply matrices of
different shapes, so the last bits differ); token ids must be equal. A tie between the two best
logits closer than that could flip a greedy token: the random models below are seeded and
checked not to have one.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
from minimind_lib.model.generation import (
    ContinuousBatch,
    Decoding,
    Row,
    compile_decoder,
    generate_many,
    left_pad,
    unpad,
)
from minimind_lib.model.kv_cache import StaticCache

VOCAB = 48


def tiny(position_encoding: str = "rope", use_moe: bool = False, qk_norm: bool = False,
         seed: int = 0) -> MiniMindForCausalLM:
    torch.manual_seed(seed)
    config = MiniMindConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=96, position_encoding=position_encoding,
                            use_moe=use_moe, qk_norm=qk_norm)
    model = MiniMindForCausalLM(config).eval()
    with torch.no_grad():  # sharper logits than the 0.02 init: greedy ties become unlikely
        model.lm_head.weight.mul_(20)
    return model


def alone(model: MiniMindForCausalLM, prompt: list[int], new: int, **kw) -> list[int]:
    out = model.generate(torch.tensor([prompt]), new, temperature=0, **kw)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("position_encoding", ["rope", "alibi", "none"])
@pytest.mark.parametrize("use_sdpa", [True, False])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 20), min_size=1, max_size=6), seed=st.integers(0, 10**6))
def test_greedy_rows_equal_each_prompt_alone(position_encoding, use_sdpa, lengths, seed):
    model = tiny(position_encoding).set_attention(use_sdpa)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]
    ids, mask = left_pad(prompts)
    batched = model.generate(ids, 10, temperature=0, attention_mask=mask)[:, ids.shape[1]:]
    for row, prompt in enumerate(prompts):
        assert batched[row].tolist() == alone(model, prompt, 10), (row, prompt)


@pytest.mark.parametrize("kind", ["moe", "qk_norm"])
def test_batched_greedy_for_moe_and_minimind3(kind):
    model = tiny(use_moe=kind == "moe", qk_norm=kind == "qk_norm", seed=3)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9], [4, 4, 4]]
    ids, mask = left_pad(prompts)
    batched = model.generate(ids, 8, temperature=0, attention_mask=mask)[:, ids.shape[1]:]
    assert [row.tolist() for row in batched] == [alone(model, p, 8) for p in prompts]


def test_static_cache_logits_equal_the_concatenating_cache_and_no_cache():
    model = tiny(seed=1)
    prompts = [torch.tensor([5, 6, 7, 8, 9]), torch.tensor([3, 2])]
    decoding = Decoding(model, capacity=12, max_batch=2)
    logits = decoding.prefill(prompts)  # (2, V)
    for row, prompt in enumerate(prompts):
        full = model(prompt[None]).logits[0, -1]
        torch.testing.assert_close(logits[row], full, atol=1e-5, rtol=1e-5)
    token = logits.argmax(-1)
    stepped = decoding.step(token)
    for row, prompt in enumerate(prompts):
        seq = torch.cat((prompt, token[row:row + 1]))[None]
        torch.testing.assert_close(stepped[row], model(seq).logits[0, -1], atol=1e-5, rtol=1e-5)
        past = model(prompt[None], use_cache=True).past_key_values
        concat = model(token[row:row + 1][None], past_key_values=past).logits[0, -1]
        torch.testing.assert_close(stepped[row], concat, atol=1e-5, rtol=1e-5)


def test_static_cache_writes_in_place_without_growing():
    model = tiny()
    decoding = Decoding(model, capacity=16, max_batch=1)
    decoding.prefill([torch.tensor([1, 2, 3])])
    keys = decoding.cache.keys[0]
    pointer = keys.data_ptr()
    decoding.step(torch.tensor([4]))
    decoding.step(torch.tensor([5]))
    assert decoding.cache.keys[0].data_ptr() == pointer  # the same storage, written in place
    assert decoding.cache.lengths.tolist() == [5]
    assert keys.shape[2] == 16


def test_rows_leave_and_join_in_place():
    model = tiny(seed=7)
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]
    decoding = Decoding(model, capacity=20, max_batch=4)
    tokens = decoding.prefill([torch.tensor(p) for p in prompts]).argmax(-1)
    storage = decoding.cache.keys[0].data_ptr()
    got = {i: [int(t)] for i, t in enumerate(tokens)}
    rows = torch.arange(4)
    for step in range(6):
        if step == 2:  # rows 0 and 2 finish: the last kept row moves into a hole
            order = decoding.drop(torch.tensor([True, False, True, False]))
            rows, tokens = rows[order], tokens[order]
        tokens = decoding.step(tokens).argmax(-1)
        for row, t in zip(rows.tolist(), tokens.tolist(), strict=True):
            got[row].append(t)
    assert decoding.cache.keys[0].data_ptr() == storage  # no reallocation
    assert rows.tolist() == [3, 1]
    for row in (1, 3):
        assert got[row] == alone(model, prompts[row], 7)


def test_finished_rows_leave_and_the_rest_continue_unchanged():
    model = tiny(seed=2)
    prompts = [[1, 2, 3], [7, 8], [5]]
    answers = [alone(model, p, 12) for p in prompts]
    stop = answers[1][2]  # row 1 stops at its third token
    ids, mask = left_pad(prompts)
    steps = list(model.stream(ids, 12, temperature=0, eos_token_id=stop, attention_mask=mask))
    out = torch.stack(steps, dim=1).tolist()
    for row, expected in enumerate(answers):
        cut = expected.index(stop) + 1 if stop in expected else len(expected)
        assert out[row][:cut] == expected[:cut]
        assert all(t == stop for t in out[row][cut:])  # finished rows yield the stop id


def test_stream_stops_at_any_of_several_stop_ids_and_when_all_rows_stop():
    model = tiny(seed=4)
    prompts = [[1, 2], [3]]
    answers = [alone(model, p, 6) for p in prompts]
    stops = [answers[0][0], answers[1][0]]  # each row's first token stops it
    ids, mask = left_pad(prompts)
    steps = list(model.stream(ids, 6, temperature=0, eos_token_id=stops, attention_mask=mask))
    assert len(steps) == 1


def test_rows_that_join_a_running_batch_decode_as_alone():
    model = tiny(seed=5)
    first, late = [1, 2, 3, 4], [9, 8]
    decoding = Decoding(model, capacity=24, max_batch=2)
    token = decoding.prefill([torch.tensor(first)]).argmax(-1)
    got_first = [int(token)]
    for _ in range(3):
        token = decoding.step(token).argmax(-1)
        got_first.append(int(token))
    joined = decoding.prefill([torch.tensor(late)]).argmax(-1)  # a request arrives mid-answer
    tokens = torch.cat((token, joined))
    got_late = [int(joined)]
    for _ in range(4):
        tokens = decoding.step(tokens).argmax(-1)
        got_first.append(int(tokens[0]))
        got_late.append(int(tokens[1]))
    assert got_first == alone(model, first, 8)
    assert got_late == alone(model, late, 5)


def test_left_pad_and_unpad_reject_empty_rows_and_bad_shapes():
    with pytest.raises(ValueError, match="at least one token"):
        left_pad([[1], []])
    with pytest.raises(ValueError, match="all 0"):
        unpad(torch.tensor([[1, 2]]), torch.tensor([[0, 0]]))
    with pytest.raises(ValueError, match="attention_mask shape"):
        unpad(torch.tensor([[1, 2]]), torch.tensor([[1]]))


def test_cache_capacity_and_context_are_enforced():
    model = tiny()
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model.generate(torch.tensor([[1] * 90]), 10, temperature=0)
    cache = StaticCache(num_layers=2, capacity=3)
    cache.lengths = torch.zeros(1, dtype=torch.long)
    with pytest.raises(ValueError, match="holds 3 positions"):
        model.model(torch.tensor([[1, 2, 3, 4]]), cache)


def test_sampled_batches_are_reproducible_with_a_generator():
    model = tiny(seed=6)
    ids, mask = left_pad([[1, 2, 3], [4]])
    a = model.generate(ids, 8, temperature=1.0, top_k=10, attention_mask=mask,
                       generator=torch.Generator().manual_seed(7))
    b = model.generate(ids, 8, temperature=1.0, top_k=10, attention_mask=mask,
                       generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


@pytest.mark.parametrize("batch_size", [1, 3, 64])
def test_generate_many_refills_the_batch_and_keeps_every_answer(batch_size):
    model = tiny(seed=8)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (int(n),), generator=g).tolist()
               for n in torch.randint(1, 15, (11,), generator=g)]
    expected = [alone(model, p, 9) for p in prompts]
    stop = expected[0][4]
    got = generate_many(model, prompts, 9, eos_token_id=stop, batch_size=batch_size)
    for answer, full in zip(got, expected, strict=True):
        cut = full.index(stop) + 1 if stop in full else len(full)
        assert answer == full[:cut]


def test_rows_with_their_own_sampling_settings_match_a_lone_request():
    """The server's case: a greedy row and a seeded sampled row in one batch each answer as they
    would alone (the sampled row draws from its own generator)."""
    model = tiny(seed=9)
    batch = ContinuousBatch(model, capacity=30, max_batch=2)
    greedy = batch.submit(Row(torch.tensor([1, 2, 3]), 8))
    sampled = batch.submit(Row(torch.tensor([5]), 8, temperature=1.0, top_k=5,
                               generator=torch.Generator().manual_seed(3)))
    while batch.busy:
        batch.step()
    assert greedy.tokens == alone(model, [1, 2, 3], 8)
    lone = model.generate(torch.tensor([[5]]), 8, temperature=1.0, top_k=5,
                          generator=torch.Generator().manual_seed(3))[0, 1:].tolist()
    assert sampled.tokens == lone
    assert greedy.finish_reason == sampled.finish_reason == "length"


def test_a_cancelled_row_leaves_at_the_next_step():
    model = tiny(seed=10)
    batch = ContinuousBatch(model, capacity=30, max_batch=2)
    keep = batch.submit(Row(torch.tensor([1, 2]), 10))
    gone = batch.submit(Row(torch.tensor([3]), 10))
    batch.step()
    gone.finish_reason = "cancelled"
    while batch.busy:
        batch.step()
    assert len(gone.tokens) == 1 and keep.tokens == alone(model, [1, 2], 10)
    with pytest.raises(ValueError, match="capacity"):
        batch.submit(Row(torch.tensor([1] * 25), 10))


def test_a_cache_that_starts_small_grows_and_answers_the_same():
    model = tiny(seed=11)
    batch = ContinuousBatch(model, capacity=40, max_batch=3, initial_capacity=2)
    rows = [batch.submit(Row(torch.tensor(p), 12)) for p in ([1, 2, 3, 4, 5], [6], [7, 8])]
    while batch.busy:
        batch.step()
    assert batch.decoding.cache.capacity == 20  # 2 -> 5 (the prompt) -> 10 -> 20 (17 needed)
    for row, p in zip(rows, ([1, 2, 3, 4, 5], [6], [7, 8]), strict=True):
        assert row.tokens == alone(model, p, 12)


def test_a_compiled_decoder_answers_the_same():
    model = tiny(seed=12)
    prompts = [[1, 2, 3], [4], [5, 6]]
    expected = generate_many(model, prompts, 6, batch_size=2)
    compiled = compile_decoder(copy.deepcopy(model))
    assert generate_many(compiled, prompts, 6, batch_size=2) == expected
    assert set(compiled.state_dict()) == set(model.state_dict())  # names unchanged
    with pytest.raises(TypeError, match="MiniMind decoder"):
        compile_decoder(torch.nn.Linear(2, 2))
