"""The sim-to-real report's behaviour section, without Django: which simulator behaves most like
the people this study met (issue 40 point 7).

The reference is the study's own included participants' turns. A behaviour space
(agents/behaviour/space.py: the turns embedded, centred, k-means with K clusters) is fit on them
once and saved under a key of its settings and the turns themselves, so a report can be
reproduced from the folder it names and a new participant gives a new space, never a silently
changed one. Each simulator's stored turns (its conversations with every arm's checkpoint,
pooled, as the people's are pooled over the arms they met) are assigned to the clusters, and set
beside the people's shares (agents/behaviour/measures.py):

    r_k       the people's share of their turns in cluster k; p_k a simulator's
    BDI       sum_{k in S ∩ C} r_k / sum_{k in S} r_k, S = {k: r_k >= SUPPORT_SHARE} the
              people's support, C = {k: p_k > 0, p_k >= COVER_SHARE} what the simulator covers:
              the share of the people's behaviour (by its mass) the simulator reaches
    JSD       sqrt( (KL(p || m) + KL(r || m)) / (2 log 2) ), m = (p + r) / 2: the
              Jensen-Shannon distance of the two share vectors (0 alike, 1 disjoint)
    MCI       sum_k p_k^2: how much the simulator's turns sit in one mode

Most like the people: the highest BDI (behaviour a simulator never shows is behaviour an agent
never trains against), ties broken by the smaller JSD (of those reaching as much, the one whose
turns fall where the people's do). Both are estimates from the turns stored.

Section keys (report key ``behaviour``): ``error`` (nothing compared when set, and why),
``notes``, ``space`` ({key, folder, fitted, embedder, clusters, seed, support_share,
cover_share, reference_turns}), ``people`` ({participants, turns, shares}), ``simulators``
(best first: [{name, label, humanlike, conversations, turns, shares, bdi, jsd, mci}], a
simulator with no turns last, its measures null), ``most_like`` (a name or null), ``rule``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.behaviour import measures as m
from agents.behaviour.space import BehaviourSpace, Embed, capped

# A cluster is in the people's support at 0.5% of their turns, a simulator covers one at 1% of
# its own: training's [behaviour] defaults (support_share, cover_share), so a study's BDI and a
# run's are read alike.
SUPPORT_SHARE = 0.005
COVER_SHARE = 0.01
# At least this many participant turns per cluster before a space is fit: the paper's release
# counts a cluster covered at 5 samples; fewer, and a cluster's share is one person's habit.
LEAST_TURNS_PER_CLUSTER = 5
# The participant turns a space is fit on are at most this many (a seeded draw): the cost of
# embedding them on a CPU when the report is computed (training's reference_max default).
REFERENCE_MAX = 2000
RULE = "highest BDI first; ties by the smaller Jensen-Shannon distance"


@dataclass
class SimulatorTurns:
    """One simulator's stored user turns over the study's arms."""

    name: str
    label: str
    humanlike: bool = False
    conversations: int = 0
    turns: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SpaceSettings:
    """What defines a study's behaviour space (the same settings and turns give the same one)."""

    embedder: str  # the local model folder the turns are embedded with
    clusters: int
    seed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "reference": "participants",
            "embedder": self.embedder,
            "clusters": self.clusters,
            "seed": self.seed,
            "reference_max": REFERENCE_MAX,
        }


def space_key(settings: SpaceSettings, turns: Sequence[str]) -> str:
    """sha256 of the settings and the reference turns, in order: the saved space's name."""
    text = json.dumps([settings.as_dict(), list(turns)], ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fit_or_load(
    folder: Path, settings: SpaceSettings, turns: list[str], embed: Embed
) -> tuple[BehaviourSpace, bool]:
    """The space of these turns under these settings: loaded from folder/<key> when it was fit
    before, else fit and saved there. Returns (space, fitted now)."""
    where = folder / space_key(settings, turns)
    if (where / "space.json").is_file():
        return BehaviourSpace.load(where, embed), False
    space = BehaviourSpace.fit(settings.as_dict(), turns, embed, exemplars=0)  # no words kept
    space.save(where)
    return space, True


def failed(error: str, people: int = 0, turns: int = 0) -> dict[str, Any]:
    return {
        "error": error,
        "notes": [],
        "space": None,
        "people": {"participants": people, "turns": turns, "shares": []},
        "simulators": [],
        "most_like": None,
        "rule": RULE,
    }


def behaviour_section(
    people: Sequence[str],
    participants: int,
    simulators: Sequence[SimulatorTurns],
    settings: SpaceSettings,
    folder: Path,
    embedder: Callable[[str], Embed],
) -> dict[str, Any]:
    """The section (the module's docstring). `people`: the included participants' turns, in a
    stable order; `embedder(folder)` loads the embedding function, called only once there is
    something to compare (so a study without enough turns loads no model)."""
    people = [t.strip() for t in people if t and t.strip()]
    least = LEAST_TURNS_PER_CLUSTER * settings.clusters
    if len(people) < least:
        return failed(
            f"too few participant turns to fit a behaviour space: {len(people)} from "
            f"{participants} participant(s); {settings.clusters} clusters need at least {least} "
            f"({LEAST_TURNS_PER_CLUSTER} a cluster; PARLEY_SIM2REAL_CLUSTERS sets the clusters)",
            participants,
            len(people),
        )
    if not any(s.turns for s in simulators):
        return failed(
            "no simulator turns stored yet: nothing to set beside the participants'",
            participants,
            len(people),
        )
    try:
        embed = embedder(settings.embedder)
    except (OSError, ValueError) as error:  # a missing or unreadable local model folder
        return failed(f"the embedder could not be loaded: {error}", participants, len(people))
    reference = capped(people, REFERENCE_MAX, settings.seed)
    space, fitted = fit_or_load(folder, settings, reference, embed)
    r = space.reference_shares
    notes = []
    if len(reference) < len(people):
        notes.append(
            f"the space is fit on {len(reference)} of the {len(people)} participant "
            "turns (a seeded draw)"
        )
    rows = []
    for s in simulators:
        turns = [t.strip() for t in s.turns if t and t.strip()]
        row = {
            "name": s.name,
            "label": s.label,
            "humanlike": s.humanlike,
            "conversations": s.conversations,
            "turns": len(turns),
            "shares": [],
            "bdi": None,
            "jsd": None,
            "mci": None,
        }
        if turns:
            p = m.shares(space.assign(turns), space.k)
            row |= {
                "shares": p,
                "mci": m.mci(p),
                "jsd": m.jensen_shannon(p, r),
                "bdi": m.bdi(m.covered(p, COVER_SHARE), r, SUPPORT_SHARE),
            }
        else:
            notes.append(f"simulator {s.label!r}: no turns stored")
        rows.append(row)
    rows.sort(key=rank_key)
    measured = [row for row in rows if row["bdi"] is not None]
    return {
        "error": None,
        "notes": notes,
        "space": {
            "key": space_key(settings, reference),
            "folder": str(folder),
            "fitted": fitted,
            **settings.as_dict(),
            "support_share": SUPPORT_SHARE,
            "cover_share": COVER_SHARE,
            "reference_turns": len(reference),
        },
        "people": {"participants": participants, "turns": len(people), "shares": r},
        "simulators": rows,
        "most_like": measured[0]["name"] if measured else None,
        "rule": RULE,
    }


def rank_key(row: dict[str, Any]) -> tuple:
    """Best first: measured before not, then the higher BDI, then the smaller JSD."""
    if row["bdi"] is None:
        return (1, 0.0, 0.0)
    return (0, -row["bdi"], row["jsd"])


def shares_rows(section: dict[str, Any]) -> list[list[Any]]:
    """The shares table for a CSV: a header, then one row per cluster (people, each simulator),
    then the measures per simulator."""
    sims = [s for s in section.get("simulators") or [] if s["shares"]]
    people = (section.get("people") or {}).get("shares") or []
    if not people:
        return []
    rows: list[list[Any]] = [["cluster", "people", *(s["name"] for s in sims)]]
    for k, share in enumerate(people):
        rows.append([k + 1, share, *(s["shares"][k] for s in sims)])
    rows += [[], ["simulator", "label", "turns", "conversations", "bdi", "jsd", "mci", "most_like"]]
    for s in section["simulators"]:
        rows.append(
            [
                s["name"],
                s["label"],
                s["turns"],
                s["conversations"],
                s["bdi"],
                s["jsd"],
                s["mci"],
                s["name"] == section.get("most_like"),
            ]
        )
    return rows


def format_behaviour(section: dict[str, Any] | None) -> list[str]:
    """The section as lines of the command's text report."""
    if not section:
        return []
    lines = ["\nbehaviour against this study's participants (COLLAPSE-AWARE BDI, cluster shares)"]
    if section.get("error"):
        return lines + [f"  not compared: {section['error']}"]
    space, people = section["space"], section["people"]
    lines.append(
        f"  space {space['key']}: {space['clusters']} clusters fit on {space['reference_turns']}"
        f" turns of {people['participants']} participant(s), embedder {space['embedder']},"
        f" {'fit now' if space['fitted'] else 'loaded'} from {space['folder']}"
    )
    for s in section["simulators"]:
        if s["bdi"] is None:
            lines.append(f"  {s['label']}: no turns")
            continue
        lines.append(
            f"  {s['label']}: BDI {s['bdi']:.3f}, Jensen-Shannon distance "
            f"{s['jsd']:.3f}, MCI {s['mci']:.3f} ({s['turns']} turns)"
        )
    sims = [s for s in section["simulators"] if s["shares"]]
    lines.append("  shares by cluster: people | " + " | ".join(s["label"] for s in sims))
    for k, share in enumerate(people["shares"]):
        cells = " | ".join(f"{s['shares'][k]:.3f}" for s in sims)
        lines.append(f"    {k + 1:>3}: {share:.3f} | {cells}")
    if section["most_like"]:
        lines.append(f"  most like the people: {section['most_like']} ({section['rule']})")
    lines += [f"  note: {n}" for n in section["notes"]]
    return lines
