"""Persuadee personas built from the P4G pre-task survey.

A persona record uses the field names of the official `full_info.csv` (`extrovert.x`,
`care.x`, ..., `ideology.x`); the bundled personas.json is written in the same schema, so
one function turns either into a Scenario. Scales: Big Five and decision style 1..5,
moral foundations and Schwartz values 1..6, income bracket 1..12.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from pathlib import Path
from typing import Any

from agents.domains.base import Scenario

DOMAIN = "p4g"
BUNDLED_PATH = Path(__file__).with_name("data") / "personas.json"

# payload group -> (survey fields, scale maximum)
TRAIT_GROUPS: dict[str, tuple[tuple[str, ...], int]] = {
    "big_five": (("extrovert", "agreeable", "conscientious", "neurotic", "open"), 5),
    "moral_foundations": (("care", "fairness", "loyalty", "authority", "purity"), 6),
    "values": (
        (
            "freedom",
            "conform",
            "tradition",
            "benevolence",
            "universalism",
            "self_direction",
            "stimulation",
            "hedonism",
            "achievement",
            "power",
            "security",
        ),
        6,
    ),
    "decision_style": (("rational", "intuitive"), 5),
}
DEMOGRAPHICS = (
    "age",
    "sex",
    "race",
    "edu",
    "marital",
    "employment",
    "income",
    "religion",
    "ideology",
)
NUMERIC_DEMOGRAPHICS = ("age", "income")
SPLITS = ("train", "test")


def _number(value: Any, field: str, low: float, high: float) -> float | None:
    """A survey score, None when the participant left it blank."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{field}: expected a number, got {value!r}") from None
    if math.isnan(number):
        return None
    if not low <= number <= high:
        raise ValueError(f"{field}: {number} is outside {low:g}..{high:g}")
    return round(number, 3)


def persona_from_record(record: dict[str, Any]) -> dict[str, Any]:
    """The grouped persona payload from a flat survey record (`<field>.x` keys)."""
    persona: dict[str, Any] = {}
    for group, (fields, top) in TRAIT_GROUPS.items():
        persona[group] = {f: _number(record.get(f"{f}.x"), f"{f}.x", 1, top) for f in fields}
    demographics: dict[str, Any] = {}
    for field in DEMOGRAPHICS:
        value = record.get(f"{field}.x")
        if field in NUMERIC_DEMOGRAPHICS:
            value = _number(value, f"{field}.x", 0, 130 if field == "age" else 12)
            value = None if value is None else int(value)
        elif isinstance(value, str):
            value = value.strip() or None
        demographics[field] = value
    persona["demographics"] = demographics
    return persona


def load_bundled(path: Path = BUNDLED_PATH) -> list[Scenario]:
    """The ~30 invented personas shipped with parley (train/test split written in the file)."""
    try:
        records = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    scenarios = []
    for i, record in enumerate(records):
        for key in ("id", "title", "split"):
            if key not in record:
                raise ValueError(f"{path}: persona #{i} has no {key!r}")
        if record["split"] not in SPLITS:
            raise ValueError(f"{path}: persona {record['id']}: split must be train or test")
        payload = {
            "source": "bundled",
            "split": record["split"],
            "persona": persona_from_record(record),
            "actual_donation": None,
        }
        scenarios.append(Scenario(record["id"], DOMAIN, payload, record["title"]))
    return scenarios


def _split_of(user_id: str) -> str:
    # Stable across runs and machines; one user's dialogues all land in the same split.
    return "test" if hashlib.sha256(user_id.encode()).digest()[0] % 5 == 0 else "train"


def find_full_info(path: Path | str) -> Path:
    """full_info.csv given itself, its folder, or a folder holding p4g/full_info.csv."""
    path = Path(path)
    for candidate in (path, path / "full_info.csv", path / "p4g" / "full_info.csv"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"no Persuasion for Good full_info.csv at {path} (nor {path}/full_info.csv "
        f"or {path}/p4g/full_info.csv)"
    )


def _read_full_info(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = {"B2", "B3", "B4", "B6"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing columns {sorted(missing)}")
        return list(reader)


def _persona(path: Path, line: int, row: dict[str, str]) -> dict[str, Any]:
    try:
        return persona_from_record(row)
    except ValueError as exc:
        raise ValueError(f"{path}:{line}: {exc}") from None


def _title(row: dict[str, str], persona: dict[str, Any]) -> str:
    demo = persona["demographics"]
    described = ", ".join(str(demo[k]) for k in ("age", "sex", "ideology") if demo[k])
    return f"P4G persuadee {row['B3']}" + (f" ({described})" if described else "")


def load_release(path: Path | str) -> list[Scenario]:
    """The release's P4G tasks: one per dialogue of its split (release.split_ids, the `train/`
    and `test/` folders beside full_info.csv), in the order its data source reads them (sorted
    by dialogue id), with the persuadee's persona and the persuader's own (the release gives the
    persuader the persona of the dialogue's persuader, usim/p4g/rollout.py @ 9d3a41e). Every
    listed dialogue counts, whatever its recorded donation: the release filters none."""
    from agents.domains.p4g.release import split_ids

    path = find_full_info(path)
    split = split_ids(path.parent)
    roles: dict[str, dict[str, tuple[int, dict[str, str]]]] = {}
    for line, row in enumerate(_read_full_info(path), start=2):
        if row["B2"] in split and row["B4"].strip() in ("0", "1"):
            roles.setdefault(row["B2"], {})[row["B4"].strip()] = (line, row)
    missing = sorted(d for d in split if set(roles.get(d, {})) != {"0", "1"})
    if missing:
        raise ValueError(
            f"{path}: {len(missing)} dialogue(s) of the release's split lack a persuader or a"
            f" persuadee row, e.g. {missing[:3]}"
        )
    scenarios = []
    for dialogue in sorted(split):
        (line, row), (persuader_line, persuader_row) = roles[dialogue]["1"], roles[dialogue]["0"]
        persona = _persona(path, line, row)
        try:
            donation: float | None = float(row["B6"])
        except ValueError:
            donation = None
        payload = {
            "source": "release",
            "split": split[dialogue],
            "persona": persona,
            "persuader": _persona(path, persuader_line, persuader_row),
            "actual_donation": donation,
            "dialogue_id": dialogue,
            "user_id": row["B3"],
            "persuader_id": persuader_row["B3"],
        }
        scenarios.append(Scenario(f"p4g-{dialogue}", DOMAIN, payload, _title(row, persona)))
    return scenarios


def load_full_info(path: Path | str) -> list[Scenario]:
    """Persuadee rows (B4 == 1) of the official full_info.csv with a donation in 0..2.
    The actual donation (B6) stays in the payload for reference, never in any prompt."""
    path = find_full_info(path)
    rows = _read_full_info(path)
    scenarios = []
    for line, row in enumerate(rows, start=2):
        if row["B4"].strip() != "1":
            continue
        try:
            donation = float(row["B6"])
        except ValueError:
            continue  # no recorded donation
        if not 0 <= donation <= 2:
            continue  # the few outliers the reference README tells us to drop
        persona = _persona(path, line, row)
        payload = {
            "source": "full_info",
            "split": _split_of(row["B3"]),
            "persona": persona,
            "actual_donation": donation,
            "dialogue_id": row["B2"],
            "user_id": row["B3"],
            "turns": int(float(row["B7"])) if row.get("B7", "").strip() else None,
        }
        scenarios.append(Scenario(f"p4g-{row['B2']}", DOMAIN, payload, _title(row, persona)))
    return scenarios
