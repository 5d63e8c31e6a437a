"""``manage.py analyze`` and ``python -m studies.analysis`` on CSV files."""

import io
import json
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

from studies.analysis.__main__ import main

SLEEP = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0, 1.9, 0.8, 1.1, 0.1, -0.1]
SLEEP += [4.4, 5.5, 1.6, 4.6, 3.4]


@pytest.fixture
def sleep_csv(tmp_path):
    """R's sleep data with a Likert column, an unfinished row and a failed attention check."""
    lines = ["group,extra,calm,finished,attention_passed"]
    for i, value in enumerate(SLEEP):
        lines.append(f"{'g1' if i < 10 else 'g2'},{value},{1 + i % 7},yes,yes")
    lines += ["g2,99,7,no,yes", "g1,-99,1,yes,no"]
    path = tmp_path / "sleep.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def analyze(*args):
    out = io.StringIO()
    call_command("analyze", *map(str, args), stdout=out)
    return out.getvalue()


def test_manage_py_analyze_json(sleep_csv):
    out = analyze(
        "--csv",
        sleep_csv,
        "--arm-column",
        "group",
        "--measures",
        "extra,calm",
        "--control",
        "g2",
        "--reverse",
        "calm",
        "--scales",
        "calm=9",
        "--json",
    )
    report = json.loads(out)
    extra = next(c for c in report["comparisons"] if c["measure"] == "extra")
    assert (extra["arm"], extra["reference"]) == ("g1", "g2")
    assert round(extra["t"], 4) == -1.8608 and round(extra["df"], 3) == 17.776
    assert round(extra["p"], 5) == 0.07939
    assert [round(v, 7) for v in extra["diff_ci"]] == [-3.3654832, 0.2054832]
    assert report["participants"]["excluded"] == {
        "total": 2,
        "by_reason": {"unfinished": 1, "failed_attention_check": 1},
    }
    assert report["settings"]["reverse"] == ["calm"]
    g1_calm = report["arms"][0]["measures"]["calm"]
    assert g1_calm["mean"] == pytest.approx(10 - sum(1 + i % 7 for i in range(10)) / 10)


def test_manage_py_analyze_table_and_options(sleep_csv):
    out = analyze(
        "--csv",
        sleep_csv,
        "--arm-column",
        "group",
        "--measures",
        "extra",
        "--pairs",
        "all",
        "--family",
        "study",
        "--alpha",
        "0.1",
        "--keep-unfinished",
        "--keep-failed-attention",
    )
    assert "Participants: 22 total, 22 included, 0 excluded" in out
    assert "g2 - g1" in out and "* p_holm < 0.1" in out


def test_manage_py_analyze_unknown_control_lists_the_arms(sleep_csv):
    with pytest.raises(
        CommandError, match="control arm 'placebo' is not among the arms: 'g1', 'g2'"
    ):
        analyze(
            "--csv",
            sleep_csv,
            "--arm-column",
            "group",
            "--measures",
            "extra",
            "--control",
            "placebo",
            "--json",
        )


def test_manage_py_analyze_unreadable_files(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(CommandError, match="is empty"):
        analyze("--csv", empty, "--arm-column", "arm", "--measures", "x")
    with pytest.raises(CommandError, match="cannot read CSV file"):
        analyze("--csv", tmp_path / "missing.csv", "--arm-column", "arm", "--measures", "x")
    header = tmp_path / "header.csv"
    header.write_text("arm,x\n")
    with pytest.raises(CommandError, match="no rows"):
        analyze("--csv", header, "--arm-column", "arm", "--measures", "x")


def test_figures_are_written(sleep_csv, tmp_path):
    folder = tmp_path / "figures"
    analyze(
        "--csv", sleep_csv, "--arm-column", "group", "--measures", "extra,calm", "--figures", folder
    )
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["likert-calm.png", "likert-calm.svg", "means.png", "means.svg"]


def test_python_m_without_django(sleep_csv):
    """The core CLI runs in a bare interpreter: no settings module, no Django import."""
    code = (
        "import sys; from studies.analysis.__main__ import main; rc = main(sys.argv[1:]); "
        "assert 'django' not in sys.modules, 'the core imported Django'; sys.exit(rc)"
    )
    args = ["--csv", str(sleep_csv), "--arm-column", "group", "--measures", "extra", "--json"]
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert round(json.loads(done.stdout)["comparisons"][0]["t"], 4) == 1.8608  # g2 - g1


def test_python_m_exit_status_and_errors(sleep_csv, capsys):
    args = ["--csv", str(sleep_csv), "--arm-column", "group", "--measures", "extra", "--json"]
    assert main([*args, "--control", "nope"]) == 1
    printed = capsys.readouterr()
    assert "control arm 'nope'" in printed.err and json.loads(printed.out)["errors"]
    with pytest.raises(SystemExit):  # argparse rejects a bad choice before any work
        main([*args, "--family", "arm"])
    assert "invalid choice: 'arm'" in capsys.readouterr().err
