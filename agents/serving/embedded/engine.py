"""The model behind the embedded engine: transformers on CPU, LoRA adapters through peft.

Concurrent requests are decoded together: one thread owns the model and, between steps, lets
waiting requests join and finished or cancelled ones leave. Each request has a row (slot) of a
preallocated KV cache (agents.serving.embedded.batchcache) that steps write in place. The requests
that arrived since the last step are prefilled together, in one forward pass of their prompts
left-padded to the longest (up to PREFILL_TOKENS padded tokens a pass; the rest wait one
decoding step, so running replies keep streaming), each after the longest stored beginning of
its prompt (the prefix cache; the opening prompts `warm` prefilled at start are kept there for
good, so the first conversation on a fresh engine prefills only its own part). Each decoding step is one forward pass over every running
request, with per-row positions, a 4-D mask of the columns each row may see and, once adapters
are loaded, peft's per-row `adapter_names`, so requests for different adapters share a step.
The step's tokens are sampled in one pass, each row with its temperature, top_p and seed
(agents.serving.embedded.decoding), so a piece of text leaves as soon as its token is chosen; replies
are decoded incrementally, stop sequences are checked on the decoded text, and a cancelled
request stops within one step. A request's `response_format` or forced `tool_choice` is a
Constraint (agents.serving.embedded.constraints) that masks its own row of each step's logits.

The linear layers' weights are laid out for a step's few rows (agents.serving.embedded.weights):
stored transposed for one row, packed by oneDNN for more. One request's step runs on
`threads`; a pass of several rows (a prefill, a step of two requests or more) on
`batch_threads`; either at most the cores other processes leave free (agents.serving.embedded.cpu), so
a busy neighbour slows the engine in proportion to the CPU it takes, not fifty-fold.

transformers' own continuous batching (`generate_batch`, ContinuousBatchingManager) is not
used: it packs all requests into one row, so peft cannot give them different adapters, and it
samples with one generator and one greedy/sampling switch for all; tried on this 2-core CPU
(transformers 5.24, SmolLM2-135M), `generate_batch` gave 8 requests 10 tokens/s in all, where
`generate` gave one request alone 15.
"""

import atexit
import ctypes
import ctypes.util
import inspect
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agents.llm.native_tools import HERMES, template_tool_style
from agents.serving.adapters import Adapter, find_adapters
from agents.serving.embedded.batchcache import BatchCache
from agents.serving.embedded.constraints import Constraint, Grammars
from agents.serving.embedded.cpu import CpuShare, threads_for
from agents.serving.embedded.decoding import Detokenizer, StopText, sample_rows
from agents.serving.embedded.weights import lay_out_linear_weights
from agents.serving.kvcache import cache_keyword
from agents.serving.protocol import ChatCompletionRequest, EngineError

log = logging.getLogger(__name__)
try:  # glibc, for malloc_trim; elsewhere freed memory is left to the allocator
    _malloc_trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
except (OSError, AttributeError):
    _malloc_trim = None

# What a request's `emit` receives, in order: STARTED (it has joined the batch, its adapter is
# loaded), text pieces, then END; an exception ends it instead when it cannot start or fails.
STARTED, END = object(), object()
BASE = "__base__"  # peft's name for "no adapter" in a mixed-adapter batch
MIN_PREFIX = 8  # shorter shared beginnings of prompts are prefilled again
# Prompt tokens whose KV cache `warm` keeps for good (the Domains' and arms' opening prompts,
# prefilled before the engine reports ready): 46 KB a token for SmolLM2-135M, so 377 MB at
# most. `make demo`'s studies need about 3,600 (166 MB: tau2 retail's 3,189, P4G's 308, the chat
# study's two), and 3,189 more per trained retail checkpoint; prompts beyond it are not kept.
WARM_TOKENS = 8192
# Padded prompt tokens one prefill pass may take: a bigger burst of arrivals is prefilled over
# several passes, a decoding step between each, so running replies keep streaming.
PREFILL_TOKENS = 2048
# A decoding step of this many rows or more runs on the batch threads, as a prefill pass does
# (bench/vllm_vs_embedded.py --only embedded, SmolLM2-135M on 2 cores, 2026-12-04 23:12 UTC,
# load 1.2-1.5, f3aaed1 with this threshold varied, three alternating runs each: at 8
# concurrent 207-212 tok/s from 2 rows against 171-173 from 24; at 16, 343-350 against
# 263-275). One request's step keeps `threads`: a core left to the event loop and the rest of
# the machine, where one row gained nothing from a second thread (bench/engine_steps.py).
WIDE_STEP = 2
# Seconds without a request after which the engine gives its KV cache slots back: a
# conversation's next turn comes later than that, and reallocating its slot costs
# milliseconds.
IDLE_RELEASE = 2.0


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
    native_tool_calls: bool = False  # read as the template's Hermes-style calls (tool_choice auto)
    completion_tokens: int = 0
    finish_reason: str | None = None  # "stop" (end of turn or stop sequence), "length", "abort"
    cached_tokens: int = 0  # prompt tokens taken from the prefix cache, not prefilled
    warm: bool = False  # a start-up warm-up: its prompt's KV cache is kept for good (Engine.warm)


class _Sequence:
    """A request inside the engine: its job, where its pieces go, and its decoding state."""

    def __init__(
        self, job: Generation, adapter, emit: Callable, cancel: threading.Event, detokenizer
    ):
        self.job, self.adapter, self.emit, self.cancel = job, adapter, emit, cancel
        self.key = BASE  # the peft adapter key its rows are computed with
        # the weights it runs with, which a kept prompt's KV cache depends on: BASE, or the
        # adapter's name and files' stamp (its peft key changes when it is loaded again)
        self.weights: str | tuple = BASE
        self.generator = torch.Generator().manual_seed(job.seed) if job.seed is not None else None
        self.stops = StopText(job.stop)
        self.text = detokenizer  # the reply's tokens (end-of-turn excluded) and their text
        self.cached = 0  # tokens of this request in the KV cache (its next position)
        self.next_input: int | None = None  # the sampled token the next step feeds
        self.started = self.done = False

    def start(self):
        self.started = True
        self.emit(STARTED)

    def fail(self, error: Exception):
        self.done = True
        self.emit(error)

    def finish(self, reason: str, flush: bool = True):
        if not self.started:  # cancelled before it joined: callers still see the usual order
            self.start()
        self.job.finish_reason = reason
        tail = self.stops.flush() if flush else ""
        if tail:
            self.emit(tail)
        self.done = True
        self.emit(END)


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
        max_batch: int = 32,
        prefix_cache: int = 8,
        warm_tokens: int = WARM_TOKENS,
        pack_weights: bool = True,
        threads: int | None = None,
        batch_threads: int | None = None,
        idle_release: float = IDLE_RELEASE,
    ):
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "config.json").is_file():
            raise FileNotFoundError(f"{self.model_dir} is not a Hugging Face model folder")
        self.name = served_name or self.model_dir.name
        self.adapters_root = Path(adapters_root) if adapters_root else None
        self.loras = list(loras)
        self.max_loras = max(1, max_loras)
        self.max_batch = max(1, max_batch)
        self.default_max_tokens = default_max_tokens
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        # HERMES: the template renders tools itself (Qwen3) and replies are parsed for its calls
        self.tool_style = template_tool_style(self.tokenizer)
        # prepare() runs beside the decoding thread; the Rust tokenizer must not be used by both
        self._tokenizer_lock = threading.Lock()
        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        self.model.eval()
        lay_out_linear_weights(self.model, pack=pack_weights)
        config = self.model.config
        self.max_model_len = min(max_model_len or 10**9, config.max_position_embeddings)
        self.end_ids = _end_ids(self.tokenizer, self.model)
        self.grammars = Grammars(self.tokenizer, config.vocab_size, self.end_ids)
        # The KV cache keyword of this transformers (agents/serving/kvcache.py); logits for the
        # last position only keep a long prompt's prefill from materialising prompt_len x vocab.
        parameters = inspect.signature(self.model.forward).parameters
        self._cache_kw = cache_keyword(self.model)
        self._last_logits = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}
        self._peft = False  # the model is wrapped by peft once an adapter is loaded
        self._loaded: OrderedDict[str, tuple[str, tuple]] = OrderedDict()  # name -> (key, stamp)
        self._retired: set[str] = set()  # replaced or evicted keys still used by a request
        self._keys = 0
        # The batch, owned by the decoding thread: its requests, request i in slot i of the
        # KV cache (up to max_batch slots; slots and columns grow by doubling as needed).
        self._running: list[_Sequence] = []
        # Slots are allocated as requests arrive (a burst's in one allocation) and all given
        # back once the engine has been idle `idle_release` seconds, with the freed heap: an
        # idle engine holds its weights and recent prompts, not 32 slots (377 MB for
        # SmolLM2-135M at start, 720 MB after a burst of 32; issue 36).
        self._cache = BatchCache(config, self.max_batch)
        self.idle_release = idle_release
        # torch threads for one request's decoding step (None: torch's count now), and for a
        # pass of several rows, a prefill or a step of WIDE_STEP requests or more (None: as for
        # one): several rows are compute that a second core speeds up (docs/serving.md).
        self.threads = threads or torch.get_num_threads()
        self.batch_threads = batch_threads or self.threads
        # what other processes leave of the cores, measured between passes: a pass takes no
        # more threads than that, so no thread waits for a core a neighbour holds
        self.cpu = CpuShare()
        # The KV cache of recent prompts, by adapter key and prompt: a new prompt starting with
        # one of them (the same system prompt, the next turn of a conversation) prefills only
        # the rest, as vLLM's prefix caching does. At most `prefix_cache` prompts are kept.
        self._prefixes: OrderedDict[tuple[str, tuple[int, ...]], list] = OrderedDict()
        self.prefix_cache = max(0, prefix_cache)
        # The prompts `warm` prefilled, by weights and prompt, never evicted by the ones above:
        # the first conversation of each served opening prompt prefills only its own part.
        self._warm: dict[tuple[str | tuple, tuple[int, ...]], list] = {}
        self.warm_tokens = max(0, warm_tokens)
        self._waiting: deque[_Sequence] = deque()
        self._admitting = 0  # taken from the line, not yet in the batch (being prefilled)
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="engine-batch", daemon=True)
        self._thread.start()
        atexit.register(self.close)  # end the thread before the interpreter tears torch down
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
        native = self.tool_style == HERMES
        if not native:
            # as vLLM for this model: it is served with a tool-call parser only for a template
            # that renders tools in the Hermes style (agents.serving.vllm), and refuses tools
            # without one, so a request means the same on both engines
            request.refuse_tools_without_parser()
        sampling = request.sampling_params()
        if sampling.max_tokens is not None and sampling.max_tokens > self.max_model_len:
            name = request.max_tokens_param
            raise EngineError(
                f"{name}={sampling.max_tokens} cannot be greater than "
                f"max_model_len={self.max_model_len}. Please request fewer output tokens.",
                param=name,
            )
        constraint, tool_calls = self.grammars.constraint(request)
        messages, tools = request.template_messages(native), request.template_tools()
        text = self._render(messages, tools)
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
            # as vLLM's auto tool choice: the model's own calls, parsed when tools are offered
            native_tool_calls=native and bool(tools) and request.tool_choice == "auto",
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

    def submit(
        self,
        job: Generation,
        adapter: Adapter | None,
        emit: Callable[[object], None],
        cancel: threading.Event,
    ):
        """Queue `job` for the batch; `emit` is called from the decoding thread (see STARTED).
        Setting `cancel` ends it (finish_reason "abort") at the next step, queued or running."""
        if self._closed:
            raise EngineError("The engine is shutting down.", status=500)
        sequence = _Sequence(job, adapter, emit, cancel, Detokenizer(self._decode))
        with self._wake:
            self._waiting.append(sequence)
            self._wake.notify()

    def load(self) -> tuple[int, int]:
        """(requests in the batch or joining it, requests waiting for a place), as vLLM's
        gauges count them; read from any thread (each count is read atomically)."""
        return len(self._running) + self._admitting, len(self._waiting)

    def generate(self, job: Generation, adapter: Adapter | None = None) -> str:
        """The whole reply, waiting for it (warm-up, scripts and tests)."""
        done = threading.Event()
        pieces: list = []

        def emit(item):
            pieces.append(item)
            if item is END or isinstance(item, BaseException):
                done.set()

        self.submit(job, adapter, emit, threading.Event())
        done.wait()
        if isinstance(pieces[-1], BaseException):
            raise pieces[-1]
        return "".join(piece for piece in pieces if isinstance(piece, str))

    def close(self):
        """Stop the decoding thread once the running requests are cancelled."""
        atexit.unregister(self.close)
        with self._wake:
            self._closed = True
            for sequence in [*self._running, *self._waiting]:
                sequence.cancel.set()
            self._wake.notify()
        self._thread.join(timeout=30)

    def _warm_up(self):
        """One short decode at start-up, so the first request does not pay for lazy set-up."""
        job = Generation(
            prompt_ids=self.tokenizer("Hello").input_ids, max_new_tokens=2, temperature=0
        )
        self.generate(job)

    def warm(self, requests: list[ChatCompletionRequest]) -> int:
        """Prefill each request's prompt (rendered as the request itself would be, so its
        tokens match) and keep its KV cache for good, up to `warm_tokens` tokens in all; a
        request whose model is not served, or that does not fit, is skipped with a warning.
        Called before the engine reports ready. Returns the tokens kept."""
        for request in requests:
            try:
                adapter = self.resolve(request.model)
                job = self.prepare(request)
            except EngineError as error:
                log.warning("Not warmed (%s): %s", request.model, error)
                continue
            job.max_new_tokens, job.temperature, job.constraint, job.warm = 1, 0.0, None, True
            self.generate(job, adapter)
        kept = sum(len(prompt) for _, prompt in self._warm)
        log.info("Warmed %d prompt(s), %d tokens kept", len(self._warm), kept)
        return kept

    # The decoding thread -------------------------------------------------------------------

    def _serve(self):
        while True:
            with self._wake:
                while not self._waiting and not self._running and not self._closed:
                    idle = self._cache.slots and self.idle_release is not None
                    if not self._wake.wait(self.idle_release if idle else None):
                        self._release()  # idle that long: give back what no request holds
                if self._closed and not self._waiting and not self._running:
                    return
                arrived = self._arrivals()
                self._admitting = len(arrived)  # counted as running while they prefill
                for sequence in [s for s in self._waiting if s.cancel.is_set()]:
                    self._waiting.remove(sequence)  # a cancelled request frees its place in line
                    sequence.finish("abort")
            try:
                self._admit([sequence for sequence in arrived if self._start(sequence)])
                self._admitting = 0
                self._leave()  # those whose first token ended them
                if self._running:
                    self._step()
                self._leave()
            except Exception as error:  # a failed step fails the batch, not the engine
                log.exception("Decoding step failed")
                for sequence in self._running:
                    if not sequence.done:
                        sequence.fail(error)
                self._running = []
                self._admitting = 0

    def _release(self):
        self._cache.release()
        release_freed_memory()

    def _arrivals(self) -> list[_Sequence]:
        """Waiting requests for the free slots, as many as one prefill pass takes (at least
        one): their number times the longest prompt within PREFILL_TOKENS."""
        arrived, longest = [], 0
        while self._waiting and len(self._running) + len(arrived) < self.max_batch:
            length = max(longest, len(self._waiting[0].job.prompt_ids))
            if arrived and (len(arrived) + 1) * length > PREFILL_TOKENS:
                break
            arrived.append(self._waiting.popleft())
            longest = length
        return arrived

    def _start(self, sequence: _Sequence) -> bool:
        """Load its adapter and tell its caller it has started; False when it cannot join."""
        if sequence.cancel.is_set():
            sequence.finish("abort")
            return False
        try:
            if sequence.adapter is not None:
                sequence.key = self._load(sequence.adapter)
                sequence.weights = (sequence.adapter.name, self._loaded[sequence.adapter.name][1])
        except Exception as error:  # an adapter that does not load
            sequence.fail(error)
            return False
        sequence.start()
        return True

    @torch.inference_mode()
    def _admit(self, arrived: list[_Sequence]):
        """Prefill the arrivals' prompts in one pass into the next free slots, choose their
        first tokens, and add their rows; a failed pass fails them, not the running batch."""
        if not arrived:
            return
        first = len(self._running)
        try:
            _use_threads(self._pass_threads(self.batch_threads))
            logits = self._prefill(arrived, first)
        except Exception as error:
            log.exception("Prefill failed")
            for sequence in arrived:
                sequence.fail(error)
            return
        self._running += arrived
        self._choose(list(enumerate(arrived)), logits)
        # kept once the first tokens are out: copying a long prompt's cache (147 MB for a tau2
        # prompt) took 0.5-1.5 s of the first token's time at load 11
        for row, sequence in enumerate(arrived):
            self._remember_prefix(sequence, sequence.job.prompt_ids, first + row)

    def _prefill(self, arrived: list[_Sequence], first: int) -> torch.Tensor:
        """The logits of each prompt's last position, [arrivals, vocab]. Each prompt's part
        after its stored beginning is left-padded to the longest such part; padding positions
        write to a column beyond every prompt (overwritten before any row reads it) and see
        only column 0, so they change nothing."""
        prompts = [sequence.job.prompt_ids for sequence in arrived]
        known = [
            self._reuse_prefix(sequence, prompt, first + row)
            for row, (sequence, prompt) in enumerate(zip(arrived, prompts, strict=True))
        ]
        width = max(len(prompt) for prompt in prompts)  # also the padding's column
        span = max(len(prompt) - k for prompt, k in zip(prompts, known, strict=True))
        inputs = torch.zeros(len(prompts), span, dtype=torch.long)
        columns = torch.full((len(prompts), span), width, dtype=torch.long)
        limits = torch.zeros(len(prompts), span, dtype=torch.long)  # last column each sees
        for row, (prompt, k) in enumerate(zip(prompts, known, strict=True)):
            pad = span - (len(prompt) - k)
            inputs[row, pad:] = torch.tensor(prompt[k:])
            columns[row, pad:] = limits[row, pad:] = torch.arange(k, len(prompt))
        positions = torch.where(columns == width, 0, columns)
        mask = torch.arange(width) <= limits[:, None, :, None]
        self._cache.select(first, columns, width)
        keys = [sequence.key for sequence in arrived]
        logits = self._forward(inputs, keys, position_ids=positions, attention_mask=mask)
        for row, (sequence, prompt) in enumerate(zip(arrived, prompts, strict=True)):
            sequence.cached = len(prompt)
            if sequence.job.warm:  # kept before its caller (Engine.warm) hears it has ended
                self._keep_warm(sequence.weights, prompt, first + row)
        return logits

    def _reuse_prefix(self, sequence: _Sequence, prompt: list[int], slot: int) -> int:
        """Fill the slot with the longest stored beginning of `prompt` (short of its last
        token, whose logits are needed) computed with the request's weights, recent or warmed;
        the number of tokens it holds."""
        best, states = 0, None
        stored = [(p, layers) for (k, p), layers in self._prefixes.items() if k == sequence.key]
        stored += [(p, layers) for (w, p), layers in self._warm.items() if w == sequence.weights]
        for beginning, layers in stored:
            common = _common_length(beginning, prompt, limit=len(prompt) - 1)
            if common > best:
                best, states = common, layers
        if best < MIN_PREFIX:
            return 0
        self._cache.write(slot, states, best)
        sequence.job.cached_tokens = best
        return best

    def _remember_prefix(self, sequence: _Sequence, prompt: list[int], slot: int):
        key = sequence.key
        if not self.prefix_cache or sequence.job.warm:  # a warm-up's prompt is kept apart
            return
        self._prefixes[key, tuple(prompt)] = self._cache.read(slot, len(prompt))
        self._prefixes.move_to_end((key, tuple(prompt)))
        while len(self._prefixes) > self.prefix_cache:
            self._prefixes.popitem(last=False)

    def _keep_warm(self, weights: str | tuple, prompt: list[int], slot: int):
        kept = sum(len(stored) for _, stored in self._warm)
        if kept + len(prompt) > self.warm_tokens:
            log.warning(
                "Not warmed: a prompt of %d tokens is beyond the %d kept (warm_tokens %d)",
                len(prompt),
                kept,
                self.warm_tokens,
            )
            return
        self._warm[weights, tuple(prompt)] = self._cache.read(slot, len(prompt))

    @torch.inference_mode()
    def _step(self):
        """One token for every running request, in one forward pass."""
        running = self._running
        inputs = torch.tensor([[sequence.next_input] for sequence in running])
        columns = torch.tensor([[sequence.cached] for sequence in running])
        width = int(columns.max()) + 1
        mask = torch.arange(width) <= columns[:, None, :, None]  # [rows, 1, 1, width]
        self._cache.select(0, columns, width)
        keys = [sequence.key for sequence in running]
        _use_threads(
            self._pass_threads(self.batch_threads if len(running) >= WIDE_STEP else self.threads)
        )
        logits = self._forward(inputs, keys, position_ids=columns, attention_mask=mask)
        for sequence in running:
            sequence.cached += 1
        # a cancelled request leaves below, without a token it will not send
        rows = [(row, s) for row, s in enumerate(running) if not s.cancel.is_set()]
        self._choose(rows, logits)

    def _pass_threads(self, asked: int) -> int:
        """The threads of the next pass: `asked`, or fewer while other processes keep cores."""
        return threads_for(asked, self.cpu.free())

    def _forward(self, input_ids, keys: list[str], **kwargs) -> torch.Tensor:
        """The logits of each row's last position, [rows, vocab]."""
        if self._peft:  # per-row adapters; BASE rows skip every LoRA layer
            kwargs["adapter_names"] = keys
        kwargs |= {self._cache_kw: self._cache, "use_cache": True, **self._last_logits}
        return self.model(input_ids=input_ids, **kwargs).logits[:, -1]

    def _choose(self, rows: list[tuple[int, _Sequence]], logits: torch.Tensor):
        """The next token of each (row, request), sampled in one pass, within its request's
        constraint if it has one (the mask changes only that row), then accepted."""
        if not rows:
            return
        for row, sequence in rows:
            if sequence.job.constraint is not None:
                sequence.job.constraint.mask(logits[row])
        jobs = [sequence.job for _, sequence in rows]
        tokens = sample_rows(
            logits[[row for row, _ in rows]],
            [job.temperature for job in jobs],
            [job.top_p for job in jobs],
            [sequence.generator for _, sequence in rows],
        )
        for (_, sequence), token in zip(rows, tokens, strict=True):
            if sequence.job.constraint is not None:
                sequence.job.constraint.accept(token)
            self._accept(sequence, token)

    def _decode(self, tokens: list[int]) -> str:
        with self._tokenizer_lock:
            return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def _accept(self, sequence: _Sequence, token: int):
        """Count the token, send the text it completes, and finish the request if it ends it."""
        job = sequence.job
        job.completion_tokens += 1
        if token in self.end_ids:
            sequence.finish("stop")
            return
        piece, stopped = sequence.stops.advance(sequence.text.add(token))
        if piece:
            sequence.emit(piece)
        if stopped:
            sequence.finish("stop", flush=False)
        elif job.completion_tokens >= job.max_new_tokens:
            sequence.finish("length")
        else:
            sequence.next_input = token

    @torch.inference_mode()
    def _leave(self):
        """Drop the rows of finished and cancelled requests: the rows after each move down
        into the freed slots, so the running requests stay in slots 0..n-1."""
        for sequence in self._running:
            if not sequence.done and sequence.cancel.is_set():
                sequence.finish("abort")
        keep = [i for i, sequence in enumerate(self._running) if not sequence.done]
        if len(keep) == len(self._running):
            return
        for slot, source in enumerate(keep):
            if source != slot:  # slot < source: the source has not been overwritten yet
                self._cache.move(source, slot, self._running[source].cached)
        self._running = [self._running[i] for i in keep]
        in_use = self._in_use()
        for key in [key for key in self._retired if key not in in_use]:
            self._retired.discard(key)
            self.model.delete_adapter(key)
        self._evict(in_use)

    # Adapters (loaded and unloaded by the decoding thread, between steps) -------------------

    def _in_use(self) -> set[str]:
        return {sequence.key for sequence in self._running}

    def _load(self, adapter: Adapter) -> str:
        """peft key of the adapter, loading it (again, if its files changed) when needed."""
        from peft import PeftModel

        stamp = _stamp(adapter.path)
        if adapter.name in self._loaded:
            key, loaded_stamp = self._loaded[adapter.name]
            if loaded_stamp == stamp:
                self._loaded.move_to_end(adapter.name)
                return key
            self._forget(adapter.name, self._in_use())
            # its files changed: what was warmed with the old weights is of no use any more
            for stored in [s for s in self._warm if s[0] == (adapter.name, loaded_stamp)]:
                del self._warm[stored]
        self._keys += 1
        key = f"adapter{self._keys}"  # peft keys become module names: no dots or slashes
        try:
            if isinstance(self.model, PeftModel):
                self.model.load_adapter(str(adapter.path), adapter_name=key)
            else:
                self.model = PeftModel.from_pretrained(
                    self.model, str(adapter.path), adapter_name=key
                )
                self._peft = True
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
        self._evict(self._in_use() | {key})
        return key

    def _evict(self, in_use: set[str]):
        """Keep memory bounded: unload the least recently used adapters beyond max_loras that
        no running request uses (the rest go when their requests end)."""
        idle = [name for name, (key, _) in self._loaded.items() if key not in in_use]
        for name in idle[: max(0, len(self._loaded) - self.max_loras)]:
            self._forget(name, in_use)

    def _forget(self, name: str, in_use: set[str]):
        key, _ = self._loaded.pop(name)
        for stored in [stored for stored in self._prefixes if stored[0] == key]:
            del self._prefixes[stored]
        if key in in_use:
            self._retired.add(key)
        else:
            self.model.delete_adapter(key)
        log.info("Unloaded adapter %s", name)


def release_freed_memory():
    """Hand the heap's free pages back to the system: glibc keeps what tensors below its
    mmap threshold freed (a threshold that rises to the largest block freed, up to 32 MB), so
    the cache's slots would still count in the engine's memory after they are dropped."""
    if _malloc_trim is not None:
        _malloc_trim(0)


def _use_threads(count: int):
    """torch's intra-op threads of the calling thread set to `count`, left so for the passes
    after (set only when it changes: a batch's steady steps switch nothing)."""
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)


def _common_length(a, b, limit: int) -> int:
    """How many tokens two prompts share from their start (at most `limit`)."""
    n = 0
    for x, y in zip(a, b, strict=False):  # prompts of any lengths
        if x != y or n == limit:
            break
        n += 1
    return n


def _end_ids(tokenizer, model) -> set[int]:
    ids = {tokenizer.eos_token_id}
    for source in (model.config, model.generation_config):
        value = getattr(source, "eos_token_id", None)
        ids.update(value if isinstance(value, list) else [value])
    return {i for i in ids if i is not None}


def _stamp(folder: Path) -> tuple:
    """Changes when the adapter's files do (a checkpoint rewritten in place)."""
    return tuple(sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file()))
