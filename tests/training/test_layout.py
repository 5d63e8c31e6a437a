"""Each file a run writes is named once: a run folder's in training/layout.py, a checkpoint's
manifest in agents/serving/adapters.py. Product code that spells one of those names again (a
string equal to it) is a second declaration that can drift from the writer's."""

import ast
from pathlib import Path

from agents.serving import adapters
from training import layout

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("agents", "training", "studies", "platform")
# hashed by a pre-registration, so never edited: their runners spell record.json and
# exploit.json themselves (training/collapse3/runner.py)
HASHED = ("training/collapse3/", "training/collapse2/flat_prior.py")
DECLARED = {
    layout.METRICS_FILE: "training/layout.py",
    layout.SAMPLES_FILE: "training/layout.py",
    layout.EXPLOIT_FILE: "training/layout.py",
    adapters.MANIFEST: "agents/serving/adapters.py",
}
# the same spelling for another file, or where the declaration cannot be imported
OTHERS = {
    ("training/regimes/pool.py", "manifest.json"): "the pool's own manifest, not a checkpoint's",
    ("studies/admin/action_forms.py", "samples.jsonl"): "studies may not import training",
}


def spelled(tree: ast.Module, names) -> list[tuple[str, int]]:
    return [
        (node.value, node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in names
    ]


def test_each_file_name_is_spelled_only_where_it_is_declared():
    again = []
    for top in PRODUCT:
        for file in sorted((ROOT / top).rglob("*.py")):
            path = file.relative_to(ROOT).as_posix()
            if path.startswith(HASHED) or "/migrations/" in path:
                continue
            for name, line in spelled(ast.parse(file.read_text()), DECLARED):
                if path != DECLARED[name] and (path, name) not in OTHERS:
                    again.append(f"{path}:{line} spells {name!r} (declared in {DECLARED[name]})")
    assert not again, "\n".join(again)


def test_the_scan_finds_a_spelled_name():
    tree = ast.parse('rows = read_rows(folder / "metrics.jsonl")\nm = x / "manifest.json"\n')
    assert sorted(spelled(tree, DECLARED)) == [("manifest.json", 2), ("metrics.jsonl", 1)]
