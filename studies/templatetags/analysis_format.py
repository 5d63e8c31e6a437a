"""How the analysis page prints a report's numbers: undefined values and CIs read "n/a"."""

from django import template
from django.template.defaultfilters import floatformat

from studies.analysis.text import interval as interval_text

register = template.Library()


@register.filter
def number(value, places=3):
    """A statistic to ``places`` decimals; null (not finite, undefined) is "n/a", never blank."""
    return "n/a" if value is None else floatformat(value, places)


@register.filter
def interval(pair):
    """ "[low, high]" to 3 decimals, or "n/a" for an undefined CI (never "[, ]")."""
    return interval_text(pair)


@register.filter
def ci_header(report):
    return f"{report.get('settings', {}).get('ci_level', 0.95):.0%} CI"


@register.filter
def at(values, index):
    """values[index], or None past its end (a row of a table laid out by column)."""
    return values[index] if values is not None and 0 <= index < len(values) else None
