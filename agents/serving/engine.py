"""The model behind the embedded engine: transformers on CPU, LoRA adapters through peft.

Decoding is a plain loop over the KV cache, one token per step, so each piece of text leaves
as soon as its token is sampled, a cancelled request stops within one step, and stop
sequences are checked on the decoded text. Callers serialise requests (one at a time): the
model and its active adapter are shared state. A request's `response_format` or forced
`tool_choice` is a Constraint (agents.serving.constraints) that masks each step's logits.
"""

import inspect
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from agents.llm.tool_format import messages_for_json_tools, partial_suffix
from agents.serving.adapters import Adapter, find_adapters
from agents.serving.constraints import Constraint, Grammars
from agents.serving.protocol import ChatCompletionRequest, EngineError

log = logging.getLogger(__name__)


@dataclass
class Generation:
    """One request's decoding: its inputs, then what happened."""

    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    constraint: Constraint | None = None  # response_format / forced tool_choice, or None
    tool_calls: bool = False  # the text is read as JSON-format tool calls (a forced tool_choice)
    completion_tokens: int = 0
    finish_reason: str | None = None  # "stop" (end of turn or stop sequence), "length", "abort"


class Engine:
    def __init__(
        self,
        model_dir: Path,
        served_name: str | None = None,
        adapters_root: Path | None = None,
        loras: list[Adapter] = (),
        max_loras: int = 4,
        max_model_len: int | None = None,
        default_max_tokens: int = 1024,
    ):
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "config.json").is_file():
            raise FileNotFoundError(f"{self.model_dir} is not a Hugging Face model folder")
        self.name = served_name or self.model_dir.name
        self.adapters_root = Path(adapters_root) if adapters_root else None
        self.loras = list(loras)
        self.max_loras = max(1, max_loras)
        self.default_max_tokens = default_max_tokens
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        # prepare() runs beside a generation; the Rust tokenizer must not be used by both at once
        self._tokenizer_lock = threading.Lock()
        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        self.model.eval()
        config = self.model.config
        self.max_model_len = min(max_model_len or 10**9, config.max_position_embeddings)
        self.end_ids = _end_ids(self.tokenizer, self.model)
        self.grammars = Grammars(self.tokenizer, config.vocab_size, self.end_ids)
        # transformers 5 renamed past_key_values to cache; logits for the last position only
        # keep a long prompt's prefill from materialising prompt_len x vocab logits.
        parameters = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in parameters else "past_key_values"
        self._last_logits = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}
        self._loaded: OrderedDict[str, tuple[str, tuple]] = OrderedDict()  # name -> (key, stamp)
        self._keys = 0
        self._warm_up()

    # Names ---------------------------------------------------------------------------------

    def adapters(self) -> dict[str, Adapter]:
        adapters = find_adapters(self.adapters_root, self.loras)
        adapters.pop(self.name, None)  # the base model's name is never an adapter
        return adapters

    def resolve(self, model: str) -> Adapter | None:
        """The adapter serving `model`, None for the base model; 404 for an unknown name."""
        if model == self.name:
            return None
        adapter = self.adapters().get(model)
        if adapter is None:
            raise EngineError(f"The model `{model}` does not exist.", status=404, param="model")
        return adapter

    # Requests ------------------------------------------------------------------------------

    def prepare(self, request: ChatCompletionRequest) -> Generation:
        """Check the sampling settings, render the chat template and fit the reply into the
        context, as vLLM does: a budget beyond the model's length, or a prompt that fills it,
        is a 400; a budget beyond the room the prompt leaves is cut to that room."""
        sampling = request.sampling_params()
        if sampling.max_tokens is not None and sampling.max_tokens > self.max_model_len:
            name = request.max_tokens_param
            raise EngineError(
                f"{name}={sampling.max_tokens} cannot be greater than "
                f"max_model_len={self.max_model_len}. Please request fewer output tokens.",
                param=name,
            )
        constraint, tool_calls = self.grammars.constraint(request)
        messages, tools = request.template_messages(), request.template_tools()
        text = self._render(messages, tools)
        if request.forces_tool_calls and text == self._render(messages, None):
            # the template ignores tools (SmolLM2's): describe them in the format the grammar
            # forces, or the model would call tools it was never shown
            text = self._render(messages_for_json_tools(messages, tools), None)
        with self._tokenizer_lock:
            prompt_ids = self.tokenizer(text, add_special_tokens=False).input_ids
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise EngineError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your prompt contains {len(prompt_ids)} input tokens, which exceeds this limit "
                f"even without any output tokens. Please reduce the length of the input prompt.",
                param="input_tokens",
            )
        return Generation(
            prompt_ids=prompt_ids,
            max_new_tokens=min(sampling.max_tokens or self.default_max_tokens, room),
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=sampling.seed,
            stop=sampling.stop,
            constraint=constraint,
            tool_calls=tool_calls,
        )

    def _render(self, messages: list[dict], tools: list[dict] | None) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=True
            )
        except Exception as error:  # a template that rejects the conversation
            raise EngineError(
                f"The chat template could not render these messages: {error}"
            ) from error

    @contextmanager
    def serving(self, adapter: Adapter | None):
        """The model with `adapter` active (loaded on first use), or with adapters disabled."""
        if adapter is None:
            disabled = self.model.disable_adapter() if self._loaded else nullcontext()
            with disabled:
                yield
            return
        key = self._load(adapter)
        self.model.set_adapter(key)
        yield

    def decode(self, job: Generation, cancel: threading.Event) -> Iterator[str]:
        """Yields text pieces as tokens are sampled; fills job.completion_tokens/finish_reason."""
        generator = torch.Generator().manual_seed(job.seed) if job.seed is not None else None
        cache = DynamicCache(config=self.model.config)
        inputs = torch.tensor([job.prompt_ids])
        stops = _StopText(job.stop)
        tokens: list[int] = []
        while True:
            if cancel.is_set():
                job.finish_reason = "abort"
                return
            token = self._step(inputs, cache, job, generator)
            job.completion_tokens += 1
            if token in self.end_ids:
                job.finish_reason = "stop"
                break
            tokens.append(token)
            with self._tokenizer_lock:
                text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            piece, stopped = stops.advance(text)
            if piece:
                yield piece
            if stopped:
                job.finish_reason = "stop"
                return
            if job.completion_tokens >= job.max_new_tokens:
                job.finish_reason = "length"
                break
            inputs = torch.tensor([[token]])
        tail = stops.flush()
        if tail:
            yield tail

    @torch.inference_mode()
    def _step(self, inputs, cache, job: Generation, generator) -> int:
        kwargs = {self._cache_kw: cache, "use_cache": True, **self._last_logits}
        logits = self.model(input_ids=inputs, **kwargs).logits[0, -1]
        if job.constraint is not None:
            job.constraint.mask(logits)
        token = sample(logits, job.temperature, job.top_p, generator)
        if job.constraint is not None:
            job.constraint.accept(token)
        return token

    def _warm_up(self):
        """One short decode at start-up, so the first request does not pay for lazy set-up."""
        job = Generation(
            prompt_ids=self.tokenizer("Hello").input_ids, max_new_tokens=2, temperature=0
        )
        for _ in self.decode(job, threading.Event()):
            pass

    # Adapters ------------------------------------------------------------------------------

    def _load(self, adapter: Adapter) -> str:
        """peft key of the adapter, loading it (again, if its files changed) when needed."""
        from peft import PeftModel

        stamp = _stamp(adapter.path)
        if adapter.name in self._loaded:
            key, loaded_stamp = self._loaded[adapter.name]
            if loaded_stamp == stamp:
                self._loaded.move_to_end(adapter.name)
                return key
            self._forget(adapter.name)
        self._keys += 1
        key = f"adapter{self._keys}"  # peft keys become module names: no dots or slashes
        try:
            if isinstance(self.model, PeftModel):
                self.model.load_adapter(str(adapter.path), adapter_name=key)
            else:
                self.model = PeftModel.from_pretrained(
                    self.model, str(adapter.path), adapter_name=key
                )
            self.model.eval()
        except Exception as error:
            if isinstance(self.model, PeftModel) and key in self.model.peft_config:
                self.model.delete_adapter(key)  # drop what was half loaded
            raise EngineError(
                f"Could not load the LoRA adapter `{adapter.name}` from {adapter.path}: {error}",
                param="model",
            ) from error
        log.info("Loaded adapter %s from %s", adapter.name, adapter.path)
        self._loaded[adapter.name] = (key, stamp)
        while len(self._loaded) > self.max_loras:  # keep memory bounded: drop the least recent
            self._forget(next(iter(self._loaded)))
        return key

    def _forget(self, name: str):
        key, _ = self._loaded.pop(name)
        self.model.delete_adapter(key)
        log.info("Unloaded adapter %s", name)


def sample(logits: torch.Tensor, temperature: float, top_p: float, generator=None) -> int:
    """Greedy at temperature 0; otherwise nucleus sampling from softmax(logits / temperature)."""
    if temperature == 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1:
        sorted_probs, order = probs.sort(descending=True)
        # keep the smallest set of tokens whose probability reaches top_p
        sorted_probs[sorted_probs.cumsum(-1) - sorted_probs > top_p] = 0
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))


class _StopText:
    """Turns the growing decoded text into safe pieces: text that might still become a stop
    sequence, or ends inside a multi-byte character, is held back until it is decided."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.text = ""
        self.sent = 0

    def advance(self, text: str) -> tuple[str, bool]:
        self.text = text
        hits = [
            i
            for i in (text.find(stop, max(0, self.sent - len(stop))) for stop in self.stops)
            if i >= 0
        ]
        if hits:
            return self._emit(min(hits)), True
        hold = max((partial_suffix(text, stop) for stop in self.stops), default=0)
        end = len(text) - hold
        while end > self.sent and text[end - 1] == "\ufffd":  # an incomplete UTF-8 character
            end -= 1
        return self._emit(end), False

    def flush(self) -> str:
        return self._emit(len(self.text))

    def _emit(self, end: int) -> str:
        piece = self.text[self.sent : end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return piece


def _end_ids(tokenizer, model) -> set[int]:
    ids = {tokenizer.eos_token_id}
    for source in (model.config, model.generation_config):
        value = getattr(source, "eos_token_id", None)
        ids.update(value if isinstance(value, list) else [value])
    return {i for i in ids if i is not None}


def _stamp(folder: Path) -> tuple:
    """Changes when the adapter's files do (a checkpoint rewritten in place)."""
    return tuple(sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file()))
