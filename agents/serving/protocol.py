"""The embedded engine's OpenAI wire format, declared as pydantic models after vLLM 0.32's
(vllm/entrypoints/openai/chat_completion/protocol.py, vllm/entrypoints/serve/engine/protocol.py).

Requests: what the engine honours is declared, and every other field is refused with a 400
naming it (`refuse_unsupported`) unless it cannot change the reply (`user`, `metadata`, ...) or
holds its neutral value (`logprobs: false`, `presence_penalty: 0`), so a caller never gets a
reply that silently ignored what it asked. `response_format` (json_object, json_schema, and
vLLM's structural_tag) is enforced by constrained decoding (agents.serving.embedded.constraints).
`tools` are taken as vLLM takes them when agents.serving.vllm serves the same model: a template
that renders tools in the Hermes style (Qwen3's) is served with `--tool-call-parser hermes`, so
here it gets the tools and the conversation's calls structured, its reply's `<tool_call>` blocks
are answered as `tool_calls` by the rule of vLLM's hermes parser (agents.llm.native_tools), and
`tool_choice` "required" or a named function is enforced by constrained decoding (calls in that
format, answered as `tool_calls`). A template that renders no tools (SmolLM2's) has no parser:
tools with any tool_choice but "none" are vLLM's 400 (`refuse_tools_without_parser`); callers
use agents.llm's JSON tool format, whose `structured` variant keeps calls well formed.

Errors have vLLM's body, `{"error": {"message", "type", "param", "code"}}`, and its two kinds:
  - a body that does not fit the declared models is answered as vLLM's FastAPI layer answers a
    RequestValidationError: 400, type "Bad Request", param the field's path ("body.temperature"),
    message "1 validation error:\n  {...}";
  - a well-formed request the engine refuses (sampling bounds, unknown model, context length) is
    answered as vLLM's serving layer does: type "BadRequestError" / "NotFoundError" /
    "InternalServerError", param the parameter's name.
"""

import time
import uuid
from http import HTTPStatus
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_serializer,
    model_validator,
)

from agents.llm.tool_format import render_tool_calls

INT64 = 2**63


class OpenAIBaseModel(BaseModel):
    # OpenAI's API allows fields a server does not know; vLLM accepts and ignores them too
    model_config = ConfigDict(extra="allow")


# Errors ------------------------------------------------------------------------------------


class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIBaseModel):
    error: ErrorInfo


# vLLM's serving layer names an error by its kind (vllm/entrypoints/serve/exception_handling)
SERVING_ERRORS = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}


class EngineError(Exception):
    """A request the engine answers with an error: its status and vLLM's ErrorResponse body.

    `kind` defaults to the serving layer's name for the status; framework errors (a body that
    does not validate, an unknown route) pass the HTTP phrase, as vLLM's FastAPI handlers do."""

    def __init__(
        self, message: str, *, status: int = 400, param: str | None = None, kind: str = ""
    ):
        super().__init__(message)
        self.status = status
        kind = kind or SERVING_ERRORS.get(status) or HTTPStatus(status).phrase
        self.response = ErrorResponse(
            error=ErrorInfo(message=message, type=kind, param=param, code=status)
        )

    def body(self) -> dict:
        return self.response.model_dump()


class ParamError(ValueError):
    """Raised inside a model validator to name the parameter at fault (vLLM's
    VLLMValidationError), which then becomes the error's `param`."""

    def __init__(self, message: str, parameter: str):
        super().__init__(message)
        self.parameter = parameter


def http_error(status: int, detail: str) -> EngineError:
    return EngineError(detail, status=status, kind=HTTPStatus(status).phrase)


def invalid_body(error: ValidationError) -> EngineError:
    """A body that does not fit the models, worded as vLLM words a RequestValidationError."""
    errors = error.errors(include_url=False)
    param = next(
        (
            e["ctx"]["error"].parameter
            for e in errors
            if isinstance(e.get("ctx", {}).get("error"), ParamError)
        ),
        None,
    )
    param = param or _body_path(errors[0]["loc"] if errors else ())
    return _bad_request([{**e, "loc": _body_path(e["loc"])} for e in errors], param)


def _bad_request(errors: list, param: str | None) -> EngineError:
    label = "error" if len(errors) == 1 else "errors"
    lines = "".join(f"\n  {_shown(error)}" for error in errors[:10])
    more = f"\n  ...and {len(errors) - 10} more {label}" if len(errors) > 10 else ""
    message = f"{len(errors)} validation {label}:{lines}{more}"
    return EngineError(message, param=param, kind=HTTPStatus.BAD_REQUEST.phrase)


def _shown(error) -> str:
    """One validation error as vLLM prints it, with the offending input kept short."""
    if isinstance(error, dict) and "input" in error:
        value = error["input"]
        if isinstance(value, bytes):
            value = f"<bytes of {len(value)} bytes>"
        elif isinstance(value, list | dict | tuple):
            value = f"<{type(value).__name__} of {len(value)} items>"
        elif isinstance(value, str) and len(value) > 200:
            value = value[:200] + "...[truncated]"
        error = {**error, "input": value}
    return str(error)


# pydantic's names for the branches of a union ("str", "list[TextPart]", "function-after[...]")
_BRANCHES = {"str", "int", "float", "bool", "list", "dict", "none", "tuple"}


def _body_path(loc) -> str:
    """A pydantic error location as vLLM's `param`: "body.messages.0.role"."""
    parts = ["body"] + [
        str(part)
        for part in loc
        if isinstance(part, int) or (str(part).isidentifier() and str(part) not in _BRANCHES)
    ]
    return ".".join(parts)


# Requests ----------------------------------------------------------------------------------


class TextPart(OpenAIBaseModel):
    type: Literal["text"]
    text: str


class ChatMessageParam(OpenAIBaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[dict[str, Any]] | None = (
        None  # an assistant turn's calls, as OpenAI sends them
    )
    tool_call_id: str | None = None

    def for_template(self, native_tools: bool = False) -> dict:
        """The message as the chat template takes it: a system/user/assistant/tool role and
        text, an assistant's tool calls written as the `<tool_call>` blocks the model reads (or,
        `native_tools`, left structured for a template that renders them itself)."""
        content = self.content if isinstance(self.content, str) else ""
        if isinstance(self.content, list):
            content = "".join(part.text for part in self.content)
        if self.role == "assistant" and self.tool_calls and native_tools:
            return {"role": "assistant", "content": content, "tool_calls": self.tool_calls}
        if self.role == "assistant" and self.tool_calls:
            blocks = render_tool_calls(self.tool_calls)
            content = f"{content}\n{blocks}" if content else blocks
        return {"role": "system" if self.role == "developer" else self.role, "content": content}


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = False


class FunctionDefinition(OpenAIBaseModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ChatCompletionToolsParam(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionName(OpenAIBaseModel):
    name: str


class NamedToolChoice(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: FunctionName


class JsonSchemaResponseFormat(OpenAIBaseModel):
    name: str
    description: str | None = None
    # OpenAI's key is "schema", which pydantic's BaseModel reserves: aliased, as vLLM does
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenAIBaseModel):
    """OpenAI's `response_format`, plus vLLM's structural tag (xgrammar's `format`)."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaResponseFormat | None = None
    format: dict[str, Any] | None = None  # structural_tag only

    @model_validator(mode="after")
    def needs_its_part(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ParamError(
                "When response_format type is 'json_schema', the 'json_schema' field must be "
                "provided.",
                "response_format",
            )
        if self.type == "structural_tag" and self.format is None:
            # vLLM's older {"structures", "triggers"} form is not taken: one form, one grammar
            raise ParamError(
                "A structural_tag response_format needs its 'format' (xgrammar's structural "
                "tag); the legacy 'structures'/'triggers' form is not supported.",
                "response_format",
            )
        return self


# Fields a request may carry that cannot change the reply: accepted and ignored, as vLLM does.
IGNORED_FIELDS = frozenset(
    {"user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"}
)
# Fields the engine does not implement, accepted only at the value that asks for nothing.
NEUTRAL_VALUES = {
    "logprobs": (False,),
    "top_logprobs": (0,),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "logit_bias": ({},),
    "skip_special_tokens": (True,),  # what the engine does
    "modalities": (["text"],),
}


class SamplingParams(BaseModel):
    """What one generation samples with. The bounds are vLLM's (SamplingParams._verify_args)
    except n, which is 1 here: the engine writes one choice."""

    n: int = Field(1, ge=1, le=1)
    temperature: float = Field(1.0, ge=0, le=2)  # OpenAI's default; 0 means greedy
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)  # None: the engine's default budget
    seed: int | None = None
    stop: list[Annotated[str, Field(min_length=1)]] = []


class ChatCompletionRequest(OpenAIBaseModel):
    # in the order of OpenAI's API reference, as vLLM's
    messages: Annotated[list[ChatMessageParam], Field(min_length=1)]
    model: str
    max_tokens: int | None = None
    max_completion_tokens: int | None = None  # wins over max_tokens
    n: int | None = 1
    seed: int | None = Field(None, ge=-INT64, lt=INT64)
    stop: str | list[str] | None = []
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[ChatCompletionToolsParam] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    # forced calls: several only when true (OpenAI's default is true; a small model repeats its
    # call to the end of its budget, so this engine's default is one)
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None

    @model_validator(mode="before")
    @classmethod
    def check_tool_usage(cls, data):
        """vLLM's checks of tool_choice against tools (its default: "auto" when tools are given)."""
        if not isinstance(data, dict):
            return data
        choice = data.get("tool_choice")
        if choice is None and data.get("tools"):
            data = {**data, "tool_choice": "auto"}
        elif choice is not None and choice != "none":
            if not data.get("tools"):
                raise ParamError("When using `tool_choice`, `tools` must be set.", "tool_choice")
            if isinstance(choice, dict):
                name = (choice.get("function") or {}).get("name")
                names = [
                    (tool.get("function") or {}).get("name")
                    for tool in data["tools"]
                    if isinstance(tool, dict)
                ]
                if name not in names:
                    raise ParamError(
                        f"The tool specified in `tool_choice` ({name!r}) does not match any of "
                        f"the specified `tools`: {names}.",
                        "tool_choice",
                    )
        return data

    @model_validator(mode="before")
    @classmethod
    def stream_options_need_stream(cls, data):
        if isinstance(data, dict) and data.get("stream_options") and not data.get("stream"):
            raise ParamError(
                "Stream options can only be defined when `stream=True`.", "stream_options"
            )
        return data

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def max_tokens_param(self) -> str:
        """The name the request gave its reply budget under (error messages use it)."""
        return "max_tokens" if self.max_completion_tokens is None else "max_completion_tokens"

    def refuse_unsupported(self) -> None:
        """A 400 naming the fields this engine would otherwise silently ignore."""
        refused = sorted(
            name
            for name, value in (self.model_extra or {}).items()
            if name not in IGNORED_FIELDS
            and value is not None
            and value not in NEUTRAL_VALUES.get(name, ())
        )
        if refused:
            listed = ", ".join(f"`{name}`" for name in refused)
            raise EngineError(
                f"The embedded engine does not support {listed}. It honours: "
                f"{', '.join(sorted(type(self).model_fields))}.",
                param=refused[0],
            )

    def refuse_tools_without_parser(self) -> None:
        """vLLM's 400 (its words) for tools it cannot serve: one started without
        `--tool-call-parser` (SmolLM2's template renders no tools) takes them only with
        tool_choice "none". The rest of the message says what to use instead."""
        choice = self.tool_choice
        if not self.tools or choice in (None, "none"):
            return
        if choice == "auto":
            message = (
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                "to be set"
            )
        elif choice == "required":
            message = 'tool_choice="required" requires --tool-call-parser to be set'
        else:
            message = f'tool_choice=function "{choice.function.name}" requires --tool-call-parser to be set'
        raise EngineError(
            f"{message}. (This model's chat template renders no tools, so neither vLLM nor the "
            "embedded engine parses tool calls for it: use agents.llm's 'json' or "
            "'structured' tool format.)"
        )

    @property
    def forces_tool_calls(self) -> bool:
        return self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice)

    def template_messages(self, native_tools: bool = False) -> list[dict]:
        return [message.for_template(native_tools) for message in self.messages]

    def template_tools(self) -> list[dict] | None:
        return [tool.model_dump(exclude_none=True) for tool in self.tools] if self.tools else None

    def sampling_params(self) -> SamplingParams:
        """The sampling settings, checked against their bounds (vLLM's BadRequestError)."""
        stop = [self.stop] if isinstance(self.stop, str) else self.stop or []
        max_tokens = self.max_completion_tokens
        max_tokens = self.max_tokens if max_tokens is None else max_tokens
        values = {
            "n": 1 if self.n is None else self.n,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "max_tokens": max_tokens,
            "seed": self.seed,
            "stop": stop,
        }
        try:
            return SamplingParams(**values)
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            name = str(first["loc"][0])
            shown = self.max_tokens_param if name == "max_tokens" else name
            raise EngineError(
                f"{shown}: {first['msg']}, got {values[name]!r}.", param=shown
            ) from error


def parse_chat_request(content_type: str | None, raw: bytes) -> ChatCompletionRequest:
    """The request body as a ChatCompletionRequest, or the 400 vLLM gives for it."""
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":  # as vLLM's validate_json_request
        raise _bad_request(["Unsupported Media Type: Only 'application/json' is allowed"], None)
    try:
        request = ChatCompletionRequest.model_validate_json(raw)
    except ValidationError as error:
        raise invalid_body(error) from error
    request.refuse_unsupported()
    return request


# Responses ---------------------------------------------------------------------------------


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int = 0

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> "UsageInfo":
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


class FunctionCall(OpenAIBaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(OpenAIBaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaToolCall(ToolCall):
    index: int


class ChatMessage(OpenAIBaseModel):
    role: str = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] = []


class ChatCompletionResponseChoice(OpenAIBaseModel):
    index: int = 0
    message: ChatMessage
    logprobs: None = None
    finish_reason: str | None = "stop"


class _Reply(OpenAIBaseModel):
    """What a whole reply and each chunk of a streamed one begin with."""

    id: str = Field(default_factory=completion_id)
    created: int = Field(default_factory=now)
    model: str


class ChatCompletionResponse(_Reply):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo


class DeltaMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None

    @model_serializer(mode="wrap")
    def _only_what_changed(self, handler):
        # a delta carries only what it adds: {"content": "..."}, and {} at the end
        return {key: value for key, value in handler(self).items() if value is not None}


class ChatCompletionResponseStreamChoice(OpenAIBaseModel):
    index: int = 0
    delta: DeltaMessage
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionStreamResponse(_Reply):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = None  # only on the last chunk, when asked for

    @model_serializer(mode="wrap")
    def _usage_when_given(self, handler):
        data = handler(self)
        if data.get("usage") is None:
            data.pop("usage", None)
        return data


class ModelCard(OpenAIBaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "parley"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(OpenAIBaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard] = []


# vLLM's Prometheus gauges of the scheduler's load, by the same names, so that one probe reads
# both engines (a request whose client hung up leaves `running` within a step on both).
GAUGES = {
    "num_requests_running": "Number of requests in model execution batches.",
    "num_requests_waiting": "Number of requests waiting to be processed.",
}


def metrics(model: str, *, running: int, waiting: int) -> str:
    values = {"num_requests_running": running, "num_requests_waiting": waiting}
    lines = []
    for name, help_text in GAUGES.items():
        lines += [
            f"# HELP vllm:{name} {help_text}",
            f"# TYPE vllm:{name} gauge",
            f'vllm:{name}{{model_name="{model}"}} {float(values[name])}',
        ]
    return "\n".join(lines) + "\n"


def sse(data: BaseModel | str) -> bytes:
    """One server-sent event: a model as compact JSON, or a literal such as "[DONE]"."""
    payload = data if isinstance(data, str) else data.model_dump_json()
    return f"data: {payload}\n\n".encode()
