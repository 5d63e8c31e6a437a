"""Every CSV parley writes goes through here: integers as integers, and no cell a spreadsheet runs.

CSV injection (OWASP): a cell starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage
return is read by Excel, LibreOffice and Sheets as a formula. Such text cells get a leading
``'`` (the spreadsheet shows the text as typed, the quote hidden). So that reading back is exact
for every text, a text that already starts with quotes before such a character (``'=x``) gets
one more: ``restore`` takes exactly one quote off a cell of that shape and leaves all else.

Numbers are decided by their type, not by their first character: an int, float, Decimal or
numpy number (``-3``, ``-0.5``) is data the code produced, written as a plain number and never
quoted, so a negative reward stays numeric in a spreadsheet. Text is never trusted, even when it
looks like a number: a free-text answer ``-1`` or ``-2+3`` gets the quote, because a participant
typed it and only a number the code itself produced is known not to be a formula.
"""

from __future__ import annotations

import csv
import io
import math
import numbers
import re
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

import pandas as pd

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# A text cell that ``cell`` neutralised: one or more quotes, then a formula start.
GUARDED = re.compile("'+[=+\\-@\t\r]")
QUOTED = re.compile("'*[=+\\-@\t\r]")  # a text that gets one more quote when written


def cell(value: Any) -> Any:
    """One value as the CSV writer should see it: "" for missing, 6.0 as "6", text neutralised."""
    if value is None or value is pd.NA or value is pd.NaT:
        return ""
    if isinstance(value, bool):  # bool is an int: keep True/False, not 1/0
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, Decimal | numbers.Real):
        number = float(value)
        if math.isnan(number):
            return ""
        if math.isinf(number):
            return "inf" if number > 0 else "-inf"
        # A Likert answer stored as 6.0 is the integer 6; 6.25 stays as written (repr: exact).
        return str(int(number)) if number.is_integer() and abs(number) < 2**63 else repr(number)
    text = str(value)
    return "'" + text if QUOTED.match(text) else text


def restore(text: str) -> str:
    """The text ``cell`` neutralised, as it was: parley reads its own CSVs back (a stored
    analysis input is redone from its CSV) without the quote becoming part of an arm's name."""
    return text[1:] if GUARDED.match(text) else text


def row(values: Iterable[Any]) -> list[Any]:
    return [cell(v) for v in values]


class Writer:
    """``csv.writer`` whose rows go through ``cell``; writerow returns what was written."""

    def __init__(self, out, **options):
        self._writer = csv.writer(out, **options)

    def writerow(self, values: Iterable[Any]):
        return self._writer.writerow(row(values))

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        for values in rows:
            self.writerow(values)


def to_text(rows: Iterable[Iterable[Any]]) -> str:
    """Rows (a header first, if any) as CSV text."""
    out = io.StringIO()
    Writer(out).writerows(rows)
    return out.getvalue()


def table_text(table) -> str:
    """A pandas DataFrame as CSV text (header, then rows) through ``cell``; no index column."""
    return to_text([list(table.columns), *table.itertuples(index=False, name=None)])
