"""Local stand-ins on 127.0.0.1 for hosted providers, answering as they do (agents/llm/providers.py
says what parley sends each). Both pop scripted replies as tests/support/scripted_server.py does and
record every request body, refused ones included.

    GPT5Server       OpenAI's GPT-5 family: HTTP 400 with OpenAI's error body to `max_tokens`,
                     to a temperature other than 1 and to `top_p` (the bodies are OpenAI's, as
                     its API returns them); the shaped request is answered
    AnthropicServer  Anthropic's OpenAI-compatible endpoint: `response_format` is accepted and
                     ignored, so a choice turn gets whatever text is scripted
"""

from starlette.requests import Request
from starlette.responses import JSONResponse

from tests.support.scripted_server import ScriptedServer


def openai_error(message: str, param: str, code: str) -> JSONResponse:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return JSONResponse({"error": error}, status_code=400)


class GPT5Server(ScriptedServer):
    def __init__(self, replies: list[dict], models=("gpt-5-mini",)):
        super().__init__(replies, models=models)
        self.refused: list[dict] = []  # the bodies answered 400

    async def complete(self, request: Request):
        body = await request.json()
        refusal = self.refusal(body)
        if refusal is None:
            return await super().complete(request)
        self.refused.append(body)
        return refusal

    @staticmethod
    def refusal(body: dict) -> JSONResponse | None:
        if "max_tokens" in body:
            return openai_error(
                "Unsupported parameter: 'max_tokens' is not supported with this model."
                " Use 'max_completion_tokens' instead.",
                "max_tokens",
                "unsupported_parameter",
            )
        if "temperature" in body and body["temperature"] != 1:
            return openai_error(
                f"Unsupported value: 'temperature' does not support {body['temperature']} with"
                " this model. Only the default (1) value is supported.",
                "temperature",
                "unsupported_value",
            )
        if "top_p" in body:
            return openai_error(
                "Unsupported parameter: 'top_p' is not supported with this model.",
                "top_p",
                "unsupported_parameter",
            )
        return None


class AnthropicServer(ScriptedServer):
    """ScriptedServer already ignores `response_format`; named for what it stands in for."""

    def __init__(self, replies: list[dict], models=("claude-haiku-4-5",)):
        super().__init__(replies, models=models)
