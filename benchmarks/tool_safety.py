"""How long the safe executor takes to refuse each hostile call (issue: every hostile case
answers within a second, with an error message). Prints one row per case and the slowest.

    python benchmarks/tool_safety.py
"""

from __future__ import annotations

import json
import time

from minimind_lib.tools import execute_tool

CASES = [
    ("calculate", {"expression": "__import__('os').system('echo pwned')"}),
    ("calculate", {"expression": "9**9**9"}),
    ("calculate", {"expression": "99 ** 60"}),
    ("calculate", {"expression": "1" * 1_000_000}),
    ("calculate", {"expression": "(" * 1_000_000}),
    ("calculate", {"expression": "-" * 199 + "1"}),
    ("calculate", {"expression": "9" * 100 + " * " + "9" * 95}),
    ("calculate", "[" * 1_000_000),
    ("calculate", {"expression": ["1 + 1"]}),
    ("convert_units", {"value": 1e308, "from_unit": "mi", "to_unit": "mm"}),
    ("weekday", {"date": "9" * 1_000_000}),
    ("poem_author", {"title": "《" * 100_000}),
    ("no_such_tool", {}),
]


def main() -> None:
    execute_tool("poem_author", {"title": "静夜思"})  # the poem table is read once, first
    slowest = 0.0
    print("| tool | arguments | seconds | answer |\n|---|---|---:|---|")
    for name, arguments in CASES:
        start = time.perf_counter()
        answer = execute_tool(name, arguments)
        seconds = time.perf_counter() - start
        slowest = max(slowest, seconds)
        assert "error" in json.loads(answer), answer
        shown = json.dumps(arguments, ensure_ascii=False)[:40]
        print(f"| {name} | `{shown}` | {seconds:.4f} | {json.loads(answer)['error'][:60]} |")
    print(f"\nslowest refusal: {slowest:.4f} s over {len(CASES)} hostile calls")


if __name__ == "__main__":
    main()
