"""Queries compiled once and run again with other values: the chat turn's hot reads.

Django compiles a queryset's SQL each time it is evaluated, and for a short read that is most
of its CPU (bench/chat_load.py: about a third of a turn's database work). A chat turn runs the
same few reads thousands of times with only ids changing, so `Prepared` keeps Django's SQL and
its result converters and swaps the values in. Results are exactly the queryset's own
(tests/studies/lib/test_prepared.py compares them).
"""

import threading
from collections.abc import Callable

from django.db import connections
from django.db.models import Model, QuerySet

# Stand-ins for the values while Django compiles, found again among the compiled parameters:
# integers no query writes as a constant, inside every integer column's range (Django folds a
# comparison with an out-of-range value away).
_MARKER = 2_147_400_001


class Prepared:
    """`build(*values)` must return a `values_list` queryset whose parameters include each
    value as given (ids and other integers); `rows(*values)` runs it with those values."""

    def __init__(self, build: Callable[..., QuerySet], arity: int):
        self.build, self.arity = build, arity
        self._compiled: dict[str, tuple] = {}  # by database alias
        self._lock = threading.Lock()

    def _compile(self, alias: str) -> tuple:
        markers = [_MARKER + i for i in range(self.arity)]
        queryset = self.build(*markers)
        compiler = queryset.query.get_compiler(using=alias)
        sql, params = compiler.as_sql()
        slots = [markers.index(p) if isinstance(p, int) and p in markers else None for p in params]
        missing = set(range(self.arity)) - set(slots)
        if missing:
            raise ValueError(f"Values {sorted(missing)} do not appear in the query's parameters")
        return compiler, sql, tuple(params), tuple(slots)

    def rows(self, *values, using: str = "default") -> list[tuple]:
        if len(values) != self.arity:
            raise TypeError(f"expected {self.arity} values, got {len(values)}")
        compiled = self._compiled.get(using)
        if compiled is None:  # compiled inside the caller's transaction (FOR UPDATE needs one)
            with self._lock:
                compiled = self._compiled.setdefault(using, self._compile(using))
        compiler, sql, params, slots = compiled
        params = [p if s is None else values[s] for p, s in zip(params, slots, strict=True)]
        with connections[using].cursor() as cursor:
            cursor.execute(sql, params)
            fetched = cursor.fetchall()
        return list(compiler.results_iter(results=[fetched], tuple_expected=True))


def fields_of(model: type[Model]) -> list[str]:
    """Every concrete field's attribute name, in the order `Model.from_db` takes values."""
    return [f.attname for f in model._meta.concrete_fields]


def instances(model: type[Model], rows: list[tuple], using: str = "default") -> list:
    names = fields_of(model)
    return [model.from_db(using, names, row) for row in rows]
