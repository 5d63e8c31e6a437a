"""Reading a study table and cleaning it for analysis.

A table is wide: one row per participant, one column for the arm, one per
measure, and optional exclusion columns (``attention_passed``, ``finished``).
Cells may be strings (a CSV) or numbers (the database); both go through the
same coercion so a blank, an "NA" or a stray word is counted, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import csvfile

MISSING_TOKENS = frozenset({"", "na", "n/a", "nan", "null", "none", "."})
TRUE_TOKENS = frozenset({"true", "t", "yes", "y", "1", "1.0", "pass", "passed"})
FALSE_TOKENS = frozenset({"false", "f", "no", "n", "0", "0.0", "fail", "failed"})
MAX_EXAMPLES = 5


class TableError(ValueError):
    """The table cannot be read at all (unreadable or empty file, a long table missing a column)."""


def read_csv(path, delimiter: str = ",") -> pd.DataFrame:
    """All cells as text, so arm names like "01" and bad cells survive for reporting."""
    try:
        table = pd.read_csv(
            path,
            dtype=str,
            keep_default_na=False,
            sep=delimiter,
            encoding="utf-8-sig",
            skipinitialspace=True,
        )
    except pd.errors.EmptyDataError as exc:
        raise TableError(f"CSV file {path} is empty") from exc
    except (OSError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise TableError(f"cannot read CSV file {path}: {exc}") from exc
    # Cells parley's writer (csvfile) guarded against spreadsheets come back as written.
    table.columns = [csvfile.restore(str(c)) for c in table.columns]
    for name in table.columns.unique():
        column = table[name]
        if isinstance(column, pd.Series):  # a repeated column is reported, not restored
            guarded = column.str.match(csvfile.GUARDED).fillna(False).to_numpy(dtype=bool)
            if guarded.any():
                table[name] = column.where(~guarded, column.str[1:])
    return table


def _as_text(column: pd.Series) -> pd.Series:
    return column.astype(object).where(column.notna(), "").astype(str).str.strip()


def _missing_mask(column: pd.Series, text: pd.Series | None = None) -> np.ndarray:
    """Blank or NA cells; ``text`` is the column already stripped to text, if at hand."""
    if pd.api.types.is_numeric_dtype(column):
        return column.isna().to_numpy()
    text = _as_text(column) if text is None else text
    return column.isna().to_numpy() | text.str.lower().isin(MISSING_TOKENS).to_numpy()


def examples(column: pd.Series, mask: np.ndarray) -> list[str]:
    """Up to MAX_EXAMPLES distinct cells of ``column`` where ``mask`` holds, as text."""
    if not mask.any():
        return []
    return [str(v) for v in pd.unique(column[mask].astype(object))[:MAX_EXAMPLES]]


@dataclass
class Column:
    """A measure column as numbers, with what could not be read."""

    values: np.ndarray  # float, NaN where missing or invalid
    missing: np.ndarray  # bool: blank / NA
    invalid: np.ndarray  # bool: present but not a finite number


def numeric_column(column: pd.Series) -> Column:
    """Coerce a column to floats; blanks are missing, anything else unreadable is invalid."""
    if pd.api.types.is_bool_dtype(column):
        column = column.astype(float)
    if pd.api.types.is_numeric_dtype(column):
        missing = _missing_mask(column)
        values = column.to_numpy(dtype=float, na_value=np.nan)
    else:
        text = _as_text(column)
        missing = _missing_mask(column, text)
        values = pd.to_numeric(text, errors="coerce").to_numpy(dtype=float)
    invalid = ~missing & ~np.isfinite(values)
    values = np.where(invalid | missing, np.nan, values)
    return Column(values, missing, invalid)


@dataclass
class Flag:
    """A yes/no column: True, False, or unknown (blank); unreadable cells are counted."""

    true: np.ndarray
    false: np.ndarray
    unreadable: int = 0
    unreadable_examples: list[str] = field(default_factory=list)


def flag_column(column: pd.Series) -> Flag:
    """Read true/false/yes/no/1/0/pass/fail (any case); blank means unknown."""
    if pd.api.types.is_bool_dtype(column):
        known = column.notna().to_numpy()
        true = column.fillna(False).astype(bool).to_numpy() & known
        return Flag(true, ~column.fillna(True).astype(bool).to_numpy() & known)
    text = _as_text(column)
    lower = text.str.lower()
    true = lower.isin(TRUE_TOKENS).to_numpy()
    false = lower.isin(FALSE_TOKENS).to_numpy()
    unreadable = ~true & ~false & ~_missing_mask(column, text)
    return Flag(true, false, int(unreadable.sum()), examples(column, unreadable))


def arm_labels(column: pd.Series) -> np.ndarray:
    """Arm names as stripped strings; blank arms become ""."""
    labels = _as_text(column)
    return np.where(labels.str.lower().isin(MISSING_TOKENS), "", labels).astype(object)


def wide_from_long(
    long: pd.DataFrame,
    participant: str = "participant",
    measure: str = "item",
    value: str = "value",
) -> pd.DataFrame:
    """One row per participant and a column per measure, from (participant, measure, value) rows.

    A participant who answered an item twice keeps the last answer; missing
    answers become NaN (counted as missing by the report).
    """
    for name in (participant, measure, value):
        if name not in long.columns:
            raise TableError(f"long table has no column {name!r}; it has {list(long.columns)}")
    last = long.drop_duplicates([participant, measure], keep="last")
    wide = last.pivot(index=participant, columns=measure, values=value)
    wide.columns.name = None
    return wide.reset_index()
