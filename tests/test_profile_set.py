"""``cost.profile=<a directory of profiles>``: the profile whose shard is nearest the target's
is transferred (:func:`sim.cost.profiled.nearest_shard`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from experiments.bench.profile_transfer import VIDUR
from sim.cost.profile import ProfileError, read_profile_set
from sim.cost.profiled import ProfiledCostModel
from tests.test_profile_other_transfer import bandwidth_bound_profile
from tests.test_profile_table_errors import run_simulate, vidur_rows, write_vidur

needs_shared = pytest.mark.skipif(not VIDUR.is_dir(), reason="../shared/measurements absent")


def two_shards(d: Path) -> Path:
    """LLaMA-7B's layer profiled at tp 1 (202 M matmul weights a GPU) and at tp 8 (25 M)."""
    bandwidth_bound_profile(d / "llama-7b-tp1")
    bandwidth_bound_profile(d / "llama-7b-tp8", tp=8)
    return d


@pytest.mark.parametrize(("tp", "chosen"), [(1, 1), (2, 1), (4, 8), (8, 8)])
def test_the_shard_nearest_the_targets_is_chosen(tmp_path: Path, tp: int, chosen: int) -> None:
    """Llama-3.1-8B holds 218 M matmul weights a layer: 109 M at tp 2 (nearer 202 M than
    25 M by ratio), 55 M at tp 4 and 27 M at tp 8 (nearer 25 M)."""
    cost = ProfiledCostModel(two_shards(tmp_path / "set"), "llama-3.1-8b", "a100-80gb", tp=tp)
    assert cost.profile.tp == chosen
    assert "chosen by the nearest shard size from 2 profiles" in cost.describe()
    assert cost.config()["chosen_from"] == f"2 profiles in {tmp_path.name}/set"


def test_a_profile_of_the_target_itself_is_used_as_measured(tmp_path: Path) -> None:
    cost = ProfiledCostModel(two_shards(tmp_path / "set"), "llama-7b", "a100-80gb", tp=8)
    assert cost.same and cost.profile.tp == 8


def test_profiles_of_the_targets_gpu_come_first(tmp_path: Path) -> None:
    """An H100 profile of a farther shard beats an A100 one of the same shard on an H100."""
    d = tmp_path / "set"
    bandwidth_bound_profile(d / "a100-tp8", tp=8)
    bandwidth_bound_profile(d / "h100-tp1", gpu="h100")
    cost = ProfiledCostModel(d, "llama-7b", "h100", tp=8)
    assert (cost.profile.gpu, cost.profile.tp) == ("h100", 1)


def test_vidur_tables_join_the_set_at_every_tp_they_hold(tmp_path: Path) -> None:
    rows = vidur_rows(["1", "2", "4"])
    table = write_vidur(tmp_path, rows + [{**r, "num_tensor_parallel_workers": "4"} for r in rows])
    (tmp_path / "a100" / "all_reduce.csv").write_text("not,a,profile\n")  # not mlp_*: skipped
    profiles = read_profile_set(table.parent)
    assert [p.tp for p in profiles] == [1, 4]


def test_a_directory_with_no_profile_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProfileError, match="no profiles here"):
        read_profile_set(tmp_path / "empty")


def test_the_cli_names_cost_profile_for_an_empty_set(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = run_simulate(tmp_path / "empty", tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cost.profile: "), lines
    assert "no profiles here" in lines[0]


@needs_shared
def test_vidurs_a100_folder_prices_a_tp_8_llama_from_its_tp_8_table(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Llama-3.1-8B at tp 8 from the shipped tp-1 profile is warned of (7.4x); from Vidur's
    folder it takes Llama-2-7B's tp-8 table and is not."""
    folder = tmp_path / "a100"
    shutil.copytree(VIDUR / "a100", folder)
    with caplog.at_level("WARNING", logger="sim.cost.profiled"):
        cost = ProfiledCostModel(folder, "llama-3.1-8b", "a100-80gb", tp=8)
    assert "mlp_llama-2-7b.csv" in cost.profile.source and cost.profile.tp == 8
    assert cost.transfer_note is None and not caplog.records
