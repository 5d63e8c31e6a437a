"""A behaviour space: an embedder, the reference's mean, and k-means centroids fit once on a
reference set of turns (and, for P4G, a dialogue-act classifier). Turns are assigned to their
nearest cluster, so a simulator's behaviour is its shares over the clusters (measures.py).

Who fits it and on what: training fits one per run on a named reference and keeps it in
<run>/behaviour_space/ (training/measures/behaviour_space.py); the study half fits one on a
study's own participants' turns for the sim-to-real report and keeps it beside the report
(studies/analysis/behaviour.py). `save` / `load` write and read the same folder shape.

Embeddings are centred on the reference's mean and scaled to unit length before clustering:
mean-pooled states of a causal LM share one large common direction, which would otherwise put
every turn in one cluster. The folder holds no text: the mean, the centroids, the settings and
the reference's shares.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from agents.behaviour.measures import shares

Embed = Callable[[list[str]], list[list[float]]]
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
EXEMPLARS = 5  # reference turns kept per cluster, nearest its centroid first


def sentences(text: str) -> list[str]:
    """A turn's sentences (the unit the P4G annotation labels)."""
    return [s for s in (part.strip() for part in _SENTENCE.split(text)) if s]


def capped(texts: list[str], cap: int, seed: int) -> list[str]:
    """At most `cap` of `texts`, an even seeded draw (the order of a file says nothing)."""
    if len(texts) <= cap:
        return list(texts)
    return random.Random(seed).sample(texts, cap)


def kmeans(x: np.ndarray, k: int, seed: int, iterations: int = 50) -> np.ndarray:
    """Lloyd's k-means with k-means++ seeding; returns the k centroids. An emptied cluster is
    re-seeded at the point farthest from its centroid, so all k stay in use."""
    if len(x) < k:
        raise ValueError(f"behaviour.clusters = {k}: the reference has only {len(x)} turns")
    rng = np.random.default_rng(seed)
    centroids = [x[rng.integers(len(x))]]
    d = ((x - centroids[0]) ** 2).sum(1)  # each point's squared distance to its nearest so far
    for _ in range(1, k):
        total = d.sum()
        p = d / total if total > 0 else np.full(len(x), 1 / len(x))
        centroids.append(x[rng.choice(len(x), p=p)])
        d = np.minimum(d, ((x - centroids[-1]) ** 2).sum(1))
    c = np.array(centroids)
    for _ in range(iterations):
        d = _distances(x, c)
        labels = d.argmin(1)
        moved = c.copy()
        for j in range(k):
            members = x[labels == j]
            moved[j] = members.mean(0) if len(members) else x[d.min(1).argmax()]
        if np.allclose(moved, c):
            break
        c = moved
    return c


def _distances(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    return (x * x).sum(1)[:, None] - 2 * x @ c.T + (c * c).sum(1)[None]


def fit_classifier(
    x: np.ndarray, y: np.ndarray, classes: int, l2: float = 1e-3, steps: int = 300
) -> tuple[np.ndarray, np.ndarray]:
    """Multinomial logistic regression (softmax, L2), full-batch L-BFGS in torch."""
    import torch

    xt, yt = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.long)
    w = torch.zeros(x.shape[1], classes, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=steps, line_search_fn="strong_wolfe")

    def loss():
        opt.zero_grad()
        value = torch.nn.functional.cross_entropy(xt @ w + b, yt) + l2 * (w * w).sum()
        value.backward()
        return value

    opt.step(loss)
    return w.detach().numpy(), b.detach().numpy()


def _members_nearest_first(turns: list[str], d: np.ndarray, per: int) -> list[list[str]]:
    """Per cluster, up to `per` distinct turns assigned to it, nearest its centroid first
    (`d`: each turn's squared distance to each centroid)."""
    nearest = d.argmin(1)
    return [
        list(dict.fromkeys(turns[i] for i in np.argsort(d[:, k]) if nearest[i] == k))[:per]
        for k in range(d.shape[1])
    ]


class BehaviourSpace:
    """The run's behaviour space: `assign` puts turns in clusters, `acts` (P4G) labels their
    sentences with dialogue acts; `reference_shares` / `act_shares` are the reference's."""

    def __init__(
        self,
        settings: dict[str, Any],
        mean: np.ndarray,
        centroids: np.ndarray,
        reference_shares: list[float],
        reference_count: int,
        acts: dict[str, Any] | None = None,
        embed: Embed | None = None,
    ):
        self.settings = settings
        self.mean, self.centroids = mean, centroids
        self.reference_shares, self.reference_count = reference_shares, reference_count
        self.acts = acts  # {"labels", "weights", "bias", "reference_shares", "count"} or None
        self.embed = embed
        # per cluster, the reference turns nearest its centroid: what a cluster looks like in
        # words (Verbalized Sampling is shown the missing ones: training/regimes/synthesis.py)
        self.exemplars: list[list[str]] | None = None

    @property
    def k(self) -> int:
        return len(self.centroids)

    def vectors(self, texts: list[str]) -> np.ndarray:
        """The turns' embeddings, centred on the reference's mean and unit length."""
        if self.embed is None:
            raise ValueError("this behaviour space was loaded without an embedder")
        x = np.asarray(self.embed(texts), dtype=np.float64) - self.mean
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    def assign(self, texts: list[str]) -> list[int]:
        """Each turn's nearest cluster."""
        if not texts:
            return []
        return _distances(self.vectors(texts), self.centroids).argmin(1).tolist()

    def label_acts(self, texts: list[str]) -> list[int]:
        """The dialogue act of every sentence of `texts` (indices into acts["labels"])."""
        if self.acts is None:
            return []
        units = [s for t in texts for s in sentences(t)]
        if not units:
            return []
        scores = self.vectors(units) @ self.acts["weights"] + self.acts["bias"]
        return scores.argmax(1).tolist()

    def nearest_turns(self, turns: list[str], per: int) -> list[list[str]]:
        """Each cluster's `per` distinct member turns nearest its centroid, nearest first (its
        own members only: a turn of the next cluster would show a missing one wrongly)."""
        unique = list(dict.fromkeys(t for t in turns if t.strip()))
        return _members_nearest_first(unique, _distances(self.vectors(unique), self.centroids), per)

    @classmethod
    def fit(
        cls,
        settings: dict[str, Any],
        turns: list[str],
        embed: Embed,
        labelled: list[tuple[str, str]] | None = None,
        exemplars: int = EXEMPLARS,
    ) -> BehaviourSpace:
        """Fit the clustering on the reference `turns` (and the act classifier on `labelled`);
        keep `exemplars` reference turns per cluster (0: none, where the reference is people
        whose words must not be copied beside the space, as a study's participants)."""
        raw = np.asarray(embed(turns), dtype=np.float64)
        mean = raw.mean(0)
        space = cls(settings, mean, np.zeros((1, raw.shape[1])), [], len(turns), embed=embed)
        x = raw - mean
        x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        space.centroids = kmeans(x, settings["clusters"], settings["seed"])
        d = _distances(x, space.centroids)
        space.reference_shares = shares(d.argmin(1).tolist(), space.k)
        if exemplars:  # words of the reference, saved with the space: only where it may keep them
            # as nearest_turns, from the distances at hand (no second embedding pass)
            space.exemplars = _members_nearest_first(turns, d, exemplars)
        if labelled:
            names = sorted({label for _, label in labelled})
            y = np.array([names.index(label) for _, label in labelled])
            w, b = fit_classifier(space.vectors([s for s, _ in labelled]), y, len(names))
            space.acts = {
                "labels": names,
                "weights": w,
                "bias": b,
                "count": len(labelled),
                "reference_shares": shares(y.tolist(), len(names)),
            }
        return space

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "mean.npy", self.mean)
        np.save(folder / "centroids.npy", self.centroids)
        about: dict[str, Any] = {
            "settings": self.settings,
            "clusters": self.k,
            "reference_count": self.reference_count,
            "reference_shares": self.reference_shares,
            "exemplars": self.exemplars,
        }
        if self.acts is not None:
            np.save(folder / "acts_weights.npy", self.acts["weights"])
            np.save(folder / "acts_bias.npy", self.acts["bias"])
            about["acts"] = {k: self.acts[k] for k in ("labels", "count", "reference_shares")}
        (folder / "space.json").write_text(json.dumps(about, indent=2))

    @classmethod
    def load(cls, folder: Path, embed: Embed | None = None) -> BehaviourSpace:
        about = json.loads((folder / "space.json").read_text())
        acts = None
        if "acts" in about:
            acts = dict(
                about["acts"],
                weights=np.load(folder / "acts_weights.npy"),
                bias=np.load(folder / "acts_bias.npy"),
            )
        space = cls(
            about["settings"],
            np.load(folder / "mean.npy"),
            np.load(folder / "centroids.npy"),
            about["reference_shares"],
            about["reference_count"],
            acts,
            embed,
        )
        space.exemplars = about.get("exemplars")  # a space saved before they were kept: None
        return space
