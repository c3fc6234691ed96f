"""The calculator's arithmetic (notebook 14): an expression is parsed (``ast.parse``, which only
builds a tree) and the tree is walked by hand, node by node, allowing numbers, + - * / // %
**, unary signs and parentheses, nothing else. Nothing the model writes is ever evaluated as
Python: a name, a call, an attribute or a string is an error naming it.

Every limit is checked *before* the work it bounds, so a hostile expression fails fast:
the text's length, the nesting depth, the digits of every number (read and computed), the
exponent, and a time budget over the whole walk.

>>> calculate("256 * 37")
'9472'
>>> calculate("(1.5 + 2.25) / 3")
'1.25'
>>> try:
...     calculate("__import__('os')")
... except CalculatorError as e:
...     print(e)
only numbers and + - * / // % ** ( ) are allowed; found a call (__import__)
"""

from __future__ import annotations

import ast
import math
import time
from decimal import Context, Decimal, DivisionByZero, InvalidOperation, Overflow, Underflow

MAX_CHARS = 200  # an expression a question needs is far shorter
MAX_DEPTH = 32  # nesting of operations (a parse tree this deep is already hostile)
MAX_DIGITS = 100  # of any number, read or computed
MAX_EXPONENT = 64  # |b| in a ** b
TIME_BUDGET_S = 0.5  # the whole walk; the limits above keep honest work far below it
#: decimals to 28 significant digits (Python's default), integers stay exact
CONTEXT = Context(prec=28, Emax=MAX_DIGITS, Emin=-MAX_DIGITS,
                  traps=[DivisionByZero, Overflow, Underflow, InvalidOperation])

Number = int | Decimal


class CalculatorError(ValueError):
    """An expression the calculator refuses; the message is what the model reads."""


_NODE_NAMES = {ast.Name: "a name", ast.Call: "a call", ast.Attribute: "an attribute",
               ast.Subscript: "an index", ast.Lambda: "a lambda", ast.Compare: "a comparison",
               ast.BoolOp: "and/or", ast.List: "a list", ast.Tuple: "a tuple",
               ast.Dict: "a dict", ast.JoinedStr: "an f-string", ast.IfExp: "a conditional"}


def _refuse(node: ast.AST) -> CalculatorError:
    what = _NODE_NAMES.get(type(node), type(node).__name__)
    if isinstance(node, ast.Constant):
        what = f"a {type(node.value).__name__} constant"
    name = node.func if isinstance(node, ast.Call) else node
    detail = f" ({name.id})" if isinstance(name, ast.Name) else ""
    return CalculatorError(f"only numbers and + - * / // % ** ( ) are allowed; found {what}"
                           f"{detail}")


def _digits(x: Number) -> int:
    """Digits left of the point (integers: all of them), without building a huge string."""
    if isinstance(x, int):  # at most ~2 x MAX_DIGITS digits here: every input was checked
        return len(str(abs(x)))
    return max(x.adjusted() + 1, 1) if x.is_finite() else MAX_DIGITS + 1


def _checked(x: Number) -> Number:
    if _digits(x) > MAX_DIGITS:
        raise CalculatorError(f"a number has more than {MAX_DIGITS} digits")
    return x


def _power(base: Number, exponent: Number) -> Number:
    if exponent != int(exponent):
        raise CalculatorError("only whole-number exponents are allowed")
    e = int(exponent)
    if abs(e) > MAX_EXPONENT:
        raise CalculatorError(f"the exponent {e} is beyond ±{MAX_EXPONENT}")
    if base == 0 and e < 0:  # 0 ** -1 is 1 / 0
        raise CalculatorError("division by zero")
    if base != 0 and abs(e) * math.log10(abs(float(base)) or 1) > MAX_DIGITS:
        raise CalculatorError(f"the result would have more than {MAX_DIGITS} digits")
    if e < 0 or isinstance(base, Decimal):
        return CONTEXT.power(Decimal(base), e)
    return base ** e


def _divide(a: Number, b: Number, floor: bool) -> Number:
    if b == 0:
        raise CalculatorError("division by zero")
    if isinstance(a, int) and isinstance(b, int) and (floor or a % b == 0):
        return a // b
    q = CONTEXT.divide(Decimal(a), Decimal(b))
    return CONTEXT.divide_int(Decimal(a), Decimal(b)) if floor else q


def _binary(op: ast.operator, a: Number, b: Number) -> Number:
    if isinstance(op, ast.Pow):
        return _power(a, b)
    if isinstance(op, (ast.Div, ast.FloorDiv)):
        return _divide(a, b, isinstance(op, ast.FloorDiv))
    if isinstance(op, ast.Mod):
        if b == 0:
            raise CalculatorError("modulo by zero")
        return a % b if isinstance(a, int) and isinstance(b, int) else \
            CONTEXT.remainder(Decimal(a), Decimal(b))
    if isinstance(a, Decimal) or isinstance(b, Decimal):
        exact = {ast.Add: CONTEXT.add, ast.Sub: CONTEXT.subtract, ast.Mult: CONTEXT.multiply}
        return exact[type(op)](Decimal(a), Decimal(b))
    return a + b if isinstance(op, ast.Add) else a - b if isinstance(op, ast.Sub) else a * b


_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)


def _walk(node: ast.AST, depth: int, deadline: float) -> Number:
    if depth > MAX_DEPTH:
        raise CalculatorError(f"the expression nests deeper than {MAX_DEPTH} levels")
    if time.monotonic() > deadline:
        raise CalculatorError(f"the expression took longer than {TIME_BUDGET_S} s")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if isinstance(node.value, float):  # the literal's own digits, not binary float's
            return _checked(Decimal(repr(node.value)))
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _walk(node.operand, depth + 1, deadline)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, _OPERATORS):
        a = _walk(node.left, depth + 1, deadline)
        b = _walk(node.right, depth + 1, deadline)
        try:
            return _checked(_binary(node.op, a, b))
        except (DivisionByZero, InvalidOperation, Overflow, Underflow) as e:
            raise CalculatorError(f"the arithmetic failed ({type(e).__name__})") from None
    raise _refuse(node)


def _format(x: Number) -> str:
    """Integers as themselves; decimals without exponent or trailing zeros (``1.25``)."""
    if isinstance(x, int):
        return str(x)
    if x == x.to_integral_value():
        return str(int(x))
    return format(x.normalize(), "f")


def calculate(expression: str) -> str:
    """The value of an arithmetic expression, as text; ``CalculatorError`` for anything else.

    >>> calculate("2 ** 10 - 24 // 5"), calculate("7 / 2"), calculate("-3 % 5")
    ('1020', '3.5', '2')
    """
    if not isinstance(expression, str):
        raise CalculatorError(f"the expression must be a string, got {type(expression).__name__}")
    text = expression.strip().replace("×", "*").replace("÷", "/")
    if not text:
        raise CalculatorError("the expression is empty")
    if len(text) > MAX_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalculatorError(f"cannot read {text!r} as arithmetic") from None
    return _format(_walk(tree.body, 0, time.monotonic() + TIME_BUDGET_S))
