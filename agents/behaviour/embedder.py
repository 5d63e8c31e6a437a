"""The default embedder of a behaviour space: sentence embeddings from a local Hugging Face
model folder, the mean of its last hidden states over the text's tokens (SmolLM2 here, the base
model folder PARLEY_BASE_MODEL, or any local sentence-embedding folder). Loaded from disk only:
nothing is downloaded. training's [collapse] embedding_model and [behaviour] embedder and the
study's sim-to-real report all embed with it."""

from __future__ import annotations

from pathlib import Path


class Embedder:
    """Sentence embeddings from a local Hugging Face model folder: the mean of its last hidden
    states over the text's tokens. Loaded from disk only (nothing is downloaded)."""

    setting = "embedder"  # the setting that named the folder, for the error

    def __init__(self, folder: str | Path, batch: int = 16):
        from transformers import AutoModel, AutoTokenizer

        folder = Path(folder).expanduser()
        if not folder.is_dir():
            raise ValueError(
                f"{self.setting}: no model folder at {folder} (a local folder; nothing is"
                " downloaded)"
            )
        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModel.from_pretrained(folder, local_files_only=True).eval()
        self.batch = batch

    def __call__(self, texts: list[str]) -> list[list[float]]:
        import torch

        out = []
        with torch.no_grad():
            for i in range(0, len(texts), self.batch):
                enc = self.tokenizer(
                    texts[i : i + self.batch],
                    padding=True,
                    truncation=True,
                    max_length=256,
                    return_tensors="pt",
                )
                hidden = self.model(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                out += ((hidden * mask).sum(1) / mask.sum(1).clamp(min=1)).tolist()
        return out
