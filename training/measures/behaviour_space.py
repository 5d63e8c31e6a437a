"""One behaviour space per run: an embedder, a k-means clustering fit once on a named reference
set, and (P4G) a dialogue-act classifier trained on the corpus's labelled persuadee sentences.
It is saved in <run>/behaviour_space/ and loaded again on resume, so every step's turns are
measured in the same space (training/measures/behaviour.py's MCI, SCD, BDI).

References ([behaviour] reference):
    p4g_corpus         the human persuadee turns of the official Persuasion for Good corpus
                       (full_dialog.csv, B4 == 1); with dialogue_acts, also the 300 annotated
                       dialogues' persuadee sentences (300_dialog.xlsx, ee_label_1)
    run:<folder>       the pooled simulator turns of a named run (its samples.jsonl): tau2 has
                       no human corpus
    texts:<file>       a file of turns, one JSON string (or {"text": ...}) a line: a study's
                       participants' turns, exported

Embeddings are centred on the reference's mean and scaled to unit length before clustering:
mean-pooled states of a causal LM share one large common direction, which would otherwise put
every turn in one cluster.
"""

from __future__ import annotations

import csv
import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from agents.paths import reference_dir

SPACE_DIR = "behaviour_space"
EXEMPLARS = 5  # reference turns kept per cluster, nearest its centroid first
Embed = Callable[[list[str]], list[list[float]]]
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def sentences(text: str) -> list[str]:
    """A turn's sentences (the unit the P4G annotation labels)."""
    return [s for s in (part.strip() for part in _SENTENCE.split(text)) if s]


# -- the reference sets -------------------------------------------------------------------------


def p4g_folder(corpus: str, domain_data: str = "") -> Path:
    """The folder holding full_dialog.csv: `corpus`, else the run's domain_data, else the shared
    reference data's p4g/. Absent: a clear error, never a download."""
    tried = []
    for base in (corpus, domain_data, str(reference_dir() or "")):
        if not base:
            continue
        for folder in (Path(base).expanduser(), Path(base).expanduser() / "p4g"):
            tried.append(str(folder))
            if (folder / "full_dialog.csv").is_file():
                return folder
    raise ValueError(
        "behaviour.reference = 'p4g_corpus': no Persuasion for Good full_dialog.csv in "
        + (", ".join(tried) or "any folder (set behaviour.corpus)")
    )


def p4g_persuadee_turns(folder: Path) -> list[str]:
    """The human persuadees' turns (B4 == 1) of full_dialog.csv, in the file's order."""
    with open(folder / "full_dialog.csv", newline="", encoding="utf-8") as f:
        return [
            r["Unit"].strip() for r in csv.DictReader(f) if r["B4"] == "1" and r["Unit"].strip()
        ]


def p4g_labelled_sentences(folder: Path) -> list[tuple[str, str]]:
    """(sentence, dialogue act) of every persuadee sentence the annotated dialogues label
    (300_dialog.xlsx, ee_label_1; 4,847 in the official file)."""
    path = folder / "300_dialog.xlsx"
    if not path.is_file():
        raise ValueError(
            f"behaviour.dialogue_acts: no annotated 300_dialog.xlsx in {folder} (set"
            " dialogue_acts = false to measure the clusters alone)"
        )
    import openpyxl

    book = openpyxl.load_workbook(path, read_only=True)
    rows = book.active.iter_rows(values_only=True)
    header = list(next(rows))
    role, unit, label = header.index("B4"), header.index("Unit"), header.index("ee_label_1")
    found = [
        (str(r[unit]).strip(), str(r[label]).strip())
        for r in rows
        if r[role] == 1 and r[label] and r[unit] and str(r[unit]).strip()
    ]
    book.close()
    return found


def p4g_decision_shares(folder: Path) -> dict[str, float]:
    """People's decisions as shares over the decision markers: each persuadee's actual
    donation (full_info.csv B6, B4 == 1, 0..2 kept) at the nearest decision amount."""
    from agents.domains.p4g.donation import DECISION_AMOUNTS, marker

    counts = dict.fromkeys(DECISION_AMOUNTS, 0)
    with open(folder / "full_info.csv", newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            try:
                amount = float(r["B6"])
            except (KeyError, ValueError):
                continue
            if r.get("B4") == "1" and 0 <= amount <= 2:
                counts[min(DECISION_AMOUNTS, key=lambda a: abs(a - amount))] += 1
    total = sum(counts.values())
    if not total:
        raise ValueError(f"{folder}/full_info.csv holds no persuadee donation in 0..2")
    return {marker(a): c / total for a, c in counts.items()}


def run_user_turns(folder: Path) -> list[str]:
    """The pooled simulator turns of a run's samples.jsonl."""
    path = Path(folder).expanduser() / "samples.jsonl"
    if not path.is_file():
        raise ValueError(f"behaviour.reference = 'run:{folder}': no samples.jsonl there")
    from training.measures.diversity import turns

    found = []
    for line in path.read_text().splitlines():
        if line.strip():
            found += turns(json.loads(line).get("conversation", []), "user")
    return found


def file_turns(path: Path) -> list[str]:
    """One turn a line: a JSON string or an object with "text"."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"behaviour.reference = 'texts:{path}': no such file")
    found = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        value = json.loads(line)
        text = value.get("text") if isinstance(value, dict) else value
        if not isinstance(text, str):
            raise ValueError(f"{path} line {n}: a JSON string or {{'text': ...}} expected")
        if text.strip():
            found.append(text.strip())
    return found


def reference_turns(reference: str, corpus: str = "", domain_data: str = "") -> list[str]:
    """The turns of the named reference set (the module's docstring)."""
    if reference == "p4g_corpus":
        return p4g_persuadee_turns(p4g_folder(corpus, domain_data))
    kind, _, where = reference.partition(":")
    if kind == "run" and where:
        return run_user_turns(Path(where))
    if kind == "texts" and where:
        return file_turns(Path(where))
    raise ValueError(
        f"behaviour.reference {reference!r}: expected p4g_corpus, run:<folder> or texts:<file>"
    )


def capped(texts: list[str], cap: int, seed: int) -> list[str]:
    """At most `cap` of `texts`, an even seeded draw (the order of a file says nothing)."""
    if len(texts) <= cap:
        return list(texts)
    return random.Random(seed).sample(texts, cap)


# -- the clustering and the classifier ----------------------------------------------------------


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


class BehaviourSpace:
    """The run's behaviour space: `assign` puts turns in clusters, `acts` (P4G) labels their
    sentences with dialogue acts; `reference_shares` / `act_shares` are the reference's."""

    def __init__(self, settings: dict[str, Any], mean: np.ndarray, centroids: np.ndarray,
                 reference_shares: list[float], reference_count: int,
                 acts: dict[str, Any] | None = None, embed: Embed | None = None):  # fmt: skip
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

    @classmethod
    def fit(cls, settings: dict[str, Any], turns: list[str], embed: Embed,
            labelled: list[tuple[str, str]] | None = None) -> BehaviourSpace:  # fmt: skip
        """Fit the clustering on the reference `turns` (and the act classifier on `labelled`)."""
        from training.measures.behaviour import shares

        raw = np.asarray(embed(turns), dtype=np.float64)
        mean = raw.mean(0)
        space = cls(settings, mean, np.zeros((1, raw.shape[1])), [], len(turns), embed=embed)
        x = raw - mean
        x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        space.centroids = kmeans(x, settings["clusters"], settings["seed"])
        d = _distances(x, space.centroids)
        space.reference_shares = shares(d.argmin(1).tolist(), space.k)
        space.exemplars = [list(dict.fromkeys(turns[i] for i in np.argsort(d[:, j])))[:EXEMPLARS]
                           for j in range(space.k)]  # fmt: skip
        if labelled:
            names = sorted({label for _, label in labelled})
            y = np.array([names.index(label) for _, label in labelled])
            w, b = fit_classifier(space.vectors([s for s, _ in labelled]), y, len(names))
            space.acts = {"labels": names, "weights": w, "bias": b, "count": len(labelled),
                          "reference_shares": shares(y.tolist(), len(names))}  # fmt: skip
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
            acts = dict(about["acts"], weights=np.load(folder / "acts_weights.npy"),
                        bias=np.load(folder / "acts_bias.npy"))  # fmt: skip
        space = cls(about["settings"], np.load(folder / "mean.npy"),
                    np.load(folder / "centroids.npy"), about["reference_shares"],
                    about["reference_count"], acts, embed)  # fmt: skip
        space.exemplars = about.get("exemplars")  # a space saved before they were kept: None
        return space


def load_or_fit(run_dir: Path, settings: dict[str, Any], embed: Embed,
                corpus: str = "", domain_data: str = "") -> BehaviourSpace:  # fmt: skip
    """The run's space: fit and saved the first time, loaded after (a resumed run measures in
    the space its first steps were measured in; settings that would give another space are
    refused rather than silently refitting)."""
    folder = Path(run_dir) / SPACE_DIR
    if (folder / "space.json").is_file():
        space = BehaviourSpace.load(folder, embed)
        if space.settings != settings:
            raise ValueError(
                f"{folder} was fit with {space.settings}, this config asks for {settings}:"
                " every step of a run is measured in one space (delete the folder to refit)"
            )
        return space
    turns = capped(reference_turns(settings["reference"], corpus, domain_data),
                   settings["reference_max"], settings["seed"])  # fmt: skip
    labelled = None
    if settings["dialogue_acts"]:
        labelled = capped(p4g_labelled_sentences(p4g_folder(corpus, domain_data)),
                          settings["reference_max"], settings["seed"])  # fmt: skip
    space = BehaviourSpace.fit(settings, turns, embed, labelled)
    space.save(folder)
    return space
