"""Models in this process: a frozen LocalModel that samples, and a trainable Policy.

A Policy is the base model with a LoRA adapter (peft) or, with finetune = "full", every weight
trainable. Its reference for the KL term is the same model with the adapter disabled (LoRA) or
a frozen copy of the base (full), so LoRA runs never hold a second model. Under FSDP a full
Policy's reference copy is sharded too and gathered, on its own, for the reference passes.

Under FSDP (training/rl/distributed.py) a Policy's `model` stays the unwrapped model, whose weights
are then shards: what uses it directly (sampling, the reference pass, evaluation, saving and
loading weights) runs inside `gathered()`, entered by every rank together; the update's own
passes go through the FSDP wrapper (`sharded`). Gathering holds the whole model on each rank
while it lasts: a model large enough to need FSDP should sample on an endpoint (vLLM).

With mixed_precision (and a 16-bit `dtype`) a Policy's weights, gradients and AdamW state are
float32, as Megatron's master weights are, and its passes compute in `dtype`: under
`compute()` (autocast) on the unwrapped model, through FSDP's MixedPrecision in the wrapper.
Frozen models (LocalModel, a full fine-tuning reference copy) stay in `dtype`.
"""

from __future__ import annotations

import copy
import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LogitsProcessorList,
)

from training.config_schema import LoraSpec, RunConfig
from training.rl.choices import Choices, choice_logprobs
from training.rl.distributed import full_weights
from training.rl.grpo import update
from training.rl.logprobs import TokenBatch, token_logprobs
from training.rl.sampling import (
    KVCache,
    choice_logprobs_reusing,
    plain_cache_model,
    sample_reusing,
)
from training.rl.tokens import ChatFormat, Transcript, one_weight_version
from training.vocabulary import DTYPES

FSDP_PREFIX = "_fsdp_wrapped_module."  # in parameter names under FSDP's per-layer units
# the vocabulary names each dtype as torch does
TORCH_DTYPES = {name: getattr(torch, name) for name in DTYPES}
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def load_base(path: str | Path, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"no Hugging Face model folder at {path} (for SmolLM2 run `python -m agents.serving.prepare`)"
        )
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=TORCH_DTYPES[dtype]).to(device)
    model.eval()
    return model, tokenizer


class LocalModel:
    """A causal LM with its tokenizer and chat format, sampling batches of token-id prompts."""

    frozen = True  # its weights never change, so choice distributions can be remembered
    compute_dtype: torch.dtype | None = None  # mixed_precision: its passes' dtype (Policy)
    # sample through training/rl/sampling.py (prefixes and carried caches reused); False: through
    # transformers' generate, the old path (kept to compare against: bench/rollout_reuse.py)
    reuse_kv = True

    def __init__(self, model: Any, tokenizer: Any):
        self.model, self.tokenizer = model, tokenizer
        self.fmt = ChatFormat(tokenizer)
        eos = model.generation_config.eos_token_id
        stops = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        stops.add(tokenizer.eos_token_id)
        if self.fmt.turn_end and self.fmt.turn_end[0] in tokenizer.all_special_ids:
            stops.add(self.fmt.turn_end[0])  # ChatML's <|im_end|> ends a turn even if eos differs
        self.stop_ids = sorted(s for s in stops if s is not None)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.stop_ids[0]
        end = self.fmt.turn_end[0] if self.fmt.turn_end else None
        self.turn_stop = end if end in self.stop_ids else self.stop_ids[0]
        self._choices: dict[tuple[str, ...], Choices] = {}
        self._remembered: dict[tuple, list[float]] = {}
        self.counts = {"prefilled": 0}  # prompt tokens run in prefill passes (padding included)
        self._plain_cache: bool | None = None

    @classmethod
    def load(cls, path: str | Path, dtype: str = "float32", device: str = "cpu", adapter: str = ""):
        model, tokenizer = load_base(path, dtype, device)
        if adapter:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, adapter).merge_and_unload().eval()
        return cls(model, tokenizer)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def compute(self) -> Any:
        """Where its forward passes run: under mixed_precision, autocast to the run's `dtype`
        over the float32 weights (sampling, choice and reference log-probs, the update's passes
        on the unwrapped model); otherwise in the weights' own dtype."""
        if self.compute_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    @torch.no_grad()
    def sample(
        self,
        prompts: list[list[int]],
        temperature: float,
        max_new_tokens: int,
        logits_processor: Any = None,
        caches: list[KVCache] | None = None,
    ) -> list[list[int]]:
        """One sampled continuation per prompt, cut after the first stop token, which is kept:
        the model produced it and is trained on it. With `reuse_kv` (training/rl/sampling.py)
        a prompt starts from its cache in `caches` (one per prompt: its Transcript's) or from a
        prefix it shares with the other prompts; the draws are generate's, in its order."""
        if self.reusing and temperature > 0:
            with self.compute():
                return sample_reusing(
                    self, prompts, temperature, max_new_tokens, logits_processor, caches
                )
        return self.generate(prompts, temperature, max_new_tokens, logits_processor)

    @property
    def reusing(self) -> bool:
        """Whether sampling and choice turns go through training/rl/sampling.py."""
        if self._plain_cache is None:
            self._plain_cache = plain_cache_model(self.model)
        return self.reuse_kv and self._plain_cache

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        temperature: float,
        max_new_tokens: int,
        logits_processor: Any = None,
    ) -> list[list[int]]:
        """The old path: the prompts left-padded into one batch through transformers'
        generate, each prefilled whole."""
        self.counts["prefilled"] += len(prompts) * max(len(p) for p in prompts)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            attention[i, width - len(p) :] = 1
        config = GenerationConfig(
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
        )
        processors = LogitsProcessorList([logits_processor] if logits_processor else [])
        with self.compute():  # mixed precision: 16-bit passes over the float32 weights
            out = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=attention.to(self.device),
                generation_config=config,
                logits_processor=processors,
                # Under FSDP transformers would sync every decoding step across ranks (an
                # all_reduce of "unfinished"): sampling runs on gathered weights, to each rank's
                # own lengths, and on rank 0 alone in held-out evaluation, where that sync never
                # returns.
                synced_gpus=False,
            )
        samples = []
        for row in out[:, width:].tolist():
            cut = next((i + 1 for i, t in enumerate(row) if t in self.stop_ids), len(row))
            samples.append(row[:cut])
        return samples

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def choices(self, texts: list[str]) -> Choices:
        key = tuple(texts)
        if key not in self._choices:
            self._choices[key] = Choices.build(texts, self.fmt.encode, self.turn_stop)
        return self._choices[key]

    def choice_probs(
        self,
        prompts: list[list[int]],
        texts: list[str],
        temperature: float,
        caches: list[KVCache] | None = None,
    ) -> tuple[Choices, list[list[float]]]:
        """Each prompt's exact distribution over the allowed texts (training/rl/choices.py).
        Identical prompts are computed once; a frozen model remembers what it computed. With
        `caches` (one per prompt) and `reuse_kv`, each prompt starts from its carried cache."""
        choices = self.choices(texts)
        keys = [(tuple(p), choices.ids[0][-1], tuple(texts), temperature) for p in prompts]
        todo = list(dict.fromkeys(k for k in keys if k not in self._remembered))
        found: dict[tuple, list[float]] = {}
        if caches is not None and todo and self.reusing:
            held = dict(zip(keys, caches, strict=True))  # one cache per distinct prompt
            with torch.no_grad(), self.compute():
                logp = choice_logprobs_reusing(
                    self, [list(k[0]) for k in todo], choices, temperature, [held[k] for k in todo]
                )
            found = dict(zip(todo, torch.softmax(logp, -1).tolist(), strict=True))
            todo = []
        for start in range(0, len(todo), 8):  # 8 prompts x the texts per forward pass
            chunk = todo[start : start + 8]
            with self.compute():
                logp = choice_logprobs(
                    self.model, [list(k[0]) for k in chunk], choices, temperature, self.pad_id
                )
            for key, row in zip(chunk, torch.softmax(logp, -1).tolist(), strict=True):
                found[key] = row
        if self.frozen:
            self._remembered.update(found)
        return choices, [found.get(k) or self._remembered[k] for k in keys]


def adamw(params: list[Any], **settings: Any) -> torch.optim.AdamW:
    """AdamW with the fused kernel where torch has one (CPU, CUDA): one kernel per tensor instead
    of about ten ops, the same update to within float rounding; transformers' Trainer (and so
    TRL) defaults to it too (adamw_torch_fused). `params`: parameters, or param groups."""
    groups = [g for g in params if isinstance(g, dict)]
    tensors = [p for g in groups for p in g["params"]] if groups else params
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in tensors)
    return torch.optim.AdamW(params, fused=fused or None, **settings)


class Policy(LocalModel):
    """A trainable LocalModel with its optimizer and reference log-probs."""

    frozen = False

    def __init__(
        self,
        path: str | Path,
        *,
        finetune: str = "lora",
        lora: LoraSpec | None = None,
        lr: float = 1e-5,
        weight_decay: float = 0.0,
        weight_decay_skip_1d: bool = False,
        adam_betas: tuple[float, float] = (0.9, 0.999),
        beta: float = 0.0,
        kl_estimator: str = "k3",
        dtype: str = "float32",
        mixed_precision: bool = False,
        device: str = "cpu",
        ranks: Any = None,
        gradient_checkpointing: bool = False,
    ):
        # mixed precision: float32 master weights (LoRA: the frozen base too, so every FSDP unit
        # holds one dtype, as its flat parameters require); passes run in `dtype` (compute)
        mixed = mixed_precision and dtype != "float32"
        model, tokenizer = load_base(path, "float32" if mixed else dtype, device)
        self.base_path = str(path)
        self.finetune = finetune
        self.kl_estimator = kl_estimator
        self.reference_model = None
        if finetune == "lora":
            from peft import LoraConfig, get_peft_model

            lora = lora or LoraSpec()
            config = LoraConfig(
                r=lora.r,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                target_modules=list(lora.targets),
                task_type="CAUSAL_LM",
            )
            model = get_peft_model(model, config)
        elif beta > 0 and mixed:  # frozen, it never steps: in `dtype`, read again from disk
            self.reference_model = load_base(path, dtype, device)[0].requires_grad_(False)
        elif beta > 0:
            self.reference_model = copy.deepcopy(model).eval().requires_grad_(False)
        if gradient_checkpointing:  # non-reentrant: it needs no input that requires grad (LoRA)
            kwargs = {"use_reentrant": False}
            if hasattr(model, "activation_checkpointing_enable"):  # transformers' newer name
                model.activation_checkpointing_enable(kwargs)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        # Megatron's rule (get_param_groups): biases and 1-D parameters (norm weights) take no
        # weight decay. Named here, before FSDP flattens every shape to 1-D.
        undecayed = set()
        if weight_decay_skip_1d:
            undecayed = {
                n.replace(FSDP_PREFIX, "")
                for n, p in model.named_parameters()
                if p.requires_grad and (n.endswith(".bias") or p.ndim < 2)
            }
        super().__init__(model, tokenizer)
        self.dtype = dtype
        self.compute_dtype = TORCH_DTYPES[dtype] if mixed else None
        self.sharded = ranks.shard(self.model, self.compute_dtype) if ranks is not None else None
        # FSDP: the frozen reference copy is sharded like the policy (never a whole copy per rank)
        self.reference_sharded = None
        if self.reference_model is not None and ranks is not None:
            self.reference_sharded = ranks.shard(self.reference_model)
        trained = [(n, p) for n, p in self._weights().items() if p.requires_grad]
        groups = [{"params": [p for n, p in trained if n not in undecayed]}]
        if undecayed:
            groups.append(
                {"params": [p for n, p in trained if n in undecayed], "weight_decay": 0.0}
            )
        groups = [g for g in groups if g["params"]]
        self.optimizer = adamw(groups, lr=lr, betas=tuple(adam_betas), weight_decay=weight_decay)
        # a checkpoint numbers the optimizer's parameters in the model's order, whatever the
        # groups (the FSDP path's numbering), so it loads at any process count and grouping
        position = {id(p): i for i, (_, p) in enumerate(trained)}
        self._model_order = [position[id(p)] for g in groups for p in g["params"]]

    @classmethod
    def for_run(
        cls,
        config: RunConfig,
        *,
        lr: float,
        model: Path | None = None,
        beta: float | None = None,
        ranks: Any = None,
    ) -> Policy:
        """The agent (defaults), or a co-trained simulator on its own `model` and `beta`; both
        fine-tuned as config.finetune says, with the run's optimizer settings at `lr` (the
        role's effective rate: config.agent_lr or config.sim_lr)."""
        return cls(
            model or config.base_model_path(),
            finetune=config.finetune,
            lora=config.lora,
            lr=lr,
            weight_decay=config.weight_decay,
            weight_decay_skip_1d=config.weight_decay_skip_1d,
            adam_betas=tuple(config.adam_betas),
            beta=config.beta if beta is None else beta,
            kl_estimator=config.kl_estimator,
            dtype=config.dtype,
            mixed_precision=config.mixed_precision,
            device=config.device,
            ranks=ranks,
            gradient_checkpointing=config.gradient_checkpointing,
        )

    def gathered(self, writeback: bool = False) -> Any:
        """FSDP: the full weights in `model` on every rank while it lasts (a collective: every
        rank enters it; distributed.full_weights); `writeback` keeps what was loaded into them.
        Otherwise nothing."""
        return full_weights(self.sharded, writeback)

    def optimizer_state(self) -> dict[str, Any]:
        """The optimizer's state in torch's plain layout (parameters by position): under FSDP
        gathered from the shards (a collective every rank enters) to rank 0's host memory
        alone, one FSDP unit at a time (cpu_offload: rank0_only), so a checkpoint resumes at
        any process count while no rank holds the whole AdamW m and v on its device, and the
        other ranks hold none of it (they get an empty state: rank 0 writes the file)."""
        if self.sharded is None:
            state, order = self.optimizer.state_dict(), self._model_order
            return {
                "state": {order[i]: value for i, value in state["state"].items()},
                "param_groups": [
                    {**group, "params": [order[i] for i in group["params"]]}
                    for group in state["param_groups"]
                ],
            }
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        # rank0_only: on a GPU through cpu_offload (each unit's gathered m and v copied to host
        # memory); on CPU without it, since there torch's offload aliases them (its .cpu() of a
        # CPU tensor copies nothing and the gathered exp_avg and exp_avg_sq came back as one
        # tensor, measured with torch 2.13), and broadcast_from_rank0 alone asks for rank0_only
        on_gpu = self.device.type != "cpu"
        whole = StateDictOptions(
            full_state_dict=True, cpu_offload=on_gpu, broadcast_from_rank0=not on_gpu
        )
        named = get_optimizer_state_dict(self.sharded, self.optimizer, options=whole)
        if not named.get("state"):  # not rank 0: nothing gathered here
            return {"state": {}, "param_groups": []}
        index = {name: i for i, name in enumerate(self._trained_names())}
        return {
            "state": {index[name]: value for name, value in named["state"].items()},
            "param_groups": [
                {**group, "params": [index[name] for name in group["params"]]}
                for group in named["param_groups"]
            ],
        }

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        if self.sharded is None:
            self.optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        names = self._trained_names()
        named = {
            "state": {names[i]: value for i, value in state["state"].items()},
            "param_groups": [
                {**group, "params": [names[i] for i in group["params"]]}
                for group in state["param_groups"]
            ],
        }
        whole = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(self.sharded, self.optimizer, named, options=whole)

    def _trained_names(self) -> list[str]:
        """The optimizer's parameters by name, in its order (FSDP keys its state by name)."""
        return [n for n, p in self._weights().items() if p.requires_grad]

    def _weights(self) -> dict[str, torch.nn.Parameter]:
        """The model's parameters by their own names (without FSDP's wrapper prefixes). Under
        FSDP the adapter is saved and loaded from these, not through state_dict, whose FSDP
        hooks would gather each layer again (a collective)."""
        return {n.replace(FSDP_PREFIX, ""): p for n, p in self.model.named_parameters()}

    def learn(
        self,
        transcripts: list[Transcript],
        adv: torch.Tensor,
        config: RunConfig,
        *,
        temperature: float,
        beta: float,
        ranks: Any = None,
        weights: torch.Tensor | None = None,
    ) -> dict:
        """One GRPO update on these transcripts' own tokens (mask 1), one advantage each, with
        log-probs at the sampling `temperature` and the KL weight `beta` of this role; with
        `ranks`, these are this rank's rows of a data-parallel step (grpo.update). Turns a
        server sampled must all come from one version of the weights (one_weight_version).
        `weights`: one per transcript, multiplying its loss term ([curation]); None = today's."""
        one_weight_version(transcripts)
        batch = TokenBatch.from_lists(
            [t.ids for t in transcripts],
            [t.mask for t in transcripts],
            self.pad_id,
            [t.allowed for t in transcripts],
        )
        return update(
            self.sharded or self.model,
            self.optimizer,
            batch,
            adv,
            eps=config.eps,
            eps_high=config.clip_high,
            beta=beta,
            micro_batch=config.micro_batch,
            epochs=config.ppo_epochs,
            grad_clip=config.grad_clip,
            reference=self.reference_logprobs if beta > 0 else None,
            reference_weights=self._reference_weights if self.reference_sharded else None,
            temperature=temperature,
            ranks=ranks,
            kl_estimator=self.kl_estimator,
            autocast=self.compute,
            loss_reduction=config.loss_reduction,
            kl_clamp=config.kl_clamp,
            weights=weights,
        )

    def _reference_weights(self) -> Any:
        """FSDP full fine-tuning: the reference copy's whole weights while it lasts (a
        collective every rank enters, once per update)."""
        return full_weights(self.reference_sharded)

    def reference_logprobs(self, batch: TokenBatch, temperature: float = 1.0) -> torch.Tensor:
        """The starting model's log-probs (LoRA: the adapter disabled; full: the frozen copy,
        under FSDP inside `_reference_weights`)."""
        with torch.no_grad(), self.compute():
            if self.finetune == "lora":
                with self.model.disable_adapter():
                    return token_logprobs(self.model, batch, temperature=temperature)[0]
            if self.reference_model is None:
                raise ValueError("full fine-tuning with beta > 0 needs the reference model")
            return token_logprobs(self.reference_model, batch, temperature=temperature)[0]

    # -- weights on disk ---------------------------------------------------------------------

    def save(self, folder: Path) -> None:
        """LoRA: the adapter (peft layout, what vLLM --lora-modules loads); full: the model
        folder with its tokenizer."""
        folder.mkdir(parents=True, exist_ok=True)
        if self.sharded is not None and self.finetune == "full":  # inside gathered()
            self._save_full_model(folder)
            self._serve_in_compute_dtype(folder)
            return
        if self.sharded is not None:  # inside gathered(): the same files, from the weights
            from safetensors.torch import save_file

            self.model.peft_config[self.model.active_adapter].save_pretrained(folder)
            weights = {k: p.detach().contiguous() for k, p in self._adapter_weights().items()}
            save_file(weights, folder / ADAPTER_WEIGHTS, metadata={"format": "pt"})
            return
        self.model.save_pretrained(folder)
        if self.finetune == "full":
            self.tokenizer.save_pretrained(folder)
            self._serve_in_compute_dtype(folder)

    def _serve_in_compute_dtype(self, folder: Path) -> None:
        """Mixed precision: the folder keeps the float32 master weights (a resume is exact), and
        its config.json names `dtype`, so what loads it with dtype "auto" (vLLM, transformers)
        serves it in the dtype it was trained to compute in."""
        if self.compute_dtype is None:
            return
        path = folder / "config.json"
        config = json.loads(path.read_text())
        config["dtype"] = self.dtype
        if "torch_dtype" in config:  # transformers' older name for the same key
            config["torch_dtype"] = self.dtype
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    def load_weights(self, folder: Path) -> None:
        from safetensors.torch import load_file

        if self.sharded is not None and self.finetune == "full":  # in gathered(writeback=True)
            self._load_model_files(folder)
        elif self.sharded is not None:  # inside gathered(writeback=True): the full weights
            self._load_adapter_file(folder)
        elif self.finetune == "lora":
            from peft import set_peft_model_state_dict

            result = set_peft_model_state_dict(self.model, load_file(folder / ADAPTER_WEIGHTS))
            if getattr(result, "unexpected_keys", None):
                raise ValueError(
                    f"{folder} is not an adapter of this model: {result.unexpected_keys[:3]}"
                )
        else:
            state = {}
            for shard in sorted(folder.glob("*.safetensors")):
                state.update(load_file(shard))
            self.model.load_state_dict(state, strict=False)

    def _save_full_model(self, folder: Path) -> None:
        """FSDP full fine-tuning, inside gathered(): the Hugging Face model folder save_pretrained
        writes (config, generation config, safetensors shards under the parameters' own names,
        a tied output embedding once, tokenizer), from the gathered weights by name: the
        model's state_dict would run FSDP's per-layer hooks, each a collective."""
        from huggingface_hub import save_torch_state_dict

        base = self.model
        base.config.save_pretrained(folder)
        if base.generation_config is not None:
            base.generation_config.save_pretrained(folder)
        # copies in host memory: the gathered weights are views of one flat buffer, which
        # safetensors refuses (shared storage), and a copy on the GPU would double the model there
        weights = {k: p.detach().to("cpu", copy=True) for k, p in self._weights().items()}
        save_torch_state_dict(weights, folder, max_shard_size="5GB")
        self.tokenizer.save_pretrained(folder)

    def _load_model_files(self, folder: Path) -> None:
        """A full model folder's safetensors copied into the (gathered) weights by name; every
        weight must be there (a tied output embedding is the input one)."""
        from safetensors.torch import load_file

        params = self._weights()
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(folder.glob("*.safetensors")):
            state.update(load_file(shard))
        unknown = [key for key in state if key not in params]
        missing = [key for key in params if key not in state]
        if unknown or missing:
            raise ValueError(
                f"{folder} is not a model of this architecture: unknown {unknown[:3]},"
                f" missing {missing[:3]}"
            )
        with torch.no_grad():
            for key, value in state.items():
                params[key].copy_(value)

    def _adapter_weights(self) -> dict[str, torch.nn.Parameter]:
        """The LoRA weights by their keys in PEFT's adapter file (without the adapter's name)."""
        adapter = f".{self.model.active_adapter}."
        return {n.replace(adapter, "."): p for n, p in self._weights().items() if "lora_" in n}

    def _load_adapter_file(self, folder: Path) -> None:
        """The PEFT adapter file copied into the LoRA weights by name."""
        from safetensors.torch import load_file

        params = self._adapter_weights()
        state = load_file(folder / ADAPTER_WEIGHTS)
        unknown = [key for key in state if key not in params]
        if unknown:
            raise ValueError(f"{folder} is not an adapter of this model: {unknown[:3]}")
        with torch.no_grad():
            for key, value in state.items():
                params[key].copy_(value)

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """The trainable weights, copied (to swap pool snapshots in and out): a LoRA adapter on
        its device, a whole model (full fine-tuning) in host memory, where a second float32
        copy of the model does not take the rollout phase's GPU memory (the dry run's pool_swap)."""
        host = self.finetune == "full"
        return {
            n: p.detach().to("cpu", copy=True) if host else p.detach().clone()
            for n, p in self.model.named_parameters()
            if p.requires_grad
        }

    def load_adapter_state(self, state: dict[str, torch.Tensor]) -> None:
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in state.items():
                params[name].copy_(value)
