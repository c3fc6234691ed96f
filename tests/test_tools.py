"""The course's tools: exact answers, the safe executor against hostile arguments (nothing is
ever evaluated as code; every refusal is a message, never an exception), the schemas, and
reading calls back out of a model's text."""

from __future__ import annotations

import ast
import builtins
import json

import pytest
import torch

from minimind_lib.tokenizer import apply_chat_template, load_tokenizer
from minimind_lib.tools import TOOLS, execute_tool, parse_tool_calls, run_with_tools, tool_schemas
from minimind_lib.tools.arithmetic import CalculatorError, calculate

TOK = load_tokenizer()


def result(name, arguments):
    return json.loads(execute_tool(name, arguments))


@pytest.mark.parametrize("expression,want", [
    ("256 * 37", "9472"), ("12345678901234567890 + 1", "12345678901234567891"),
    ("(12.5 + 3) * 4", "62"), ("0.1 + 0.2", "0.3"), ("7 / 2", "3.5"), ("-7 // 2", "-4"),
    ("2 ** 64", "18446744073709551616"), ("2 ** -2", "0.25"), ("10 % 4", "2"),
    ("1 / 3", "0.3333333333333333333333333333"), ("3 × 4 ÷ 6", "2"), (" -(+5) ", "-5"),
])
def test_the_calculator_is_exact(expression, want):
    assert calculate(expression) == want
    assert result("calculate", {"expression": expression}) == {"result": want}


@pytest.mark.parametrize("expression,error", [
    ("__import__('os')", "found a call (__import__)"),
    ("__import__('os').system('echo pwned')", "found a call"),
    ("().__class__.__bases__[0].__subclasses__()", "found a call"),
    ("open('/etc/passwd').read()", "found a call"),
    ("9**9**9", "exponent 387420489 is beyond"),
    ("2 ** 0.5", "whole-number exponents"),
    ("99 ** 60", "more than 100 digits"),
    ("1" * 150, "more than 100 digits"),
    ("1" * 1_000_000, "longer than 200 characters"),
    ("-" * 50 + "1", "nests deeper than 32"), ("((((1))))", None),
    ("1e400", "more than 100 digits"),
    ("1 / 0", "division by zero"), ("5 % 0", "modulo by zero"),
    ("x + 1", "found a name (x)"), ("'a' * 3", "found a str constant"),
    ("lambda: 1", "found a lambda"), ("[1] * 9", "found a list"),
    ("1 if 2 else 3", "found a conditional"), ("1 < 2", "found a comparison"),
    ("", "empty"), ("1 +", "cannot read"), ("1e-300 * 2", "Underflow"),
])
def test_hostile_expressions_are_refused_by_message(expression, error, monkeypatch):
    # nothing may reach Python's own evaluation, whatever the expression says: eval and exec
    # are gone, and compile may only build a syntax tree (ast.parse's use of it)
    def forbidden(*args, **kwargs):
        raise AssertionError("eval/exec reached")
    real_compile = builtins.compile

    def tree_only(source, filename, mode, flags=0, *args, **kwargs):
        assert flags & ast.PyCF_ONLY_AST, "compile asked for code, not a syntax tree"
        return real_compile(source, filename, mode, flags, *args, **kwargs)
    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    monkeypatch.setattr(builtins, "compile", tree_only)
    if error is None:  # parentheses are not nesting: the tree is one number
        assert calculate(expression) == "1"
        return
    with pytest.raises(CalculatorError, match=error.replace("(", r"\(").replace(")", r"\)")):
        calculate(expression)
    assert error in result("calculate", {"expression": expression})["error"]


@pytest.mark.parametrize("name,arguments,error", [
    ("rm", {"path": "/"}, "unknown tool 'rm'"),
    (None, {}, "unknown tool None"),
    ("calculate", {}, "needs the argument 'expression'"),
    ("calculate", {"expression": 42}, "expression must be a string, got int"),
    ("calculate", {"expression": "1", "shell": "ls"}, "has no argument 'shell'"),
    ("calculate", "[1, 2]", "must be a JSON object, got list"),
    ("calculate", "{oops", "not valid JSON"),
    ("calculate", "[" * 100_000, "longer than 2000 characters"),
    ("calculate", "[" * 1999, "not valid JSON"),
    ("convert_units", {"value": True, "from_unit": "m", "to_unit": "cm"}, "must be a number"),
    ("convert_units", {"value": 1, "from_unit": "m", "to_unit": "kg"}, "cannot convert length"),
    ("convert_units", {"value": 1, "from_unit": "parsec", "to_unit": "m"}, "not a unit I know"),
    ("convert_units", {"value": 1e300, "from_unit": "m", "to_unit": "cm"}, "within"),
    ("days_between", {"start": "2026-02-30", "end": "2026-03-01"}, "not a date"),
    ("weekday", {"date": "x" * 10_000}, "not a date"),
    ("poem_author", {"title": "不存在的诗"}, "no poem titled"),
    ("poem_author", {"title": ["静夜思"]}, "must be a string, got list"),
])
def test_bad_calls_come_back_as_the_message_the_model_reads(name, arguments, error):
    answer = result(name, arguments)
    assert set(answer) == {"error"} and error in answer["error"], answer


@pytest.mark.parametrize("name,arguments,want", [
    ("convert_units", {"value": 3, "from_unit": "ft", "to_unit": "cm"}, "91.44"),
    ("convert_units", {"value": 100, "from_unit": "C", "to_unit": "F"}, "212"),
    ("convert_units", {"value": -40, "from_unit": "F", "to_unit": "C"}, "-40"),
    ("convert_units", {"value": 1.5, "from_unit": "h", "to_unit": "min"}, "90"),
    ("convert_units", {"value": 2, "from_unit": "mi", "to_unit": "km"}, "3.218688"),
    ("days_between", {"start": "2024-02-28", "end": "2024-03-01"}, 2),  # a leap year
    ("days_between", {"start": "2026-12-03", "end": "2026-01-01"}, -336),
    ("weekday", {"date": "2000-01-01"}, "Saturday"),
    ("poem_author", {"title": "《静夜思》"}, "李白"),
])
def test_the_other_tools_answer_exactly(name, arguments, want):
    assert result(name, arguments) == {"result": want}
    assert result(name, json.dumps(arguments)) == {"result": want}  # arguments as a JSON string


def test_schemas_are_openai_functions_and_render_in_minimind3s_template():
    schemas = tool_schemas()
    assert [s["function"]["name"] for s in schemas] == list(TOOLS)
    for s in schemas:
        assert s["type"] == "function"
        params = s["function"]["parameters"]
        assert params["type"] == "object" and params["required"] == list(params["properties"])
    assert tool_schemas(["weekday"]) == [TOOLS["weekday"].schema()]
    with pytest.raises(ValueError, match="unknown tool"):
        tool_schemas(["rm"])
    text = apply_chat_template([{"role": "user", "content": "3 ft in cm?"}], True, tools=schemas)
    assert text.count('"name": "') == len(TOOLS) and "<tools>" in text


def test_calls_are_read_from_the_models_text():
    text = ("<think>\nfeet to cm\n</think>\n\nConverting.\n<tool_call>\n"
            '{"name": "convert_units", "arguments": {"value": 3, "from_unit": "ft", '
            '"to_unit": "cm"}}\n</tool_call>\n<tool_call>\n{"name": "weekday", '
            '"arguments": "{\\"date\\": \\"2026-12-03\\"}"}\n</tool_call>')
    reply = parse_tool_calls(text)
    assert reply.reasoning == "feet to cm" and reply.content == "Converting."
    assert reply.calls == [
        {"name": "convert_units", "arguments": {"value": 3, "from_unit": "ft", "to_unit": "cm"}},
        {"name": "weekday", "arguments": {"date": "2026-12-03"}}]
    assert [execute_tool(c["name"], c["arguments"]) for c in reply.calls] == [
        '{"result": "91.44"}', '{"result": "Thursday"}']


@pytest.mark.parametrize("text,error", [
    ("<tool_call>{oops</tool_call>", "not valid JSON"),
    ("<tool_call>[1]</tool_call>", 'needs a "name" string'),
    ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', '"arguments" must be an object'),
    ('<tool_call>{"name": "f", "arguments": "{x"}</tool_call>', "is a string but not JSON"),
    ("<tool_call>" + "[" * 3000 + "</tool_call>", "nested too deeply"),
    ("<tool_call>" + "x" * 5000, "longer than 4000"),  # cut off before </tool_call>
])
def test_malformed_calls_are_reported_not_raised(text, error):
    reply = parse_tool_calls("ok " + text)
    assert reply.calls == [] and len(reply.errors) == 1 and error in reply.errors[0]
    assert reply.content == "ok"


def test_a_reply_without_calls_is_its_content():
    reply = parse_tool_calls("Paris is the capital of France.")
    assert (reply.content, reply.calls, reply.errors) == ("Paris is the capital of France.",
                                                          [], [])
    many = parse_tool_calls('<tool_call>{"name": "f"}</tool_call>' * 10)
    assert len(many.calls) == 8 and "more than 8" in many.errors[0]


# --- the loop ------------------------------------------------------------------------------


class Scripted(torch.nn.Module):
    """A stand-in model that writes the given replies, one per call of ``generate``, and
    records each prompt it was given."""

    def __init__(self, replies):
        super().__init__()
        self.replies, self.prompts = list(replies), []
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.config = type("Config", (), {"max_position_embeddings": 4096})()

    def generate(self, input_ids, max_new_tokens, eos_token_id=None, **kwargs):
        self.prompts.append(TOK.decode(input_ids[0].tolist()))
        reply = TOK.encode(self.replies.pop(0)) + [TOK.token_to_id("<|im_end|>")]  # markers
        return torch.cat([input_ids, torch.tensor([reply])], dim=1)             # as special ids


CALL = ('<tool_call>\n{"name": "calculate", "arguments": {"expression": "256 * 37"}}\n'
        '</tool_call>')


def test_the_loop_runs_the_call_and_feeds_the_result_back():
    model = Scripted(["Let me compute.\n" + CALL, "256 × 37 = 9472."])
    run = run_with_tools(model, TOK, [{"role": "user", "content": "256 乘以 37？"}],
                         tool_schemas(["calculate"]))
    assert run.answered and run.rounds == 2 and run.answer == "256 × 37 = 9472."
    assert run.calls == [{"name": "calculate", "arguments": {"expression": "256 * 37"},
                          "result": '{"result": "9472"}'}]
    assert [m["role"] for m in run.messages] == ["user", "assistant", "tool", "assistant"]
    # the second prompt: the tools block, the call as the model wrote it, the result
    assert "<tools>" in model.prompts[1] and CALL in model.prompts[1]
    assert '<tool_response>\n{"result": "9472"}\n</tool_response>' in model.prompts[1]


def test_the_loop_reports_bad_calls_and_stops_after_max_rounds():
    hostile = CALL.replace("256 * 37", "__import__('os').system('ls')")
    model = Scripted([hostile, "<tool_call>{oops</tool_call>", hostile])
    run = run_with_tools(model, TOK, [{"role": "user", "content": "hi"}], max_rounds=3)
    assert not run.answered and run.rounds == 3 and len(run.calls) == 2
    assert all("found a call" in c["result"] for c in run.calls)  # never run
    assert run.errors == ["tool call 1 is not valid JSON (Expecting property name enclosed "
                          "in double quotes)"]
    assert "not valid JSON" in json.loads(run.messages[4]["content"])["error"]
    with pytest.raises(ValueError, match="max_rounds must be at least 1"):
        run_with_tools(model, TOK, [{"role": "user", "content": "hi"}], max_rounds=0)


def test_the_loop_runs_a_real_model_to_the_end():
    from tiny import tiny_model

    model = tiny_model(max_position_embeddings=512).train()
    run = run_with_tools(model, TOK, [{"role": "user", "content": "3 ft in cm?"}],
                         tool_schemas(["convert_units"]), max_rounds=2, max_new_tokens=8)
    assert 1 <= run.rounds <= 2 and run.messages[1]["role"] == "assistant"
    assert model.training  # the loop leaves the model's mode as it found it
    short = tiny_model(max_position_embeddings=64)
    assert "leaves no room" in run_with_tools(short, TOK, [{"role": "user", "content": "x"}],
                                              max_new_tokens=8).errors[0]


def test_the_terminal_chat_shows_calls_results_and_the_answer():
    import io

    from minimind_lib.inference.chat import tool_chat_loop

    model = Scripted(["use the calculator\n</think>\n\n" + CALL, "9472.", "hi!"])  # after <think>
    lines, out = iter(["256 * 37?", "", "/reset", "hello", "/exit"]), io.StringIO()
    tool_chat_loop(model, TOK, think=True, read=lambda _: next(lines), out=out)
    text = out.getvalue()
    assert '  (thinking) use the calculator\n  call: calculate({"expression": "256 * 37"})\n' \
           '  result: {"result": "9472"}\nminimind> 9472.\n' in text
    assert "(not sent: the message is empty)" in text and "(conversation cleared)" in text
    assert text.rstrip().endswith("minimind> hi!")
    assert "<tool_response>" not in model.prompts[2]  # /reset forgot the first exchange
    assert model.prompts[0].endswith("<|im_start|>assistant\n<think>\n")  # thinking on


# --- issue 49: answers the tools gave to questions they should refuse -------------------------


def test_zero_to_a_negative_power_is_a_division_by_zero():
    assert json.loads(execute_tool("calculate", {"expression": "0**-1"})) == {
        "error": "division by zero"}
    assert json.loads(execute_tool("calculate", {"expression": "0**0"})) == {"result": "1"}


@pytest.mark.parametrize("date", ["20200101", "2020-W01-1", "2020-1-5", "2020-01-01T00:00",
                                  " 2020-001"])
def test_dates_must_be_written_yyyy_mm_dd(date):
    assert "YYYY-MM-DD" in json.loads(execute_tool("weekday", {"date": date}))["error"]
    assert json.loads(execute_tool("weekday", {"date": "2020-01-01"})) == {"result": "Wednesday"}
