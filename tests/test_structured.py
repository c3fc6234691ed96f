"""Structured outputs (notebook 18): regex -> byte automaton -> token index -> constrained
decoding, proved against Python's ``re`` (the automaton) and outlines-core (the token masks)."""

import json
import random
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minimind_lib.inference.structured import (
    SchemaError,
    TokenIndex,
    TokenVocabulary,
    compile_regex,
    constrain,
    constrain_tool_calls,
    schema_to_regex,
    utf8_sequences,
    validate,
    vocabulary,
)
from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
from minimind_lib.model.generation import generate_many
from minimind_lib.tokenizer import load_tokenizer
from minimind_lib.tokenizer.chat import encode_chat
from minimind_lib.tools import parse_tool_calls, tool_schemas

TOK = load_tokenizer()

# Schemas a tool or a structured reply uses; the tests also run on the course's five tools.
SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string",
     "maxLength": 5}, "c": {"type": "null"}}, "required": ["b"]},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array",
     "items": {"type": "number"}, "minItems": 1, "maxItems": 3}}},
    {"type": "object", "properties": {"u": {"enum": ["km", "mile", "公里"]},
     "n": {"type": ["integer", "null"]}, "o": {"type": "object",
     "properties": {"x": {"type": "boolean"}}, "required": ["x"]}}, "required": ["u", "o"]},
    {"anyOf": [{"type": "integer"}, {"type": "string", "minLength": 2}]},
    {"type": "array", "items": {"type": "string"}, "minItems": 2},
]
TOOL_PARAMETERS = [t["function"]["parameters"] for t in tool_schemas()]


# ---------------------------------------------------------------- the automaton


@given(st.integers(0, 0x10FFFF), st.integers(0, 0x3000))
@settings(max_examples=200, deadline=None)
def test_utf8_sequences_cover_each_code_point_exactly_once(lo, width):
    hi = min(lo + width, 0x10FFFF)
    sequences = utf8_sequences(lo, hi)
    probe = random.Random(lo).sample(range(lo, hi + 1), min(50, hi - lo + 1)) + [lo, hi]
    for cp in probe:
        if 0xD800 <= cp <= 0xDFFF:
            continue
        data = chr(cp).encode()
        hits = [s for s in sequences if len(s) == len(data)
                and all(a <= b <= z for (a, z), b in zip(s, data, strict=True))]
        assert len(hits) == 1, (hex(cp), hits)
    # and nothing outside the range is matched
    for cp in (lo - 1, hi + 1):
        if 0 <= cp <= 0x10FFFF and not 0xD800 <= cp <= 0xDFFF:
            data = chr(cp).encode()
            assert not any(len(s) == len(data) and all(a <= b <= z for (a, z), b in
                                                        zip(s, data, strict=True))
                           for s in sequences)


PATTERNS = [r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", r'"([^"\\]|\\["\\n])*"', r"(ab|a)*b{2,3}",
            r"[a-cé-ê]+x?", r"(?:true|false|null)", r"\{[ ]?\}", r".{0,3}z", r"\d\d?"]
ALPHABET = "ab01-.\"\\nxzéêç {}truefalsn9é"


@given(st.sampled_from(PATTERNS), st.text(alphabet=ALPHABET, max_size=8))
@settings(max_examples=400, deadline=None)
def test_the_automaton_matches_what_python_re_matches(pattern, text):
    assert compile_regex(pattern).matches(text.encode()) == bool(re.fullmatch(pattern, text))


@pytest.mark.parametrize("bad", ["(ab", "a)", "*a", "[z-a]", "a{3,2}", r"\p{L}", "^a", "(?=a)",
                                 "a{1,5000}", "[]"])
def test_a_regex_outside_the_subset_is_refused_with_its_position(bad):
    with pytest.raises(ValueError, match="regular expression"):
        compile_regex(bad)


# ---------------------------------------------------------------- the schema


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "integer", "minimum": 0}, "minimum"),
    ({"type": "object", "properties": {"x": {"type": "string", "pattern": "a+"}}}, "pattern"),
    ({"type": "object", "properties": {"x": {"type": "string"}}, "additionalProperties": True},
     "additionalProperties"),
    ({"type": "date"}, "type"),
    ({"enum": [{"a": 1}]}, "enum"),
    ({"type": "object", "properties": {"x": {}}, "required": ["y"]}, "required"),
])
def test_a_schema_outside_the_subset_names_its_keyword(schema, keyword):
    with pytest.raises(SchemaError) as e:
        schema_to_regex(schema)
    assert e.value.keyword == keyword and keyword in str(e.value)


def test_allowed_tokens_equal_outlines_core_at_every_step():
    """The same token sequences through both indexes (ours from our regex, outlines-core's from
    its own compiler): the allowed sets agree at every step."""
    outlines_core = pytest.importorskip("outlines_core", reason="the [structured] extra")
    from outlines_core.json_schema import build_regex_from_schema

    vocab = vocabulary(TOK)
    stop = TOK.token_to_id("<|im_end|>")
    theirs_vocab = outlines_core.Vocabulary(stop, vocab.by_bytes())
    ours_vocab = TokenVocabulary(vocab.token_bytes, vocab.special, {stop})
    rng = random.Random(1)
    compared = 0
    for schema in TOOL_PARAMETERS + SCHEMAS:
        theirs = outlines_core.Index(build_regex_from_schema(json.dumps(schema), None),
                                     theirs_vocab)
        ours = TokenIndex(compile_regex(schema_to_regex(schema)), ours_vocab)
        for _ in range(10):
            guide, state = outlines_core.Guide(theirs), 0
            for _ in range(80):
                allowed = ours.allowed(state)
                assert sorted(guide.get_tokens()) == allowed, (schema, state)
                compared += 1
                closing = [t for t in allowed if t != stop and
                           TOK.token_bytes(t)[-1:] in (b'"', b"}", b"]")]
                if stop in allowed and rng.random() < 0.4:
                    assert guide.is_finished() or stop in guide.get_tokens()
                    break
                choices = [t for t in allowed if t != stop] or [stop]
                token = rng.choice(closing if closing and rng.random() < 0.3 else choices)
                if token == stop:
                    break
                guide.advance(token)
                state = ours.next_state(state, token)
    assert compared > 1000


# ---------------------------------------------------------------- decoding under the grammar


STOPS = [TOK.token_to_id("<|im_end|>"), TOK.token_to_id("<|endoftext|>")]


class _Closer(torch.nn.Module):
    """An output head that favours the tokens that close a string, an object or an array (and
    the stop tokens), so an untrained model's samples end within a test's budget."""

    def __init__(self, head):
        super().__init__()
        self.head = head
        bias = torch.zeros(len(TOK))
        for i in range(len(TOK)):
            if i in STOPS or TOK.token_bytes(i)[-1:] in (b'"', b"}", b"]"):
                bias[i] = 4.0
        self.register_buffer("bias", bias)

    def forward(self, hidden):
        return self.head(hidden) + self.bias


def _tiny_model(seed=0, closing=True):
    torch.manual_seed(seed)
    model = MiniMindForCausalLM(MiniMindConfig(vocab_size=len(TOK), hidden_size=32,
                                               num_hidden_layers=1, num_attention_heads=2,
                                               num_key_value_heads=1)).eval()
    if closing:
        model.lm_head = _Closer(model.lm_head)
    return model


def _text(tokens):
    return TOK.decode([t for t in tokens if t not in STOPS])


@pytest.mark.parametrize("schema", SCHEMAS + TOOL_PARAMETERS)
def test_every_constrained_output_parses_and_validates(schema):
    """An untrained model, sampled at temperature 1.5: every finished output is valid JSON
    under the schema, batch 1 and batched."""
    model = _tiny_model()
    grammar = constrain(schema, TOK)
    prompts = [[1, 5 + k] for k in range(6)]
    g = torch.Generator().manual_seed(0)
    batched = generate_many(model, prompts, 200, eos_token_id=STOPS, temperature=1.5,
                            generator=g, constraints=grammar, batch_size=4)
    alone = [model.generate(torch.tensor([p]), 200, temperature=1.5, eos_token_id=STOPS,
                            generator=torch.Generator().manual_seed(k),
                            constraints=grammar)[0, 2:].tolist()
             for k, p in enumerate(prompts[:2])]
    finished = 0
    for tokens in batched + alone:
        if tokens[-1] not in STOPS:  # ran out of budget inside a long string: not finished
            continue
        finished += 1
        value = json.loads(_text(tokens))
        assert validate(value, schema) == [], (_text(tokens), schema)
    assert finished >= 4  # of 8: the rest ran out of budget inside a number or string


def test_greedy_constrained_rows_equal_their_batch_one_answers():
    model = _tiny_model(1)
    grammar = constrain(TOOL_PARAMETERS[1], TOK)
    prompts = [[1, 40, 41, 42], [1, 7], [1, 99, 3]]
    batched = generate_many(model, prompts, 60, eos_token_id=STOPS, constraints=grammar,
                            batch_size=3)
    for p, row in zip(prompts, batched, strict=True):
        alone = model.generate(torch.tensor([p]), 60, temperature=0, eos_token_id=STOPS,
                               constraints=grammar)[0, len(p):].tolist()
        assert row == alone[:len(row)]


def test_rows_may_mix_constrained_and_free():
    model = _tiny_model(2)
    grammar = constrain({"type": "boolean"}, TOK)
    out = generate_many(model, [[1, 5], [1, 6]], 12, eos_token_id=STOPS,
                        constraints=[grammar, None])
    assert _text(out[0]) in ("true", "false") and out[0][-1] in STOPS
    free = model.generate(torch.tensor([[1, 6]]), 12, temperature=0, eos_token_id=STOPS)
    assert out[1] == free[0, 2:].tolist()[:len(out[1])]


def test_tool_call_grammar_gives_calls_the_parser_reads():
    model = _tiny_model(3)
    tools = tool_schemas()
    grammar = constrain_tool_calls(tools, TOK)
    prompt = encode_chat(TOK, [{"role": "user", "content": "What is 2+2?"}],
                         add_generation_prompt=True, tools=tools)
    outs = generate_many(model, [prompt] * 4, 300, eos_token_id=STOPS, temperature=1.0,
                         generator=torch.Generator().manual_seed(0), constraints=grammar)
    names = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    done = [o for o in outs if o[-1] in STOPS]
    assert done
    for tokens in done:
        reply = parse_tool_calls(TOK.decode(tokens[:-1]))
        assert reply.errors == [] and reply.calls and reply.content == ""
        for call in reply.calls:
            assert validate(call["arguments"], names[call["name"]]) == []


def test_a_tool_outside_the_subset_names_the_tool_and_keyword():
    bad = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}}}
    with pytest.raises(SchemaError) as e:
        constrain_tool_calls(tool_schemas() + [bad], TOK)
    assert e.value.keyword == "minimum" and "tools[5].function.parameters" in str(e.value)


def test_the_mask_follows_the_grammar_not_the_logits():
    """Whatever the model prefers, a token outside the mask is never chosen."""
    model = _tiny_model(4, closing=False)
    with torch.no_grad():  # make the model love a token the grammar forbids
        model.lm_head.weight[TOK.encode("x")[0]] += 50
    out = generate_many(model, [[1, 2]], 10, eos_token_id=STOPS,
                        constraints=constrain({"enum": ["yes", "no"]}, TOK))[0]
    assert _text(out) in ("\"yes\"", "\"no\"")


@pytest.mark.parametrize("extra", [0, 1, 3, 9])
def test_a_token_budget_cuts_a_reply_short_but_never_unfinished(extra):
    """With ``max_new_tokens`` just above the fewest tokens the grammar needs, every output,
    stopped or not, is complete JSON valid under the schema (the mask looks ahead)."""
    model = _tiny_model(5, closing=False)  # an untrained model: it never wants to close
    for schema in TOOL_PARAMETERS + SCHEMAS[:3]:
        grammar = constrain(schema, TOK)
        budget = grammar.index.min_tokens + extra
        outs = generate_many(model, [[1, 5], [1, 9, 9]], budget, eos_token_id=STOPS,
                             temperature=1.0, generator=torch.Generator().manual_seed(extra),
                             constraints=grammar)
        for tokens in outs:
            assert len(tokens) <= budget
            assert validate(json.loads(_text(tokens)), schema) == [], _text(tokens)


def test_a_budget_below_the_grammars_minimum_is_refused():
    grammar = constrain(TOOL_PARAMETERS[1], TOK)
    with pytest.raises(ValueError, match="needs at least"):
        generate_many(_tiny_model(), [[1, 5]], grammar.index.min_tokens - 1, constraints=grammar)


def test_the_tool_loop_under_the_grammar_never_writes_an_unreadable_call():
    from minimind_lib.inference.structured import tool_grammar
    from minimind_lib.tools import run_with_tools

    model = _tiny_model(6)
    grammar = tool_grammar(TOK)
    runs = [run_with_tools(model, TOK, [{"role": "user", "content": q}], tool_schemas(), 2,
                           max_new_tokens=80, temperature=1.0, constrain=grammar,
                           generator=torch.Generator().manual_seed(k))
            for k, q in enumerate(["What is 2+2?", "Weekday of 2024-01-01?", "Hi"])]
    assert all(run.errors == [] for run in runs)
    for call in (c for run in runs for c in run.calls):
        params = next(t["function"]["parameters"] for t in tool_schemas()
                      if t["function"]["name"] == call["name"])
        assert validate(call["arguments"], params) == []


def test_a_row_ends_with_its_own_stop_token_not_another_the_grammar_allows():
    """The grammar may end at <|im_end|> or <|endoftext|>; a row that stops only at
    <|im_end|> never gets <|endoftext|> (it would not stop, and the text would carry it)."""
    model = _tiny_model(7)
    eot = TOK.token_to_id("<|endoftext|>")
    with torch.no_grad():
        model.lm_head.bias[eot] = 50.0  # the model loves <|endoftext|>
    outs = generate_many(model, [[1, 5]] * 4, 40, eos_token_id=STOPS[0], temperature=1.0,
                         generator=torch.Generator().manual_seed(0),
                         constraints=constrain({"type": "boolean"}, TOK))
    for tokens in outs:
        assert eot not in tokens and tokens[-1] == STOPS[0]
        assert _text(tokens) in ("true", "false")
