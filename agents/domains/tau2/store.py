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
        self.tables: Tables = {name: dict(table) for name, table in base.items()}
        self._owned: set[tuple[str, str]] = set()
        self._digest: str | None = None  # forgotten whenever a record is taken for editing

    def get(self, table: str, key: Any) -> Any:
        """A record to read (KeyError if absent). Never change it: take it through `edit`."""
        return self.tables[table][key]

    def edit(self, table: str, key: Any) -> Any:
        """This conversation's own copy of a record, safe to change."""
        record = self.tables[table][key]
        self._digest = None
        if (table, key) not in self._owned:
            record = self.tables[table][key] = copy.deepcopy(record)
            self._owned.add((table, key))
        return record

    def put(self, table: str, key: Any, record: Any) -> None:
        self.tables[table][key] = record
        self._owned.add((table, key))
        self._digest = None

    def digest(self, cache: dict | None = None) -> str:
        """sha256 of the canonical JSON of the whole DB: the hash tau2's DB check compares.
        It is assembled row by row; `cache` (kept beside the base) holds the text of shared rows,
        so only this conversation's own records are dumped again."""
        if self._digest is not None:
            return self._digest
        cache = {} if cache is None else cache
        parts = []
        for name in sorted(self.tables):
            table, shared = self.tables[name], cache.setdefault(name, {})
            rows = []
            for key in sorted(table):
                if (name, key) in self._owned:
                    rows.append(f"{json.dumps(key)}: {canonical_json(table[key])}")
                else:
                    row = shared.get(key)
                    if row is None:
                        row = shared[key] = f"{json.dumps(key)}: {canonical_json(table[key])}"
                    rows.append(row)
            parts.append(f"{json.dumps(name)}: {{{', '.join(rows)}}}")
        self._digest = hashlib.sha256(f"{{{', '.join(parts)}}}".encode()).hexdigest()
        return self._digest
