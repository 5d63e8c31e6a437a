"""The trainer's collectives under a process group that refuses what NCCL refuses (a tensor of
another device type than the one it serves), and how a failed collective is reported: this
rank's own failure with its rank, a timeout naming the collective, another rank gone.
Two real processes per case (tests/support/collectives.py)."""

import pytest

from tests.support.collectives import run_ranks
from training.rl.distributed import read_failures


@pytest.fixture(scope="module")
def sums(tmp_path_factory):
    """The sums and gathers, then a sum forced onto the default group (one spawn for both)."""
    out = tmp_path_factory.mktemp("sums")
    return run_ranks("sums", out), out


def test_the_sums_and_gathers_go_through_a_group_serving_the_run_device(sums):
    """gloo bound to cuda alone, as NCCL is: the trainer's own sums on CPU tensors must go
    through the gloo group it makes for the CPU run (on main they went to the default group
    and every rank stopped in its first update)."""
    for result in sums[0]:
        assert "total" in result, result
        assert result["total"] == 3.0 and result["most"] == 5
        assert result["gather"] == [0, 0, 1, 1] and result["gradient"] == [3.0] * 3


def test_a_collective_this_rank_cannot_make_is_its_own_failure(sums):
    results, out = sums
    for rank, result in enumerate(results):
        assert result["error"] == "CollectiveFailed"
        assert result["message"].startswith(f"rank {rank}: total (all_reduce) failed on this rank")
        assert "No backend type associated with device type cpu" in result["message"]
    report = read_failures(out)
    assert "rank 0 failed:" in report and "rank 1 failed:" in report
    assert "another rank was gone" not in report  # not relabelled as a peer's


def test_a_timeout_names_the_collective_and_the_setting(tmp_path):
    """Rank 1 is still working when rank 0's sum passes distributed.timeout (3 s)."""
    result = run_ranks("timeout", tmp_path)[0]
    assert result["error"] == "CollectiveTimeout", result
    assert "total (all_reduce) timed out" in result["message"]
    assert "distributed.timeout = 3 s" in result["message"]
    assert read_failures(tmp_path).startswith("rank 0 failed:")
