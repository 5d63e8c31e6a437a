"""docs/configuration.md lists every environment variable the product reads: its tables are
written from the register (agents/environment.py), and no code reads the environment past it."""

import ast

from parley import configuration_doc

from agents.environment import REGISTER
from agents.paths import REPO_DIR

# Not reads of a variable: the whole environment handed to a child process ({**os.environ}),
# and a default written for Django (os.environ.setdefault("DJANGO_SETTINGS_MODULE", ...)).
REGISTER_MODULE = REPO_DIR / "agents" / "environment.py"


def test_the_page_is_what_the_register_gives():
    """A variable declared without its line, or a line for one no longer read, fails here:
    run `python -m parley.configuration_doc` and commit the page."""
    page = configuration_doc.DOC.read_text(encoding="utf-8")
    assert configuration_doc.rendered(page) == page


def test_the_page_lists_every_declared_variable():
    page = configuration_doc.DOC.read_text(encoding="utf-8")
    configuration_doc.register()
    missing = [name for name in REGISTER if f"| `{name}` |" not in page]
    assert not missing and len(REGISTER) > 60


def environment_reads(source: str) -> list[int]:
    """The lines where the source uses os.environ or os.getenv to read a variable."""
    tree = ast.parse(source)
    allowed: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):  # {**os.environ, ...}: the whole of it, to a child
            allowed.update(
                id(value) for key, value in zip(node.keys, node.values, strict=True) if key is None
            )
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "setdefault":  # a write
                allowed.add(id(node.func.value))
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if id(node) not in allowed
        and (
            (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"))
            or (isinstance(node, ast.Name) and node.id in ("environ", "getenv"))
        )
    )


def test_no_product_code_reads_the_environment_past_the_register():
    """Each variable is declared where it is read (environment.setting) and read through it;
    only the register itself touches os.environ for a variable."""
    reads = [
        f"{path.relative_to(REPO_DIR)}:{line}"
        for path in configuration_doc.product_files()
        if path != REGISTER_MODULE
        for line in environment_reads(path.read_text(encoding="utf-8"))
    ]
    assert reads == []


def test_the_scan_sees_a_read_that_bypasses_the_register():
    source = (
        "import os\nfrom os import environ, getenv\n"
        "child = {**os.environ, 'PYTHONUNBUFFERED': '1'}\n"
        "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'parley.settings')\n"
        "a = os.environ.get('A')\nb = os.getenv('B')\nc = 'C' in os.environ\n"
        "d = environ['D']\ne = getenv('E')\n"
    )
    assert environment_reads(source) == [5, 6, 7, 8, 9]
