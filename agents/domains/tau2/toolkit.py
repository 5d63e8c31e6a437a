"""What the retail and airline toolkits share: tool declaration, OpenAI schemas, error capture,
and the two generic tools (calculate, transfer_to_human_agents).

A tool is a method with the official name and argument names. It returns a str, a record or a
list; it raises on any error, and `run` turns the exception into the text "Error: ..." for the
agent, exactly where and after whatever changes the official tool would have made.
"""

from __future__ import annotations

import ast
import json
import operator
from dataclasses import dataclass
from typing import Any

from .store import Store

READ, WRITE, GENERIC = "read", "write", "generic"


@dataclass(frozen=True)
class ToolSpec:
    name: str
    kind: str  # read / write / generic
    schema: dict[str, Any]


def tool(kind: str, description: str, **params: dict[str, Any]):
    """Declare a tool; every parameter is required, as in tau2."""

    def mark(method):
        method.tool_spec = ToolSpec(
            name=method.__name__,
            kind=kind,
            schema={
                "type": "function",
                "function": {
                    "name": method.__name__,
                    "description": description,
                    "parameters": {
                        "type": "object",
                        "properties": params,
                        "required": list(params),
                    },
                },
            },
        )
        return method

    return mark


def string(description: str) -> dict:
    return {"type": "string", "description": description}


def integer(description: str) -> dict:
    return {"type": "integer", "description": description}


def choice(description: str, *values: str) -> dict:
    return {"type": "string", "enum": list(values), "description": description}


def array(description: str, items: dict) -> dict:
    return {"type": "array", "items": items, "description": description}


def obj(**fields: dict) -> dict:
    return {"type": "object", "properties": fields, "required": list(fields)}


def to_content(result: Any) -> str:
    """A tool result as the agent sees it: strings as they are, anything else as JSON."""
    return result if isinstance(result, str) else json.dumps(result, default=str)


class Toolkit:
    """Tools over one Store. Subclasses add the domain's tools."""

    specs: dict[str, ToolSpec] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        found = {}
        for klass in reversed(cls.__mro__):
            for name, member in vars(klass).items():
                if hasattr(member, "tool_spec"):
                    found[name] = member.tool_spec
        cls.specs = dict(sorted(found.items()))

    def __init__(self, store: Store):
        self.db = store

    @classmethod
    def schemas(cls) -> list[dict[str, Any]]:
        return [spec.schema for spec in cls.specs.values()]

    @classmethod
    def is_write(cls, name: str) -> bool:
        spec = cls.specs.get(name)
        return spec is not None and spec.kind == WRITE

    def run(self, name: str, arguments: Any) -> tuple[str, bool]:
        """(content, is_error). Never raises: a bad call is an error message for the agent."""
        if name not in self.specs:
            return f"Error: Tool '{name}' not found.", True
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                return f"Error: tool arguments are not valid JSON ({exc})", True
        if not isinstance(arguments, dict):
            return "Error: tool arguments must be a JSON object", True
        try:
            return to_content(getattr(self, name)(**arguments)), False
        except Exception as exc:  # the official environment turns every exception into text
            return f"Error: {exc}", True

    # -- generic tools ----------------------------------------------------------------------

    @tool(
        GENERIC,
        "Evaluate an arithmetic expression and return the result rounded to 2 decimals.",
        expression=string("Numbers, + - * /, parentheses and spaces, e.g. '(12.5 + 3) * 2'."),
    )
    def calculate(self, expression: str) -> str:
        if not all(char in "0123456789+-*/(). " for char in expression):
            raise ValueError("Invalid characters in expression")
        return str(round(float(arithmetic(expression)), 2))

    @tool(
        GENERIC,
        "Hand the customer over to a human agent with a summary of their issue. Use it only when "
        "the customer asks for a human, or when policy and tools cannot resolve the request.",
        summary=string("A short summary of the customer's issue."),
    )
    def transfer_to_human_agents(self, summary: str) -> str:
        return "Transfer successful"


_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def arithmetic(expression: str) -> float | int:
    """What Python would compute for the expression (tau2 calls eval on it), without eval, and
    with a bound on powers so a model cannot stall the server with 9**9**9."""

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](walk(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and (
                abs(right) > 1000 or abs(left) > 1e6 and abs(right) > 10
            ):
                raise ValueError("Exponent too large")
            return _OPS[type(node.op)](left, right)
        raise ValueError("Invalid expression")

    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"Invalid expression: {exc.msg}") from None
    return walk(tree)
