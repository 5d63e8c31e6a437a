"""A pre-registered plan, seen from the analysis: its canonical text, its hash, and whether a
report's settings are the plan's (confirmatory) or not (exploratory).

The canonical text is JSON with sorted keys, no spaces, UTF-8 and no NaN, so the same plan
always gives the same SHA-256, recomputable by anyone from the exported document
(``python -c "import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())"``
over its ``canonical`` string). Nothing here knows about Django.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from typing import Any

CONFIRMATORY = "confirmatory"
EXPLORATORY = "exploratory"


def canonical(plan: dict[str, Any]) -> str:
    return json.dumps(
        plan, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def settings_values(settings) -> dict[str, Any]:
    """Settings as JSON values (tuples as lists), as a plan stores them."""
    return json.loads(json.dumps(asdict(settings)))


# Settings that change no test and no number, only where columns are found or how figures
# are drawn: a CSV with other column names can still be the plan's analysis.
PRESENTATION = ("arm_column", "attention_column", "finished_column", "ranges", "likert")


def differences(settings, planned: dict[str, Any]) -> list[str]:
    """The settings that differ from the plan's, in words."""
    now = settings_values(settings)
    return [
        f"{name}: planned {planned.get(name)!r}, used {now[name]!r}"
        for name in now
        if name not in PRESENTATION and now[name] != planned.get(name)
    ]


def label(settings, document: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a report says of its plan: None without one; else confirmatory when the settings
    are the frozen plan's analysis exactly, exploratory otherwise (with what differs). The
    document (plan, canonical text, sha256) goes along, so the report carries the snapshot."""
    if document is None:
        return None
    text = document["canonical"]
    verified = digest(text) == document["sha256"] and json.loads(text) == document["plan"]
    changed = differences(settings, document["plan"]["analysis"])
    return {
        "analysis": EXPLORATORY if changed or not verified else CONFIRMATORY,
        "differences": changed,
        "verified": verified,
        **{k: document[k] for k in ("sha256", "frozen_at", "plan", "canonical")},
    }


def tag(report: dict[str, Any]) -> str:
    """A line for tables and figures: which kind of analysis this is."""
    found = report.get("preregistration")
    if not found:
        return ""
    if found["analysis"] == CONFIRMATORY:
        return f"Confirmatory: the pre-registered plan (sha256 {found['sha256'][:12]})"
    return f"EXPLORATORY: not the pre-registered plan (sha256 {found['sha256'][:12]})"
