"""``calculator(expression: str)``: safe arithmetic for the ``calc_tool`` task.

The expression is parsed with :mod:`ast` and only numbers, ``+ - * / // % **``, unary signs and
parentheses are evaluated -- never ``eval``. Sizes are bounded so a model cannot make the tool hang:
at most :data:`MAX_EXPRESSION_CHARS` characters, exponents up to :data:`MAX_EXPONENT`, results up to
:data:`MAX_ABS_RESULT` in magnitude.

Results are formatted for a small context: integers (and floats with an integral value) without a
decimal point, other floats rounded to 6 significant digits.
"""

from __future__ import annotations

import ast
import operator
from typing import Any, Union

from asyncrl.agent_loop.tools.base import BaseTool, ToolError, register_tool

Number = Union[int, float]

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_ABS_RESULT = 10**30

_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}

CALCULATOR_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
"""OpenAI tool schema (kept short: the embedded model's prompt renders it character by character)."""


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ToolError(f"exponent {right} too large (max {MAX_EXPONENT})")
        try:
            value = _BINOPS[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        if isinstance(value, complex):
            raise ToolError("complex result")
        if abs(value) > MAX_ABS_RESULT:
            raise ToolError("result too large")
        return value
    raise ToolError(f"unsupported syntax: {type(node).__name__}")


def safe_eval(expression: str) -> Number:
    """Evaluate an arithmetic expression without ``eval``.

    Args:
        expression: e.g. ``"123*45+6"``; digits, ``+ - * / // % **``, parentheses, spaces.

    Returns:
        The value (``int`` when every operation stays integral, else ``float``).

    Raises:
        ToolError: empty / too long / not arithmetic / division by zero / too large.
    """
    if not isinstance(expression, str) or not expression.strip():
        raise ToolError("expression must be a non-empty string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ToolError(f"invalid expression: {expression!r}") from None
    return _eval(tree)


def format_number(value: Number) -> str:
    """``5535`` for integral values (``5535.0`` too), else 6 significant digits (``0.333333``)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value) if isinstance(value, int) else f"{value:.6g}"


@register_tool
class CalculatorTool(BaseTool):
    """``calculator(expression: str) -> str`` returning the formatted value (or raising ToolError)."""

    name = "calculator"
    schema = CALCULATOR_SCHEMA

    async def execute(self, arguments: dict[str, Any]) -> str:
        """Raises: ToolError on a missing/extra argument or an invalid expression."""
        unknown = set(arguments) - {"expression"}
        if unknown:
            raise ToolError(f"unexpected arguments {sorted(unknown)}; expected 'expression'")
        if "expression" not in arguments:
            raise ToolError("missing required argument 'expression'")
        return format_number(safe_eval(arguments["expression"]))
