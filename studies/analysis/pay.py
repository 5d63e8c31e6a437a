"""Pay check: a study's reward as an hourly rate at the median completion time, against Prolific.

Prolific's rules (docs/help centre; see the reference notes): pay is judged per hour from the
median completion time; the minimum is 6.00 GBP / 8.00 USD an hour and the recommended rate
9.00 GBP / 12.00 USD an hour; ``reward`` is in pence/cents. Prolific's live figures come from
``GET /api/v1/reward-recommendations/``; these are the documented ones, kept here as data.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

# pence/cents per hour: (minimum, recommended)
RATES = {"GBP": (600, 900), "USD": (800, 1200)}
SYMBOLS = {"GBP": "£", "USD": "$"}

NO_REWARD = "no_reward"
NO_COMPLETIONS = "no_completions"
BELOW_MINIMUM = "below_minimum"
BELOW_RECOMMENDED = "below_recommended"
OK = "ok"
WARNINGS = (BELOW_MINIMUM, BELOW_RECOMMENDED)


def money(cents: float, currency: str) -> str:
    return f"{SYMBOLS.get(currency, '')}{cents / 100:.2f}" + (
        "" if currency in SYMBOLS else f" {currency}"
    )


def duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def reward_for(rate_cents: int, seconds: float) -> int:
    """The smallest whole reward (pence/cents) that pays ``rate_cents`` an hour at ``seconds``."""
    return math.ceil(rate_cents * seconds / 3600)


@dataclass(frozen=True)
class PayCheck:
    level: str  # one of NO_REWARD, NO_COMPLETIONS, BELOW_MINIMUM, BELOW_RECOMMENDED, OK
    message: str
    currency: str
    reward: int | None  # pence/cents per participant
    completions: int
    median_seconds: float | None = None
    hourly: float | None = None  # pence/cents per hour at the median time
    minimum: int | None = None  # Prolific's minimum, pence/cents per hour
    recommended: int | None = None

    @property
    def warning(self) -> bool:
        return self.level in WARNINGS

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "warning": self.warning}


def check(reward: int | None, currency: str, seconds: Iterable[float]) -> PayCheck:
    """The pay check of a reward (pence/cents) given the completion times (seconds) so far."""
    if currency not in RATES:
        raise ValueError(f"no Prolific pay rates for currency {currency!r}; known: {sorted(RATES)}")
    minimum, recommended = RATES[currency]
    # A negative time (a clock set back) is not a completion time; leave it out.
    times = sorted(float(s) for s in seconds if s is not None and math.isfinite(s) and s >= 0)
    base = {"currency": currency, "reward": reward, "completions": len(times)}
    base.update(minimum=minimum, recommended=recommended)
    rates = (
        f"Prolific's minimum is {money(minimum, currency)}/h, "
        f"recommended {money(recommended, currency)}/h"
    )
    if not times:
        note = "No completions yet: the hourly rate is computed from the median completion time."
        if reward is None:
            note += " No reward is set either."
        return PayCheck(NO_COMPLETIONS, f"{note} {rates}.", **base)
    median = statistics.median(times)
    spent = f"median completion time {duration(median)} over {len(times)} completion(s)"
    if reward is None:
        return PayCheck(
            NO_REWARD,
            f"No reward set: set the study's reward to check it ({spent}; {rates}).",
            median_seconds=median,
            **base,
        )
    if median == 0:
        return PayCheck(OK, f"The {spent}: no hourly rate to compute.", median_seconds=0, **base)
    hourly = reward * 3600 / median
    paid = f"{money(reward, currency)} at the {spent} pays {money(hourly, currency)}/h"
    if hourly < minimum:
        level = BELOW_MINIMUM
        text = (
            f"{paid}, below Prolific's minimum of {money(minimum, currency)}/h: raise the reward "
            f"to at least {money(reward_for(minimum, median), currency)} (recommended "
            f"{money(reward_for(recommended, median), currency)})."
        )
    elif hourly < recommended:
        level = BELOW_RECOMMENDED
        text = (
            f"{paid}, below Prolific's recommended {money(recommended, currency)}/h (minimum "
            f"{money(minimum, currency)}/h): the recommended rate needs a reward of "
            f"{money(reward_for(recommended, median), currency)}."
        )
    else:
        level, text = OK, f"{paid}, at or above Prolific's recommended rate ({rates})."
    return PayCheck(level, text, median_seconds=median, hourly=hourly, **base)
