"""Every figure notebook in ``notebooks/`` runs on a fresh (short) reproduction and writes
its figure; a missing results directory fails with a message naming the fix."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

jupytext = pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

NB_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(p for p in NB_DIR.glob("*.py") if not p.name.startswith("_"))
# notebook -> (reproduce's --figures name, the function reproduce draws it with, its file stem)
SHARED_FIGURES = {
    "table1_kv_capacity": ("table1", "table1_capacity(", "table1"),
    "fig02_kv_breakdown": ("fig2", "fig2_breakdown(", "fig2_breakdown"),
    "fig12_latency_vs_rate": ("fig12", "fig12_panels(", "fig12_all_panels"),
    "fig13_batch_size": ("fig13", "fig13_batch(", "fig13_batch"),
    "fig14_sampling_rates": ("fig14", "draw_fig14(", "fig14_sampling"),
    "fig15_memory_saving": ("fig15", "draw_fig15(", "fig15_sharing"),
    "fig16_shared_prefix": ("fig16", "draw_fig16(", "fig16_prefix"),
    "fig17_chatbot_rates": ("fig17", "draw_fig17(", "fig17_chatbot"),
    "fig18b_block_size_study": ("fig18b", "draw_fig18b(", "fig18b_block_size"),
    "fig19_recompute_vs_swap": ("fig19", "draw_fig19(", "fig19_swap_recompute"),
    "vllm_step_time_sensitivity": (
        "sensitivity",
        "overhead_sensitivity(",
        "vllm_overhead_sensitivity",
    ),
}
CELL_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One short reproduction (20-second traces) shared by the module. The sharing figures'
    files (Fig. 14-17) are written by reproduce's own writer from searches on a stand-in
    runner (``test_sharing_figures.fake_runner``): a real search takes minutes, and the
    notebooks only read the files."""
    from concurrent.futures import ThreadPoolExecutor

    from experiments.report import sharing
    from experiments.reproduce import main
    from tests.test_sharing_figures import fake_runner

    out = tmp_path_factory.mktemp("reproduce")
    main(["--duration", "20", "--skip-sharing", "--out", str(out), "--workers", "1",
          "--seeds", "2", "--fig12-panels", "ad"])  # fmt: skip
    with ThreadPoolExecutor(2) as pool:
        jobs = sharing.submit(pool, fake_runner([]), 60.0, 0, 1.0)
        sharing.write(jobs, out, sharing._plt(), 60.0)
    return out


def execute(path: Path, results_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run a percent-format notebook in a ``python3`` kernel started in ``notebooks/``."""
    monkeypatch.setenv("KVLAB_RESULTS", str(results_dir))
    nb = jupytext.read(path)
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(NB_DIR)}},
    )
    client.execute()


def test_every_figure_has_a_notebook():
    from experiments.report.selection import FIGURES

    assert {p.stem for p in NOTEBOOKS} == set(SHARED_FIGURES)
    assert sorted(name for name, _, _ in SHARED_FIGURES.values()) == sorted(FIGURES)


def test_paper_figures_share_the_reports_code_and_colours():
    from core.systems import BUILT_IN
    from experiments.report.figures import SYSTEM_COLORS

    # every shipped system has its colour (a plugin's, which another test in this process
    # may have registered, has none: the report draws shipped systems only)
    assert set(SYSTEM_COLORS) >= BUILT_IN
    for path in NOTEBOOKS:
        text = path.read_text()
        assert SHARED_FIGURES[path.stem][1] in text, path.name
        # Colours come from experiments.report.figures: no colour cycle, no literal colour.
        assert not re.search(r"[\"']C\d[\"']|f\"C\{|#[0-9a-fA-F]{6}\b", text), path.name


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_writes_its_figure(
    path: Path, results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    png, pdf = results / f"{path.stem}.png", results / f"{path.stem}.pdf"
    assert not png.exists()
    execute(path, results, monkeypatch)
    assert png.read_bytes().startswith(b"\x89PNG")
    text = pdf.read_bytes()
    assert text.startswith(b"%PDF")
    assert b"/Type3" not in text, "PDF fonts must be TrueType (pdf.fonttype 42)"
    # The same code on the same numbers: the notebook's figure is reproduce's, pixel for pixel.
    from matplotlib.image import imread

    ours, reproduces = imread(png), imread(results / f"{SHARED_FIGURES[path.stem][2]}.png")
    assert ours.shape == reproduces.shape and (ours == reproduces).all(), path.name


def test_missing_results_name_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    with pytest.raises(nbclient.exceptions.CellExecutionError) as err:
        execute(NB_DIR / "table1_kv_capacity.py", tmp_path / "nothing", monkeypatch)
    assert "python -m experiments.reproduce" in str(err.value)
    assert "table1.csv" in str(err.value)


def _common() -> ModuleType:
    spec = importlib.util.spec_from_file_location("nb_common", NB_DIR / "_common.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_dir_defaults_and_relative_paths_are_from_repo_root(monkeypatch):
    common = _common()
    monkeypatch.delenv("KVLAB_RESULTS", raising=False)
    assert common.results_dir() == NB_DIR.parent / "results" / "reproduce"
    monkeypatch.setenv("KVLAB_RESULTS", "results/other")
    assert common.results_dir() == NB_DIR.parent / "results" / "other"
    monkeypatch.setenv("KVLAB_RESULTS", str(NB_DIR))
    assert common.results_dir() == NB_DIR


CSV = "system,rate,passes,normalized_latency\nvllm,1.0,True,0.5\nvllm,2.0,False,\n"
KINDS = {"text": ("system",), "numbers": ("rate",), "passing": ("normalized_latency",)}


def test_read_result_gives_what_pandas_reads(tmp_path: Path) -> None:
    import pandas as pd

    path = tmp_path / "r.csv"
    path.write_text(CSV)
    table = _common().read_result(path, **KINDS, choices={"system": ("vllm", "orca_max")})
    pd.testing.assert_frame_equal(table, pd.read_csv(path))


@pytest.mark.parametrize(
    ("text", "kinds", "says"),
    [
        (CSV[:-1], KINDS, "line 3 has no newline at its end: the file was cut short"),
        (CSV[:-9] + "\n", KINDS, "line 3 has 2 of the header's 4 fields"),
        ("", KINDS, "is empty"),
        (CSV.split("\n")[0] + "\n", KINDS, "has a header but no rows"),
        (CSV, {"numbers": ("max_rate",)}, "no column max_rate; the notebook reads it"),
        (CSV.replace("vllm,2.0", "vllm,abc"), KINDS, "column rate: not a number (got 'abc')"),
        (CSV.replace("vllm,2.0", "vllm,nan"), KINDS, "line 3, column rate: empty or NaN"),
        (CSV.replace("vllm,2.0", "vllm,inf"), KINDS, "line 3, column rate: not finite (got inf)"),
        (CSV.replace("0.5", ""), KINDS, "line 2, column normalized_latency: empty or NaN on"),
        (CSV.replace("False", "maybe"), KINDS, "line 3, column passes: not True or False"),
        (CSV.replace("\nvllm,1", "\n,1"), KINDS, "line 2, column system: empty"),
        (CSV, {"text": ("system",), "choices": {"system": ("orca_max",)}},
         "line 2, column system: not one of orca_max (got 'vllm')"),
    ],
)  # fmt: skip
def test_read_result_names_the_file_line_and_column(
    text: str, kinds: dict, says: str, tmp_path: Path
) -> None:
    from experiments.lib.checks import ConfigError

    path = tmp_path / "r.csv"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        _common().read_result(path, **kinds)
    assert err.value.line().startswith(f"error: {path}: ") and says in err.value.line()


def test_read_metrics_names_a_bad_file_and_key(tmp_path: Path) -> None:
    from experiments.lib.checks import ConfigError

    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    for doc, says in (('{"kv_free_pct": 1', "cannot read it"), ("[1]", "not a JSON object"),
                      ("{}", "no key kv_free_pct"),
                      ('{"kv_free_pct": NaN}', "kv_free_pct: not a finite number")):  # fmt: skip
        (run / "metrics.json").write_text(doc)
        with pytest.raises(ConfigError, match=says):
            _common().read_metrics(tmp_path, {"vllm": "r"}, numbers=("kv_free_pct",))


def test_a_notebook_run_as_a_script_refuses_a_cut_short_file_in_one_line(tmp_path: Path) -> None:
    """The audit's case: fig18b_block_size.csv cut mid-file printed a wrong best block size."""
    import os
    import subprocess
    import sys

    rows = ["study,workload,rate,block_size,normalized_latency"] + [
        f"fig18b,sharegpt,2.0,{bs},{lat}" for bs, lat in ((16, 0.9), (32, 0.5), (64, 0.7))
    ]
    (tmp_path / "fig18b_block_size.csv").write_text("\n".join(rows)[:-12])
    done = subprocess.run(
        [sys.executable, str(NB_DIR / "fig18b_block_size_study.py")], capture_output=True,
        text=True, env={**os.environ, "KVLAB_RESULTS": str(tmp_path), "MPLBACKEND": "Agg"},
    )  # fmt: skip
    assert done.returncode == 2 and "best block size" not in done.stdout
    assert done.stderr.strip() == (
        f"error: {tmp_path / 'fig18b_block_size.csv'}: line 4 has no newline at its end: the "
        "file was cut short (truncated, or read while being written)"
    )
