"""Constrained decoding for the embedded engine: a request's `response_format` or `tool_choice`
as an xgrammar grammar that masks each step's logits, as vLLM's structured outputs do.

    grammars = Grammars(tokenizer, vocab_size, end_ids)      # one per engine
    constraint = grammars.constraint(request)                # None when nothing is asked
    # each decoding step:  constraint.mask(logits); token = sample(logits); constraint.accept(token)

What is enforced:
  - response_format {"type": "json_object"}: any JSON object; {"type": "json_schema", ...}: that
    schema; {"type": "structural_tag", "format": ...}: xgrammar's structural tag, as vLLM takes
    it (agents.llm.tool_format's `structured` tool format sends one);
  - tool_choice "required" or a named function (taken only for a template with Hermes-style
    tools, as vLLM: agents.serving.protocol): only `<tool_call>` blocks of agents.llm's JSON
    tool format whose arguments match the tool's schema (tool_format.tool_call_format, the one
    builder vLLM requests use too). "auto" and "none" leave the text free.
"""

import json
import threading
from dataclasses import dataclass

import torch

from agents.llm.tool_format import tool_call_format
from agents.serving.protocol import ChatCompletionRequest, EngineError


class Constraint:
    """One request's grammar state while it decodes."""

    def __init__(self, compiled, vocab_size: int):
        import xgrammar

        self._xgrammar = xgrammar
        self.matcher = xgrammar.GrammarMatcher(compiled)
        self.bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)

    def mask(self, logits: torch.Tensor) -> None:
        """Set the logits of tokens the grammar does not allow next to -inf, in place."""
        self.matcher.fill_next_token_bitmask(self.bitmask)
        self._xgrammar.apply_token_bitmask_inplace(logits.view(1, -1), self.bitmask)

    def accept(self, token_id: int) -> None:
        if not self.matcher.accept_token(token_id):  # only a masking bug could get here
            raise RuntimeError(f"token {token_id} does not fit the request's grammar")

    def is_terminated(self) -> bool:
        """The grammar is complete and its end token accepted: nothing more may follow."""
        return self.matcher.is_terminated()


@dataclass(frozen=True)
class Asked:
    """What a request asks the output to be: a grammar (in one of xgrammar's inputs) and
    whether its text is to be read as tool calls."""

    kind: str  # "json_object", "json_schema", "structural_tag"
    spec: str = ""  # the schema or structural tag, as JSON
    tool_calls: bool = False


def asked(request: ChatCompletionRequest) -> Asked | None:
    """The constraint a request asks for, or None; a 400 for one that cannot be honoured."""
    forced = request.forces_tool_calls
    response_format = request.response_format
    if forced and response_format is not None and response_format.type != "text":
        raise EngineError(
            "response_format cannot be combined with tool_choice 'required' or a named "
            "function: the reply is then tool calls.",
            param="response_format",
        )
    if forced:
        choice = request.tool_choice
        choice = choice if isinstance(choice, str) else choice.model_dump()
        tools = [tool.model_dump(exclude_none=True) for tool in request.tools or []]
        # several calls only when asked for: a small model otherwise repeats its call until
        # the token budget runs out, and the reply ends on "length"
        parallel = bool(request.parallel_tool_calls)
        tag = {"type": "structural_tag", "format": tool_call_format(tools, choice, parallel)}
        return Asked("structural_tag", json.dumps(tag), tool_calls=True)
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return Asked("json_object")
    if response_format.type == "json_schema":
        return Asked("json_schema", json.dumps(response_format.json_schema.json_schema))
    tag = {"type": "structural_tag", "format": response_format.format}
    return Asked("structural_tag", json.dumps(tag))


class Grammars:
    """The engine's grammar compiler (its vocabulary and a cache of compiled grammars)."""

    def __init__(self, tokenizer, vocab_size: int, end_ids: set[int]):
        self.tokenizer, self.vocab_size, self.end_ids = tokenizer, vocab_size, end_ids
        self._compiler = None
        self._lock = threading.Lock()  # prepare() runs on worker threads

    def compiler(self):
        import xgrammar

        with self._lock:
            if self._compiler is None:
                info = xgrammar.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=sorted(self.end_ids)
                )
                self._compiler = xgrammar.GrammarCompiler(info)
            return self._compiler

    def constraint(self, request: ChatCompletionRequest) -> tuple[Constraint | None, bool]:
        """(the request's constraint or None, whether its text is tool calls)."""
        wanted = asked(request)
        if wanted is None:
            return None, False
        compiler = self.compiler()
        try:
            if wanted.kind == "json_object":
                compiled = compiler.compile_builtin_json_grammar()
            elif wanted.kind == "json_schema":
                compiled = compiler.compile_json_schema(wanted.spec)
            else:
                compiled = compiler.compile_structural_tag(wanted.spec)
        except Exception as error:  # xgrammar's InvalidJSONError, RuntimeError, ...
            raise EngineError(
                f"The {wanted.kind} constraint cannot be compiled: {error}",
                param="tool_choice" if wanted.tool_calls else "response_format",
            ) from error
        return Constraint(compiled, self.vocab_size), wanted.tool_calls
