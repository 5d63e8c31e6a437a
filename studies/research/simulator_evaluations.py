"""The Django side of the sim-to-real gap report: what each arm's checkpoint did against its
training run's held-out simulators on the study's own scenario pool (SimulatorEvaluation rows,
played by `evaluate_missing` on the arm's endpoint), beside the arm's participants.

    pending = missing(study)                  # conversations not played yet
    evaluate_missing(study)                   # play and store them (the Celery job calls this)
    report = study_report(study)              # studies.analysis.sim2real's report, with `missing`
                                              # and `behaviour` (each simulator beside the people)

An arm's checkpoint is the registered Checkpoint its model name serves (attached from a
TrainingRun); its panel is the `[[heldout]]` list of the run config in the checkpoint's
manifest, so studies never import training.

Human-like simulators (LoRA adapters fine-tuned on a study's people by `imitate_users`,
studies/research/imitation_data.py) are one more column each: by default every one registered from this study,
or those named. Each is played as a plain simulator on the arm's own endpoint under its
checkpoint name: `imitate_users` registers it in the adapters folder that endpoint's engine
serves the arms' checkpoints from, on the same base model. Its conversations are stored under its
checkpoint name and reported apart from the run's panel, with their own gap to people.

Behaviour (issue 40 point 7, studies/analysis/sim2real_behaviour.py): every simulator's stored
turns set beside the study's included participants' turns in a behaviour space fit on the
participants' (BDI, cluster shares, Jensen-Shannon distance): which simulator behaves most like
the people this study met. The space is saved under PARLEY_DATA_DIR/sim2real/<study>/
behaviour_space/<key>/ (or beside the command's --out report), named in the section.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import IntegrityError

from agents.behaviour.embedder import Embedder
from agents.behaviour.space import Embed
from agents.llm import LLMClient
from agents.llm.errors import LLMError
from agents.models import Checkpoint
from agents.paths import base_model_dir, data_dir
from studies.analysis.plots import render_svg, sim2real_behaviour_figure, sim2real_figure
from studies.analysis.report import included_rows
from studies.analysis.sim2real import ArmData, Conversation, build_sim2real
from studies.analysis.sim2real_behaviour import SimulatorTurns, SpaceSettings, behaviour_section
from studies.analysis.table import numeric_column
from studies.annotation import analysis as annotation_analysis
from studies.lib.domain_bridge import protocol_of, shared_domain, system_prompt_of
from studies.models import (
    Arm,
    Item,
    Message,
    Participant,
    Scenario,
    SimulatorEvaluation,
    Study,
)
from studies.research import heldout_conversations, imitation_data
from studies.research.analysis_runs import (
    OUTCOME,
    analysis_settings,
    measures_of,
    participant_table,
)

log = logging.getLogger(__name__)

CONCURRENCY = 4  # conversations played at once per arm (the engine batches them)


def conversations_per_scenario() -> int:
    """PARLEY_SIM2REAL_CONVERSATIONS: conversations per held-out simulator and scenario."""
    return settings.PARLEY_SIM2REAL_CONVERSATIONS


@dataclass
class Pending:
    """One conversation the report needs that is not stored yet."""

    arm: Arm
    checkpoint: Checkpoint
    spec: dict[str, Any]
    scenario: Scenario
    sample: int


def arm_checkpoint(arm: Arm) -> Checkpoint | None:
    """The registered checkpoint the arm's model name serves, or None (a base model)."""
    return Checkpoint.objects.filter(name=arm.model_name).first()


def arm_panels(study: Study) -> tuple[list[tuple[Arm, Checkpoint | None, list[dict]]], list[str]]:
    """Each arm with its checkpoint and held-out panel, and notes on arms that have none."""
    found, notes = [], []
    for arm in study.arms.order_by("order", "id").select_related("endpoint"):
        checkpoint = arm_checkpoint(arm)
        panel = heldout_conversations.heldout_panel(checkpoint.manifest) if checkpoint else []
        if checkpoint is None:
            notes.append(
                f"arm {arm.name!r} asks for {arm.model_name!r}, which is no registered "
                "checkpoint: it has no training run and no held-out simulators"
            )
        elif not panel:
            notes.append(
                f"arm {arm.name!r}: the run of checkpoint {checkpoint.name!r} declares no "
                "held-out simulators ([[heldout]] in its config)"
            )
        found.append((arm, checkpoint, panel))
    return found, notes


class UnknownSimulator(ValueError):
    """A human-like simulator was named that is not registered."""


def humanlike_columns(study: Study, names: list[str] | None = None) -> list[Checkpoint]:
    """The human-like simulators the report shows: those named, else every one fine-tuned on
    this study's people, oldest first (a new one adds a column on the right)."""
    if names is None:
        return list(imitation_data.humanlike_simulators(study).order_by("created_at", "id"))
    found = {c.name: c for c in imitation_data.registered_humanlike().filter(name__in=names)}
    unknown = [n for n in names if n not in found]
    if unknown:
        known = ", ".join(
            imitation_data.registered_humanlike().order_by("name").values_list("name", flat=True)
        )
        raise UnknownSimulator(
            f"no human-like simulator {', '.join(map(repr, unknown))} (registered by "
            f"`imitate_users`: {known or 'none'})"
        )
    return [found[n] for n in dict.fromkeys(names)]


def humanlike_specs(arm: Arm, columns: list[Checkpoint]) -> list[dict[str, Any]]:
    """The human-like simulators as the arm's endpoint plays them."""
    urls = arm.endpoint.urls()
    return [imitation_data.served_heldout_table(c, urls, arm.endpoint.api_key_env) for c in columns]


def pool(study: Study) -> list[Scenario]:
    return list(study.scenarios.filter(active=True).order_by("id"))


def missing(
    study: Study, conversations: int | None = None, humanlike: list[str] | None = None
) -> list[Pending]:
    """Every (arm, checkpoint, held-out or human-like simulator, scenario, sample) the report
    asks for and the database does not hold."""
    conversations = conversations or conversations_per_scenario()
    scenarios = pool(study)
    columns = humanlike_columns(study, humanlike)
    pending = []
    for arm, checkpoint, panel in arm_panels(study)[0]:
        if checkpoint is None:
            continue
        stored = set(
            SimulatorEvaluation.objects.filter(arm=arm, checkpoint=checkpoint).values_list(
                "simulator", "scenario_id", "sample"
            )
        )
        for spec in panel + (humanlike_specs(arm, columns) if columns else []):
            for scenario in scenarios:
                for sample in range(conversations):
                    if (spec["name"], scenario.pk, sample) not in stored:
                        pending.append(Pending(arm, checkpoint, spec, scenario, sample))
    return pending


def evaluate_missing(
    study: Study, conversations: int | None = None, humanlike: list[str] | None = None
) -> dict[str, Any]:
    """Play and store every missing conversation; returns {"played", "failed": [reasons]}.
    A simulator that cannot be played here, or an engine that fails, is reported and left
    missing (a later job tries again); what is stored stays."""
    pending = missing(study, conversations, humanlike)
    played, failed = 0, []
    for arm_id in dict.fromkeys(p.arm.pk for p in pending):
        mine = [p for p in pending if p.arm.pk == arm_id]
        endpoint = mine[0].arm.endpoint
        # A human-like simulator plays on the arm's endpoint only if that serves its adapter.
        for name in dict.fromkeys(p.spec["name"] for p in mine if p.spec.get("humanlike")):
            problem = endpoint.model_problem(name)
            if problem:
                failed.append(f"{mine[0].arm.name}: human-like simulator {name!r}: {problem}")
                mine = [p for p in mine if p.spec["name"] != name]
        if not mine:
            continue
        urls, _ = endpoint.routing()  # read here: the event loop below makes no queries
        done, problems = async_to_sync(_play_arm)(mine, urls, endpoint.api_key())
        played += done
        failed += problems
    return {"played": played, "failed": failed}


def _domain_scenario(row: Scenario):
    from agents.domains.base import Scenario as DomainScenario

    domain = shared_domain(row.domain, row.source, protocol_of(row.study, row.domain))
    return domain, DomainScenario(
        id=row.key, domain=row.domain, payload=row.payload, title=row.title
    )


async def _play_arm(
    pending: list[Pending], urls: tuple[str, ...], api_key: str | None
) -> tuple[int, list[str]]:
    arm = pending[0].arm
    limits = heldout_conversations.run_limits(pending[0].checkpoint.manifest)
    failed: list[str] = []
    async with LLMClient(urls, api_key=api_key, timeout=settings.PARLEY_LLM_TIMEOUT) as client:
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(p: Pending) -> bool:
            domain, scenario = _domain_scenario(p.scenario)
            if domain is None:
                failed.append(f"{arm.name}: scenario {p.scenario.key} has no Domain (open chat)")
                return False
            agent = heldout_conversations.Agent(
                client,
                arm.model_name,
                system_prompt_of(domain, scenario, arm),
                arm.greeting,
                arm.generation_params(),
                arm.tool_format,
            )
            # Seeded by what the conversation is, so a replay draws the same simulator choices.
            rng = random.Random(f"{arm.name}-{p.spec['name']}-{p.scenario.key}-{p.sample}")
            try:
                user = heldout_conversations.make_user(p.spec, rng)
            except (heldout_conversations.HeldOutUnavailable, ValueError) as error:
                failed.append(f"{arm.name}: {error}")
                return False
            async with gate:
                try:
                    played = await heldout_conversations.play(
                        domain, scenario, agent, user, *limits
                    )
                except (LLMError, ValueError) as error:  # an engine or a scenario refused
                    failed.append(f"{arm.name} x {p.spec['name']} on {p.scenario.key}: {error}")
                    return False
                finally:
                    await user.aclose()
            await _store(p, played)
            return True

        results = await asyncio.gather(*(one(p) for p in pending))
    return sum(results), sorted(set(failed))


async def _store(p: Pending, played: heldout_conversations.Played) -> None:
    from studies.lib.db_threads import db

    await db(_store_row)(p, played)


def _store_row(p: Pending, played: heldout_conversations.Played) -> None:
    try:
        SimulatorEvaluation.objects.create(
            arm=p.arm,
            checkpoint=p.checkpoint,
            simulator=p.spec["name"],
            scenario=p.scenario,
            sample=p.sample,
            spec=p.spec,
            success=bool(played.outcome.success),
            reward=float(played.outcome.reward),
            outcome=played.outcome.to_dict(),
            end_reason=played.end_reason or "",
            conversation=played.conversation,
        )
    except IntegrityError:  # another job stored this conversation first: theirs stands
        pass


# --- the report ---------------------------------------------------------------------------------


def human_values(study: Study) -> tuple[dict[str, dict[str, list[float]]], list[str], list[str]]:
    """Per arm name: the included participants' outcome, success and Likert values (reverse
    coded items flipped); the Likert keys; the reverse-coded keys. Exclusions are the study's."""
    table = participant_table(study)
    settings_ = analysis_settings(study, table)
    items = [i for i in measures_of(study) if i.kind == Item.Kind.LIKERT]
    reverse = [i.key for i in items if i.reverse_coded]
    if table.empty:
        return {}, [i.key for i in items], reverse
    success_of = dict(
        (pid, bool((outcome or {}).get("success")) if outcome else None)
        for pid, outcome in Participant.objects.filter(study=study).values_list(
            "prolific_pid", "outcome"
        )
    )
    table = table[included_rows(table, settings_)]
    values: dict[str, dict[str, list[float]]] = {}
    for arm, rows in table.groupby("arm", sort=False):
        outcome = numeric_column(rows[OUTCOME]).values
        entry = {
            "outcome": [float(v) for v in outcome if np.isfinite(v)],
            "success": [
                float(success_of[pid])
                for pid, v in zip(rows["participant"], outcome, strict=True)
                if np.isfinite(v) and success_of.get(pid) is not None
            ],
        }
        for item in items:
            answers = numeric_column(rows[item.key]).values
            k = item.scale_points
            answers = answers[np.isfinite(answers) & (answers >= 1) & (answers <= k)]
            entry[item.key] = [float(k + 1 - a if item.reverse_coded else a) for a in answers]
        values[str(arm)] = entry
    return values, [i.key for i in items], reverse


def participant_turns(study: Study) -> tuple[list[str], int]:
    """The turns the study's included participants wrote (the people the report's own columns
    count: its exclusions), in the order they were written, and how many participants wrote
    them."""
    table = participant_table(study)
    if table.empty:
        return [], 0
    included = set(table[included_rows(table, analysis_settings(study, table))]["participant"])
    rows = (
        Message.objects.filter(conversation__participant__study=study, role=Message.Role.USER)
        .filter(conversation__participant__prolific_pid__in=included)
        .order_by("conversation__participant__created_at", "conversation_id", "seq")
        .values_list("conversation__participant_id", "content")
    )
    turns = [(who, text) for who, text in rows if text and text.strip()]
    return [text for _, text in turns], len({who for who, _ in turns})


def behaviour_embedder(folder: str) -> Embed:
    """The embedding function of the behaviour section: mean-pooled hidden states of a local
    model folder, loaded from disk (agents/behaviour/embedder.py)."""
    return Embedder(folder)


def space_settings() -> SpaceSettings:
    """The behaviour space's settings: PARLEY_SIM2REAL_EMBEDDER ("" = the base model folder,
    PARLEY_BASE_MODEL, as training's [behaviour] embedder) and PARLEY_SIM2REAL_CLUSTERS."""
    folder = settings.PARLEY_SIM2REAL_EMBEDDER or str(base_model_dir())
    return SpaceSettings(embedder=folder, clusters=settings.PARLEY_SIM2REAL_CLUSTERS)


def behaviour_report(
    study: Study,
    panels: list[tuple[Arm, Checkpoint | None, list[dict]]],
    labels: dict[str, str],
    scenarios: set[int],
    space_dir: Path | None = None,
) -> dict[str, Any]:
    """The report's `behaviour` section: every held-out and human-like simulator's stored user
    turns (pooled over the arms, as the people are) beside the included participants'."""
    simulators: dict[str, SimulatorTurns] = {}
    for _, _, panel in panels:
        for spec in panel:
            simulators.setdefault(spec["name"], SimulatorTurns(spec["name"], spec["name"]))
    for name, label in labels.items():
        simulators.setdefault(name, SimulatorTurns(name, label, humanlike=True))
    for arm, checkpoint, _ in panels:
        if checkpoint is None:
            continue
        rows = (
            SimulatorEvaluation.objects.filter(arm=arm, checkpoint=checkpoint)
            .filter(simulator__in=list(simulators), scenario_id__in=scenarios)
            .order_by("simulator", "scenario_id", "sample")
            .values_list("simulator", "conversation")
        )
        for name, conversation in rows:
            simulators[name].conversations += 1
            simulators[name].turns += [
                m["content"]
                for m in conversation or []
                if m.get("role") == "user" and isinstance(m.get("content"), str)
            ]
    people, participants = participant_turns(study)
    folder = space_dir or data_dir() / "sim2real" / study.slug / "behaviour_space"
    return behaviour_section(
        people,
        participants,
        list(simulators.values()),
        space_settings(),
        Path(folder),
        behaviour_embedder,
    )


def study_report(
    study: Study,
    ci_level: float = 0.95,
    conversations: int | None = None,
    humanlike: list[str] | None = None,
    space_dir: Path | None = None,
) -> dict[str, Any]:
    """The gap report of the study from what is stored, with `missing` (conversations not
    played yet), the study's slug and `behaviour` (each simulator beside the people, its
    space saved in `space_dir`, by default under the data folder); `humanlike` names the
    human-like simulators to show (default: every one fine-tuned on this study's people)."""
    if shared_domain(study.domain) is None:
        report = build_sim2real([], ci_level)
        report["errors"] = [
            "an open-chat study has no task: no outcome to set simulators against people"
        ]
        return {**report, "study": study.slug, "missing": 0}
    panels, notes = arm_panels(study)
    people, likert, reverse = human_values(study)
    scenarios = {s.pk for s in pool(study)}
    columns = humanlike_columns(study, humanlike)
    labels = {c.name: imitation_data.humanlike_label(c) for c in columns}
    arms = []
    for arm, checkpoint, panel in panels:
        names = {spec["name"] for spec in panel}
        rows = stored(arm, checkpoint, names, scenarios)
        played_by_humanlike = stored(arm, checkpoint, set(labels), scenarios)
        human = people.get(arm.name, {})
        arms.append(
            ArmData(
                name=arm.name,
                checkpoint=checkpoint.name if checkpoint else None,
                simulated=[Conversation(s, ok, r) for s, ok, r in rows],
                outcome=human.get("outcome", []),
                success=human.get("success", []),
                likert={key: human.get(key, []) for key in likert},
                humanlike=[Conversation(s, ok, r) for s, ok, r in played_by_humanlike],
            )
        )
    report = build_sim2real(arms, ci_level, reverse, labels)
    report["study"] = study.slug
    report["notes"] = notes + report["notes"]
    if not scenarios:
        report["notes"].append("the study's scenario pool is empty: nothing to play")
    report["missing"] = len(missing(study, conversations, humanlike))
    if report["missing"]:
        report["notes"].append(
            f"{report['missing']} simulator conversation(s) not played yet: the report covers "
            "what is stored (the evaluation job plays the rest)"
        )
    # what raters of an annotation study said about these conversations, when any did
    report["annotation"] = annotation_analysis.sim2real_annotation(study, report["arms"])
    report["behaviour"] = behaviour_report(study, panels, labels, scenarios, space_dir)
    return report


def stored(arm: Arm, checkpoint: Checkpoint | None, simulators: set[str], scenarios: set[int]):
    """(simulator, success, reward) of the arm's stored conversations with these simulators."""
    if checkpoint is None:
        return []
    return (
        SimulatorEvaluation.objects.filter(arm=arm, checkpoint=checkpoint, simulator__in=simulators)
        .filter(scenario_id__in=scenarios)
        .order_by("simulator", "scenario_id", "sample")
        .values_list("simulator", "success", "reward")
    )


def figures_svg(report: dict[str, Any]) -> dict[str, str]:
    """The report's figures by name: the gap, and the behaviour shares when there are any."""
    found = {
        "sim2real": sim2real_figure(report),
        "sim2real_behaviour": sim2real_behaviour_figure(report.get("behaviour")),
    }
    return {name: render_svg(f) for name, f in found.items() if f is not None}


def analysis_section(study: Study) -> tuple[dict[str, Any], dict[str, str]]:
    """The report's `sim2real` section and its figures, for an AnalysisRun."""
    report = study_report(study)
    return report, figures_svg(report)
