"""The dry run on a run's official data (domain_data): an absent path is said plainly, never
passed over for the Domain's bundled data; a present one is read under the run's protocol."""

from __future__ import annotations

from pathlib import Path

from training.config import load_config
from training.tools.dryrun import check_domain_data, dry_run

REPO = Path(__file__).resolve().parents[3]
P4G = REPO / "training" / "configs" / "paper" / "p4g-single-gpt5mini.toml"
FIXTURE = REPO / "tests" / "fixtures" / "p4g_release"


def test_an_absent_data_path_is_said_offline_and_fails_online(tmp_path):
    absent = str(tmp_path / "no-p4g")
    config = load_config(P4G, {"domain_data": absent})
    offline = check_domain_data(config, offline=True)
    assert offline.ok and offline.detail.startswith(f"ABSENT: {absent} does not exist")
    assert "never falling back to p4g's bundled data" in offline.detail
    online = check_domain_data(config, offline=False)
    assert not online.ok and "the run fails here" in online.detail
    checks = dry_run(str(P4G), {"domain_data": absent}, offline=True)["checks"]
    assert any(c["name"] == "domain data" and "ABSENT" in c["detail"] for c in checks)


def test_present_data_is_read_under_the_runs_protocol(tmp_path):
    config = load_config(P4G, {"domain_data": str(FIXTURE)})
    found = check_domain_data(config, offline=True)
    assert found.ok and "(protocol release): 3 training and 3 evaluation tasks" in found.detail
    # data without the release's split is refused by name, not read as parley's personas
    (tmp_path / "full_info.csv").write_text((FIXTURE / "full_info.csv").read_text())
    config = load_config(P4G, {"domain_data": str(tmp_path)})
    refused = check_domain_data(config, offline=True)
    assert not refused.ok and "data/p4g/train" in refused.detail
