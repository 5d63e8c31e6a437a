"""One behaviour space per run (the space itself: agents/behaviour/space.py): an embedder, a
k-means clustering fit once on a named reference set, and (P4G) a dialogue-act classifier
trained on the corpus's labelled persuadee sentences.
It is saved in <run>/behaviour_space/ and loaded again on resume, so every step's turns are
measured in the same space (agents/behaviour/measures.py's MCI, SCD, BDI).

References ([behaviour] reference):
    p4g_corpus         the human persuadee turns of the official Persuasion for Good corpus
                       (full_dialog.csv, B4 == 1); with dialogue_acts, also the 300 annotated
                       dialogues' persuadee sentences (300_dialog.xlsx, ee_label_1)
    run:<folder>       the pooled simulator turns of a named run (its samples.jsonl): tau2 has
                       no human corpus
    texts:<file>       a file of turns, one JSON string (or {"text": ...}) a line: a study's
                       participants' turns, exported
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from agents.behaviour.embedder import Embedder
from agents.behaviour.space import EXEMPLARS, BehaviourSpace, Embed, capped
from agents.paths import reference_dir
from training.layout import SAMPLES_FILE

SPACE_DIR = "behaviour_space"


class BehaviourEmbedder(Embedder):
    """The [behaviour] embedder (agents/behaviour/embedder.py), named as such in its errors."""

    setting = "behaviour.embedder"


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
    path = Path(folder).expanduser() / SAMPLES_FILE
    if not path.is_file():
        raise ValueError(f"behaviour.reference = 'run:{folder}': no {SAMPLES_FILE} there")
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


# -- the run's space ---------------------------------------------------------------------------


def load_or_fit(
    run_dir: Path, settings: dict[str, Any], embed: Embed, corpus: str = "", domain_data: str = ""
) -> BehaviourSpace:
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
        if space.exemplars is None:  # saved before they were kept: read its reference again
            turns = capped(
                reference_turns(settings["reference"], corpus, domain_data),
                settings["reference_max"],
                settings["seed"],
            )
            space.exemplars = space.nearest_turns(turns, EXEMPLARS)
        return space
    turns = capped(
        reference_turns(settings["reference"], corpus, domain_data),
        settings["reference_max"],
        settings["seed"],
    )
    labelled = None
    if settings["dialogue_acts"]:
        labelled = capped(
            p4g_labelled_sentences(p4g_folder(corpus, domain_data)),
            settings["reference_max"],
            settings["seed"],
        )
    space = BehaviourSpace.fit(settings, turns, embed, labelled)
    space.save(folder)
    return space
