"""One conversation's copy of a tau2 database, copied on write.

The official DBs are a few MB; copying one per conversation (and twice more to score it) would
dominate training and replay time. A Store shares every record with the read-only base and deep
copies a record the first time a tool edits it, so a fresh copy costs one dict() per table.
Tools must take records through `edit` before changing them; the tests check the base stays intact.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

Tables = dict[str, dict[str, Any]]


def canonical_json(value: Any) -> str:
    """The text tau2 hashes: json.dumps with sorted keys, str() for anything else."""
    return json.dumps(value, sort_keys=True, default=str)


class Store:
    def __init__(self, base: Tables):
        self.base = base
        self.tables: Tables = {name: dict(table) for name, table in base.items()}
        self._owned: set[tuple[str, str]] = set()

    def get(self, table: str, key: Any) -> Any:
        """A record to read (KeyError if absent). Never change it: take it through `edit`."""
        return self.tables[table][key]

    def edit(self, table: str, key: Any) -> Any:
        """This conversation's own copy of a record, safe to change."""
        record = self.tables[table][key]
        if (table, key) not in self._owned:
            record = self.tables[table][key] = copy.deepcopy(record)
            self._owned.add((table, key))
        return record

    def put(self, table: str, key: Any, record: Any) -> None:
        self.tables[table][key] = record
        self._owned.add((table, key))

    def changed(self) -> dict[str, list]:
        """Keys of the records this conversation copied or added, per table."""
        out: dict[str, list] = {}
        for table, key in sorted(self._owned, key=str):
            out.setdefault(table, []).append(key)
        return out

    def same_as(self, other: Store) -> bool:
        """Whole-DB equality in canonical form (what equal hashes mean), comparing only records
        that are not the very same shared object."""
        if self.tables.keys() != other.tables.keys():
            return False
        for name, mine in self.tables.items():
            theirs = other.tables[name]
            if mine.keys() != theirs.keys():
                return False
            for key in {k for t, k in self._owned | other._owned if t == name}:
                a, b = mine.get(key), theirs.get(key)
                if a is not b and canonical_json(a) != canonical_json(b):
                    return False
        return True

    def digest(self, cache: dict | None = None) -> str:
        """sha256 of the canonical JSON of the whole DB: the hash tau2's DB check compares.
        `cache` (kept beside the base) holds the JSON of shared records so only copies are dumped."""
        if not all(
            isinstance(t, dict) and all(isinstance(k, str) for k in t) for t in self.tables.values()
        ):
            return hashlib.sha256(canonical_json(self.tables).encode()).hexdigest()
        parts = []
        for name in sorted(self.tables):
            table = self.tables[name]
            shared = cache.setdefault(name, {}) if cache is not None else {}
            rows = []
            for key in sorted(table):
                record = table[key]
                if (name, key) in self._owned:
                    text = canonical_json(record)
                else:
                    text = shared.get(key)
                    if text is None:
                        text = shared[key] = canonical_json(record)
                rows.append(f"{json.dumps(key)}: {text}")
            parts.append(f"{json.dumps(name)}: {{{', '.join(rows)}}}")
        return hashlib.sha256(f"{{{', '.join(parts)}}}".encode()).hexdigest()
