"""A formatter opt-out is kept only with its reason (issue 42 point 7).

`ruff format` lays out every statement; a `# fmt: skip` (or a `# fmt: off` region) keeps a hand
layout only where that layout carries meaning: a table one row a line, flags beside their values.
The reason says which, so that a reader can tell a kept layout from a forgotten marker. It is
written in one of these two spellings, which ruff still honours (checked with ruff 0.17.6; ruff
also takes `# why  # fmt: skip`, but one spelling, the marker first, is kept):

    statement  # fmt: skip  # a table: one case a line

    # a matrix: one row a line
    # fmt: off
    ...
    # fmt: on

`# fmt: skip (reason)` or `# fmt: skip - reason` is not a marker to ruff (it formats the
statement), and neither is `# fmt: off  # reason`: both are reported as such.
"""

import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ["agents", "bench", "platform", "studies", "tests", "training", "manage.py"]
# Files whose bytes are fixed: their markers cannot be given a reason.
EXEMPT = {
    # collapse3's pre-registration: registration.toml hashes its design, runner, analysis and
    # equilibrium, `python -m training experiment collapse3` refuses to run on a changed byte,
    # and the folder is frozen with them
    "training/collapse3/": "registered by hash (training/collapse3/registration.toml)",
    "training/collapse2/flat_prior.py": "registered by hash (training/collapse3/registration.toml)",
    "training/collapse2/analysis.py": "registered by hash (training/collapse2/design.toml sha256)",
}
SKIP, OFF = "fmt: skip", "fmt: off"
# Ruff reads yapf's "disable" comment as fmt: off, and the markers without their space too.
MARKERS = {
    "fmt: skip": SKIP,
    "fmt:skip": SKIP,
    "fmt: off": OFF,
    "fmt:off": OFF,
    "yapf: disable": OFF,
}


def _marker(part: str) -> str | None:
    """The opt-out a comment part starts, if any (ruff only honours it alone in its part)."""
    for spelling, marker in MARKERS.items():
        rest = part.removeprefix(spelling)
        if rest != part and (not rest or rest[0] in " (:;,-"):
            return marker
    return None


def unreasoned(source: str) -> list[tuple[int, str]]:
    """(line, what is wrong) for each opt-out in `source` without its reason."""
    comments = [
        (token.start[0], token.string, token.line.strip().startswith("#"))
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    own_line = {line: text for line, text, alone in comments if alone}
    found = []
    for line, text, alone in comments:
        parts = [part.strip() for part in text.split("#")[1:]]
        for i, part in enumerate(parts):
            marker = _marker(part)
            if marker is None:
                continue
            if part not in MARKERS:
                found.append((line, f"ruff does not read `# {part}` as `# {marker}`"))
            elif marker == SKIP and not any(parts[i + 1 :]):
                found.append(
                    (line, "`# fmt: skip` without a reason after it: `# fmt: skip  # why`")
                )
            elif marker == OFF and not alone:
                found.append((line, f"`# {part}` not on its own line"))
            elif marker == OFF and any(parts[i + 1 :]):
                found.append((line, f"ruff ignores `# {part}` with a trailing comment"))
            elif marker == OFF and (
                line - 1 not in own_line or _marker(own_line[line - 1].lstrip("# ")) is not None
            ):
                found.append((line, f"`# {part}` without its reason in a comment just above"))
            break
    return found


def exempt(relative: str) -> bool:
    return any(relative == path or relative.startswith(path) for path in EXEMPT)


def test_every_formatter_opt_out_says_why():
    files = [
        path
        for top in SCANNED
        for path in ((ROOT / top).rglob("*.py") if (ROOT / top).is_dir() else [ROOT / top])
    ]
    assert len(files) > 500, "the scan found too few files: is SCANNED still the layout?"
    found = [
        f"{relative}:{line}: {what}"
        for path in sorted(files)
        if not exempt(relative := path.relative_to(ROOT).as_posix())
        for line, what in unreasoned(path.read_text())
    ]
    assert not found, "formatter opt-outs without a reason:\n" + "\n".join(found)


def test_the_exempt_files_are_still_there():
    for path in EXEMPT:
        assert (ROOT / path).exists(), f"{path} is exempt but gone: drop it from EXEMPT"


def test_a_marker_with_its_reason_passes_and_one_without_is_named():
    source = (
        "a = [1,  2]  # fmt: skip  # a table: one row a line\n"
        "b = [1,  2]  # fmt: skip\n"
        "c = [1,  2]  # fmt: skip (ruff ignores this)\n"
        "d = '# fmt: skip in a string is no marker'\n"
        "e = 1  # a note  # fmt: skip\n"
        "# a matrix: one row a line\n"
        "# fmt: off\n"
        "f = [1,  0,\n     0,  1]\n"
        "# fmt: on\n"
        "x = 1\n"
        "# fmt: off\n"
        "g = [1,  0]\n"
        "# fmt: on\n"
        "# fmt: off  # a reason ruff does not allow here\n"
        "h = [1,  0]\n"
        "# fmt: on\n"
    )
    assert [line for line, _ in unreasoned(source)] == [2, 3, 5, 12, 15]
