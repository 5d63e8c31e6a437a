"""COLLAPSE-AWARE's breaker driven by scripted sequences of measures: thresholds from the
quantiles of the first N steps (not constants), green -> yellow -> green (the way back, with
its hysteresis), green -> yellow -> red, yellow lasting red_after steps, red without a stop,
each transition with the measures that caused it, and its state through a checkpoint."""

import json

import pytest

from training.config import parse_config
from training.config_keys import ConfigError
from training.config_schema import BreakerSpec
from training.measures.breaker import (
    GREEN,
    RED,
    YELLOW,
    Breaker,
    judged,
    last_stop,
    quantile,
)

SCD = "behaviour/decision/probe/scd"


def spec(**more) -> BreakerSpec:
    settings = {
        "enabled": True,
        "measures": ["scd"],
        "warmup": 4,
        "yellow_quantile": 0.5,
        "red_quantile": 1.0,
        "red_margin": 1.0,
        "yellow_step": 0.25,
        "recover_steps": 2,
    } | more
    return BreakerSpec(**settings)


def drive(breaker: Breaker, values: list[float | None], first: int = 1, key: str = SCD):
    """One row a step, `key` scripted (None: not measured that step); the levels and events."""
    levels, events = [], []
    for step, value in enumerate(values, start=first):
        row = {"step": step, "reward_mean": 0.5} | ({key: value} if value is not None else {})
        verdict = breaker.observe(step, row)
        levels.append(verdict.level)
        events += verdict.events
    return levels, events


def test_quantile_is_type_7():
    # numpy's default: h = (n - 1) q, interpolated between the order statistics around it
    assert quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.9) == pytest.approx(3.7)
    assert quantile([1.0, 2.0, 3.0, 4.0], 1.0) == 4.0
    assert quantile([5.0], 0.3) == 5.0


def test_thresholds_are_quantiles_of_the_first_n_steps():
    """The same later values judged against two warmups: each run's own thresholds decide. A
    breaker with constant thresholds gives both the same levels and fails here."""
    low, high = Breaker(spec(), 0.0), Breaker(spec(), 0.0)
    _, (fit,) = drive(low, [0.10, 0.20, 0.30, 0.40])
    assert fit["event"] == "fit" and fit["step"] == 4
    # yellow: the median of 0.1..0.4 = 0.25; red: their maximum + 1 x their range (0.3) = 0.7
    assert fit["thresholds"][SCD]["yellow"] == pytest.approx(0.25)
    assert fit["thresholds"][SCD]["red"] == pytest.approx(0.7)
    drive(high, [0.50, 0.60, 0.70, 0.80])
    assert high.thresholds[SCD]["yellow"] == pytest.approx(0.65)
    assert high.thresholds[SCD]["red"] == pytest.approx(1.1)
    later = [0.5, 0.5]
    assert drive(low, later, first=5)[0] == [YELLOW, YELLOW]
    assert drive(high, later, first=5)[0] == [GREEN, GREEN]
    # nothing is judged while warming up, however high
    warming = Breaker(spec(), 0.0)
    assert drive(warming, [0.9, 0.99, 1.0])[0] == [GREEN] * 3 and warming.thresholds is None


def test_green_yellow_green_raises_the_synthesis_share_and_takes_it_back():
    breaker = Breaker(spec(), 0.1)
    drive(breaker, [0.1, 0.2, 0.3, 0.4])  # yellow > 0.25, red > 0.7
    shares = []
    levels, events = [], []
    for step, value in enumerate([0.5, 0.6, 0.2, 0.5, 0.2, 0.1, 0.1], start=5):
        verdict = breaker.observe(step, {SCD: value})
        levels.append(verdict.level)
        shares.append(verdict.share)
        events += verdict.events
        assert verdict.row() == {
            "breaker/level": float([GREEN, YELLOW, RED].index(verdict.level)),
            "breaker/synthesis_share": verdict.share,
        }
    # up at once; down only after recover_steps = 2 calm steps in a row (the 0.5 at step 8
    # starts the count again)
    assert levels == [YELLOW, YELLOW, YELLOW, YELLOW, YELLOW, GREEN, GREEN]
    assert shares == pytest.approx([0.35, 0.35, 0.35, 0.35, 0.35, 0.1, 0.1])
    up, down = events
    assert (up["from"], up["to"], up["step"]) == (GREEN, YELLOW, 5)
    assert up["measures"] == {
        SCD: {"value": 0.5, "yellow": pytest.approx(0.25), "red": pytest.approx(0.7)}
    }
    assert "0.5" in up["message"] and "synthesis share 0.35" in up["message"]
    assert (down["from"], down["to"], down["step"]) == (YELLOW, GREEN, 10)
    assert down["measures"][SCD]["value"] == 0.1 and not up["stops"] and not down["stops"]


def test_the_share_never_passes_one_and_returns_to_where_it_was():
    breaker = Breaker(spec(yellow_step=0.5), 0.8)
    drive(breaker, [0.1, 0.2, 0.3, 0.4, 0.5])
    assert breaker.share == 1.0
    drive(breaker, [0.1, 0.1], first=6)
    assert breaker.level == GREEN and breaker.share == pytest.approx(0.8)


def test_green_yellow_red_stops_and_names_the_measures():
    breaker = Breaker(spec(), 0.0)
    levels, events = drive(breaker, [0.1, 0.2, 0.3, 0.4, 0.5, 0.9])
    assert levels[4:] == [YELLOW, RED]
    red = events[-1]
    assert (red["from"], red["to"], red["step"], red["stops"]) == (YELLOW, RED, 6, True)
    assert red["measures"] == {
        SCD: {"value": 0.9, "yellow": pytest.approx(0.25), "red": pytest.approx(0.7)}
    }
    assert SCD in red["reason"] and "0.9" in red["reason"]
    assert breaker.stopped == {"step": 6, "reason": red["reason"]}
    # straight from green to red also stops (and raises the share, as leaving green does)
    direct = Breaker(spec(), 0.0)
    levels, events = drive(direct, [0.1, 0.2, 0.3, 0.4, 0.95])
    assert levels[-1] == RED and events[-1]["from"] == GREEN and events[-1]["stops"]
    assert direct.share == 0.25


def test_red_comes_back_one_level_at_a_time_and_stops_once_per_entry():
    breaker = Breaker(spec(), 0.0)
    drive(breaker, [0.1, 0.2, 0.3, 0.4, 0.9])
    breaker.resumed(5, "reset")
    levels, events = drive(breaker, [0.9, 0.5, 0.5, 0.1, 0.1, 0.9], first=6)
    # still red: no second stop; two steps below red: yellow; two below yellow: green; up again
    assert levels == [RED, RED, YELLOW, YELLOW, GREEN, RED]
    assert [(e["from"], e["to"], e["stops"]) for e in events] == [
        (RED, YELLOW, False),
        (YELLOW, GREEN, False),
        (GREEN, RED, True),
    ]


def test_yellow_lasting_red_after_steps_turns_red():
    breaker = Breaker(spec(red_after=3), 0.0)
    levels, events = drive(breaker, [0.1, 0.2, 0.3, 0.4, 0.5, 0.5, 0.5])
    assert levels[4:] == [YELLOW, YELLOW, RED]
    assert events[-1]["why"] == "yellow for 3 steps in a row" and events[-1]["stops"]


def test_red_without_a_stop_rediversifies_at_once():
    breaker = Breaker(spec(red_stops=False), 0.0)
    drive(breaker, [0.1, 0.2, 0.3, 0.4])
    verdict = breaker.observe(5, {SCD: 0.9})
    assert verdict.level == RED and verdict.rediversify and not verdict.stop
    assert breaker.stopped is None


def test_psod_is_judged_at_evaluation_steps_and_keeps_its_reading_between():
    breaker = Breaker(spec(measures=["scd", "psod"], recover_steps=1), 0.0)
    rows = [
        {SCD: 0.1, "psod/training": 0.0},
        {SCD: 0.1},
        {SCD: 0.1, "psod/training": 0.2},
        {SCD: 0.1},
    ]
    for step, row in enumerate(rows, start=1):
        breaker.observe(step, row)
    assert breaker.thresholds["psod/training"]["values"] == 2
    assert breaker.thresholds["psod/training"]["yellow"] == pytest.approx(0.1)
    assert breaker.observe(5, {SCD: 0.1, "psod/training": 0.3}).level == YELLOW
    # no PSOD at step 6: its last reading (0.3) still stands, so no way back yet
    assert breaker.observe(6, {SCD: 0.1}).level == YELLOW
    assert breaker.observe(7, {SCD: 0.1, "psod/training": 0.0}).level == GREEN


def test_scd_names_every_probe_space_and_psod_the_training_simulators():
    row = {
        "behaviour/clusters/probe/scd": 0.4,
        "behaviour/clusters/pooled/scd": 0.9,
        "behaviour/decision/probe/scd": 0.2,
        "behaviour/clusters/probe/scd/lo": 0.3,
        "psod/training": 0.1,
        "psod/base": 0.5,
        "psod/current": float("nan"),
    }
    assert judged(["scd", "psod"], row) == {
        "behaviour/clusters/probe/scd": 0.4,
        "behaviour/decision/probe/scd": 0.2,
        "psod/training": 0.1,
    }
    assert judged(["psod/current", "psod/base"], row) == {"psod/base": 0.5}


def test_a_measure_without_warmup_values_is_said_unjudged():
    breaker = Breaker(spec(measures=["scd", "psod/current"]), 0.0)
    _, (fit,) = drive(breaker, [0.1, 0.2, 0.3, 0.4])
    assert fit["unjudged"] == ["psod/current"] and "not judged: psod/current" in fit["message"]


def test_the_state_survives_a_checkpoint():
    """A breaker rebuilt from its saved state judges the rest of a sequence as the one that
    never stopped."""
    values = [0.1, 0.2, 0.3, 0.4, 0.5, 0.2, 0.1, 0.6, 0.9, 0.1]
    whole = Breaker(spec(), 0.1)
    expected, _ = drive(whole, values)
    first = Breaker(spec(), 0.1)
    head, _ = drive(first, values[:6])
    saved = json.loads(json.dumps(first.state()))
    again = Breaker(spec(), 0.0, saved)  # the saved base share wins over the one given
    tail, _ = drive(again, values[6:], first=7)
    assert head + tail == expected and again.state() == whole.state()


def test_last_stop_is_the_red_stop_not_yet_resumed(tmp_path):
    stop = {"event": "transition", "step": 6, "to": RED, "stops": True, "reason": "why"}
    lines = [{"event": "fit", "step": 4}, stop]
    (tmp_path / "breaker.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert last_stop(tmp_path)["reason"] == "why"
    lines.append({"event": "resume", "step": 6})
    (tmp_path / "breaker.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert last_stop(tmp_path) is None and last_stop(tmp_path / "none") is None


@pytest.mark.parametrize(
    "breaker, more, key, message",
    [
        ({"enabled": True}, {}, "breaker.enabled", "needs [behaviour]"),
        (
            {"enabled": True, "red_quantile": 0.5},
            {"behaviour": {"decisions_only": True}},
            "breaker.red_quantile",
            "at least yellow_quantile",
        ),
        (
            {"enabled": True, "measures": ["bdi"]},
            {"behaviour": {"decisions_only": True}},
            "breaker.measures",
            "'bdi'",
        ),
        (
            {"enabled": True},
            {"behaviour": {"decisions_only": True}},
            "breaker.measures",
            "needs a held-out panel",
        ),
        (
            {"enabled": True, "warmup": 4},
            {
                "behaviour": {"decisions_only": True},
                "eval_every": 8,
                "heldout": [{"name": "s", "kind": "scripted", "script": "steady"}],
            },
            "breaker.warmup",
            "eval_every <= warmup",
        ),
        (
            {"enabled": True, "warmup": 1},
            {"behaviour": {"decisions_only": True}},
            "breaker.warmup",
            "must be >= 2 and <= 100000",
        ),
    ],
)
def test_bad_breaker_settings_are_clear_errors(breaker, more, key, message):
    with pytest.raises(ConfigError) as error:
        parse_config({"name": "b", "domain": "p4g", "breaker": breaker, **more})
    assert error.value.key == key and message in str(error.value)


def test_off_by_default_and_allowed_without_behaviour_when_off():
    config = parse_config({"name": "b", "domain": "p4g"})
    assert not config.breaker.enabled and config.breaker.measures == ["scd", "psod"]
