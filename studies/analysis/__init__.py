"""Study analysis without Django: Welch t-tests, Holm-Bonferroni, Hedges' g, plots.

    from studies.analysis import Settings, build_report, read_csv
    report = build_report(read_csv("data.csv"), Settings("arm", ("helpfulness", "overall")))

The report format is documented in ``studies.analysis.report``.
"""

from .report import FORMAT, Settings, build_report
from .table import TableError, read_csv, wide_from_long
from .text import format_report, to_json

__all__ = [
    "FORMAT",
    "Settings",
    "TableError",
    "build_report",
    "format_report",
    "read_csv",
    "to_json",
    "wide_from_long",
]
