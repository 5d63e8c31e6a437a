"""Queries compiled once and run again with other values: the chat turn's hot reads.

Django compiles a queryset's SQL each time it is evaluated, and for a short read that is most
of its CPU (bench/chat_load.py: about a third of a turn's database work). A chat turn runs the
same few reads thousands of times with only ids changing, so `Prepared` keeps Django's SQL and
its result converters and swaps the values in. Results are exactly the queryset's own
(tests/studies/lib/test_prepared.py compares them, for each kind of value, on SQLite and on
PostgreSQL).

It leans on Django's compiler internals (docs/development.md, "Framework internals", lists them;
tests/platform/test_framework_internals.py fails when an upgrade changes them).
PARLEY_COMPILED_READS=0 sends every read through Django's own query path instead.
"""

import threading
import uuid
from collections.abc import Callable

from django.conf import settings
from django.db import connections
from django.db.models import Model, QuerySet
from django.db.models.query import ModelIterable, get_related_populators

# Stand-ins for the values while Django compiles, found again among the compiled parameters:
# integers no query writes as a constant, inside every integer column's range (Django folds a
# comparison with an out-of-range value away); for a UUID column, UUIDs made of them.
_MARKER = 2_147_400_001

# The kinds of value a compiled read takes. A backend may send a value in another form than the
# Python one (SQLite and MySQL send a UUID as its 32-digit hex text: UUIDField.get_db_prep_value),
# so each kind lists the forms a compiled parameter can take, and a value is sent in the form its
# marker was found in.
FORMS: dict[type, tuple[Callable, ...]] = {
    int: (lambda v: v,),
    str: (lambda v: v,),
    uuid.UUID: (lambda v: v, lambda v: v.hex, str),
}


def marker(kind: type, i: int):
    if kind is uuid.UUID:
        return uuid.UUID(int=_MARKER + i)
    if kind is str:
        return f"\x00prepared-{_MARKER + i}"  # no stored text holds a NUL (PostgreSQL refuses it)
    return _MARKER + i


class Prepared:
    """`build(*values)` must return a queryset whose parameters include each value as given
    (ids and other integers, UUIDs or exact text: `kinds` names each value's type, int by
    default).
    `rows(*values)` runs a `values_list` queryset with those values; `objects(*values)` a
    queryset of model instances (select_related included; not prefetch_related)."""

    def __init__(self, build: Callable[..., QuerySet], arity: int, kinds: tuple[type, ...] = ()):
        self.build, self.arity = build, arity
        self.kinds = kinds or (int,) * arity
        if len(self.kinds) != arity:
            raise TypeError(f"{arity} values but {len(self.kinds)} kinds")
        unknown = [kind for kind in self.kinds if kind not in FORMS]
        if unknown:
            raise TypeError(
                f"a compiled read takes {', '.join(k.__name__ for k in FORMS)}: not {unknown}"
            )
        self._compiled: dict[str, tuple] = {}  # by database alias
        self._lock = threading.Lock()

    def _compile(self, alias: str) -> tuple:
        markers = [marker(kind, i) for i, kind in enumerate(self.kinds)]
        queryset = self.build(*markers)
        compiler = queryset.query.get_compiler(using=alias)
        sql, params = compiler.as_sql()

        def slot(param):  # a value's place and form (an int may come wrapped: psycopg's Int4)
            if isinstance(param, bool):
                return None
            for i, (kind, m) in enumerate(zip(self.kinds, markers, strict=True)):
                for form in FORMS[kind]:
                    sent = form(m)
                    if isinstance(param, type(sent)) and param == sent:
                        return i, form
            return None

        slots = [slot(p) for p in params]
        missing = set(range(self.arity)) - {s[0] for s in slots if s is not None}
        if missing:
            raise ValueError(f"Values {sorted(missing)} do not appear in the query's parameters")
        build = None
        if queryset._iterable_class is ModelIterable:  # how Django's ModelIterable makes them
            if queryset._prefetch_related_lookups:
                raise ValueError("prefetch_related is not prepared: prefetch after `objects`")
            start, end = (
                compiler.klass_info["select_fields"][0],
                compiler.klass_info["select_fields"][-1] + 1,
            )
            names = [column[0].target.attname for column in compiler.select[start:end]]
            build = (
                compiler.klass_info["model"],
                start,
                end,
                names,
                get_related_populators(compiler.klass_info, compiler.select, alias),
                dict(compiler.annotation_col_map or {}),
            )
        return compiler, sql, tuple(params), tuple(slots), build

    def _fetch(self, values, using: str) -> tuple[tuple | bool, list]:
        if len(values) != self.arity:
            raise TypeError(f"expected {self.arity} values, got {len(values)}")
        for value, kind in zip(values, self.kinds, strict=True):
            if not isinstance(value, kind) or isinstance(value, bool):
                raise TypeError(f"a {kind.__name__} was expected, not {value!r}")
        if not settings.PARLEY_COMPILED_READS:  # Django's own path, value for value the same
            queryset = self.build(*values).using(using)
            if queryset._prefetch_related_lookups:
                raise ValueError("prefetch_related is not prepared: prefetch after `objects`")
            return queryset._iterable_class is ModelIterable, list(queryset)
        compiled = self._compiled.get(using)
        if compiled is None:  # compiled inside the caller's transaction (FOR UPDATE needs one)
            with self._lock:
                compiled = self._compiled.setdefault(using, self._compile(using))
        compiler, sql, params, slots, _ = compiled
        params = [
            p if s is None else s[1](values[s[0]]) for p, s in zip(params, slots, strict=True)
        ]
        with connections[using].cursor() as cursor:
            cursor.execute(sql, params)
            fetched = cursor.fetchall()
        return compiled, list(compiler.results_iter(results=[fetched], tuple_expected=True))

    def rows(self, *values, using: str = "default") -> list[tuple]:
        return self._fetch(values, using)[1]

    def objects(self, *values, using: str = "default") -> list[Model]:
        compiled, rows = self._fetch(values, using)
        made_by_django = isinstance(compiled, bool)  # compiled reads off: is it instances?
        build = compiled if made_by_django else compiled[4]
        if not build:
            raise TypeError("objects() needs a queryset of model instances, not values")
        if made_by_django:
            return rows
        model, start, end, names, populators, annotations = build
        made = []
        for row in rows:
            instance = model.from_db(using, names, row[start:end])
            for populator in populators:
                populator.populate(row, instance)
            for name, position in annotations.items():
                setattr(instance, name, row[position])
            made.append(instance)
        return made


def fields_of(model: type[Model]) -> list[str]:
    """Every concrete field's attribute name, in the order `Model.from_db` takes values."""
    return [f.attname for f in model._meta.concrete_fields]


def instances(model: type[Model], rows: list[tuple], using: str = "default") -> list:
    names = fields_of(model)
    return [model.from_db(using, names, row) for row in rows]
