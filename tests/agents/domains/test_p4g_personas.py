"""P4G personas: the bundled set and the loader of the official full_info.csv."""

import csv
import json
import os

import pytest

from agents.domains.p4g import P4GDomain, load_bundled, load_full_info, persona_from_record
from agents.domains.p4g.personas import TRAIT_GROUPS
from agents.paths import reference_dir


@pytest.fixture(scope="module")
def reference():
    path = reference_dir()
    if path is None:
        if os.environ.get("PARLEY_CI") == "1":
            pytest.fail("PARLEY_CI=1 but the reference data (../shared/reference) is missing")
        pytest.skip("no reference data beside the checkout")
    return path


@pytest.fixture(scope="module")
def official(reference):
    return P4GDomain(reference).scenarios()


def test_bundled_personas_fill_every_survey_field_within_its_scale():
    for scenario in load_bundled():
        persona = scenario.payload["persona"]
        for group, (fields, top) in TRAIT_GROUPS.items():
            assert set(persona[group]) == set(fields)
            assert all(1 <= persona[group][f] <= top for f in fields), (scenario.id, group)
        assert all(v is not None for v in persona["demographics"].values()), scenario.id
        assert scenario.payload["source"] == "bundled"
        assert scenario.payload["actual_donation"] is None


def test_a_record_out_of_scale_or_not_a_number_is_refused_by_name():
    with pytest.raises(ValueError, match=r"care\.x: 7.0 is outside 1\.\.6"):
        persona_from_record({"care.x": "7"})
    with pytest.raises(ValueError, match=r"open\.x: expected a number"):
        persona_from_record({"open.x": "very"})
    blank = persona_from_record({"open.x": "", "sex.x": " "})
    assert blank["big_five"]["open"] is None and blank["demographics"]["sex"] is None


def test_bundled_file_errors_are_clear(tmp_path):
    bad = tmp_path / "personas.json"
    bad.write_text("[{")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_bundled(bad)
    bad.write_text(json.dumps([{"id": "x", "title": "t"}]))
    with pytest.raises(ValueError, match="has no 'split'"):
        load_bundled(bad)


def test_official_persuadees_with_donations_in_range(reference, official):
    with (reference / "p4g" / "full_info.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    kept = {r["B2"]: float(r["B6"]) for r in rows if r["B4"] == "1" and 0 <= float(r["B6"]) <= 2}
    dropped = [r for r in rows if r["B4"] == "1" and r["B2"] not in kept]
    assert dropped and all(float(r["B6"]) > 2 for r in dropped)  # the outliers exist...
    assert {s.payload["dialogue_id"]: s.payload["actual_donation"] for s in official} == kept
    assert len({s.id for s in official}) == len(official)  # ...and only they are gone


def test_official_persona_matches_its_csv_row(reference, official):
    with (reference / "p4g" / "full_info.csv").open(newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["B4"] == "1" and r["age.x"])
    scenario = next(s for s in official if s.payload["dialogue_id"] == row["B2"])
    persona = scenario.payload["persona"]
    assert scenario.payload["user_id"] == row["B3"]
    assert persona["big_five"]["extrovert"] == pytest.approx(float(row["extrovert.x"]))
    assert persona["values"]["self_direction"] == pytest.approx(float(row["self_direction.x"]))
    assert persona["demographics"]["ideology"] == row["ideology.x"]
    assert persona["demographics"]["age"] == int(float(row["age.x"]))
    assert row["B3"] in scenario.title
    # The actual donation is kept for reference but never shown to the simulated persuadee.
    prompt = P4GDomain().simulator_system_prompt(scenario)
    assert f"{int(float(row['age.x']))}-year-old" in prompt and row["B3"] not in prompt


def test_official_split_keeps_each_user_on_one_side(official):
    sides = {}
    for s in official:
        sides.setdefault(s.payload["user_id"], set()).add(s.payload["split"])
    assert all(len(v) == 1 for v in sides.values())
    test_share = sum(s.payload["split"] == "test" for s in official) / len(official)
    assert 0.1 < test_share < 0.3


def test_full_info_found_from_file_folder_or_reference_root(reference, official):
    direct = load_full_info(reference / "p4g" / "full_info.csv")
    assert [s.id for s in direct] == [s.id for s in official]
    assert len(load_full_info(reference / "p4g")) == len(official)
    from agents.domains import get_domain

    assert len(get_domain("p4g", data_dir=reference).scenarios()) == len(official)


def test_missing_or_malformed_full_info_is_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="full_info.csv"):
        P4GDomain(tmp_path).scenarios()
    (tmp_path / "full_info.csv").write_text("B2,B4\nx,1\n")
    with pytest.raises(ValueError, match=r"missing columns \['B3', 'B6'\]"):
        load_full_info(tmp_path)
    (tmp_path / "full_info.csv").write_text("B2,B3,B4,B6,care.x\nd1,u1,1,1.0,9\n")
    with pytest.raises(ValueError, match=r"full_info.csv:2: care\.x"):
        load_full_info(tmp_path)
