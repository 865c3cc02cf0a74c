"""``reproduce --figures``: the selection of figures, its one-line error, and a selected run
that makes only what it names."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import pytest

from experiments import reproduce
from experiments.lib.checks import ConfigError
from experiments.report import markdown
from experiments.report.selection import FIGURES, select


def test_selection_keeps_report_order_and_the_skip_flags() -> None:
    assert select(None) == FIGURES
    assert select("fig19, table1,fig2") == ("table1", "fig2", "fig19")
    assert select(None, ["skip_sharing", "skip_blocks"]) == (
        "table1", "fig2", "fig12", "fig13", "sensitivity",
    )  # fmt: skip
    assert select("fig12,fig13", ["skip_fig12"]) == ("fig13",)


@pytest.mark.parametrize("spec", ["fig2,fig99", "", " , "])
def test_a_bad_selection_names_the_valid_figures(spec: str) -> None:
    with pytest.raises(ConfigError) as err:
        select(spec)
    assert err.value.line().startswith("error: --figures: ")
    assert ", ".join(FIGURES) in err.value.line()


def test_an_unknown_figure_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as ended:
        reproduce.main(["--figures", "fig13,fig99", "--out", str(tmp_path)])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'fig99'" in err and "fig18b" in err
    assert not any(tmp_path.iterdir())  # nothing ran


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--duration", "-5"], "error: --duration: not a number > 0"),
        (["--threshold", "0"], "error: --threshold: not a number > 0"),
        (["--workers", "-4"], "error: --workers: not a count >= 1"),
        (["--seeds", "0"], "error: --seeds: not a count >= 1"),
        (["--seed", "-1"], "error: --seed: not a seed (an integer >= 0)"),
        (["--launcher", "nope"], "error: --launcher: unknown launcher"),
        (
            ["--figures", "fig19", "--skip-blocks"],
            "error: --figures: every figure named is removed by --skip-blocks",
        ),
        (
            ["--launcher-override", "hydra.launcher.n_jobs=2"],
            "error: --launcher-override: given without --launcher",
        ),
        (
            ["--launcher", "basic", "--launcher-override", "hydra.launcher.bogus=1"],
            "error: --launcher-override: Could not override 'hydra.launcher.bogus'",
        ),
    ],
)
def test_a_bad_number_or_launcher_is_one_line_before_any_run(
    args: list[str], line: str, tmp_path: Path, capsys
) -> None:
    with pytest.raises(SystemExit) as ended:
        reproduce.main([*args, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.count("\n") == 1 and err.startswith(line), err
    assert not (tmp_path / "out").exists()


def test_an_out_that_cannot_be_made_is_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(SystemExit) as ended:
        reproduce.main(["--figures", "table1", "--out", str(tmp_path / "a-file" / "out")])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.startswith("error: --out: cannot write there"), err


def test_a_trace_too_short_for_a_request_is_one_line_and_writes_no_figure(
    tmp_path: Path, capsys
) -> None:
    """A run at a fixed rate that completed no request would make a report of NaN: refused
    after the runs, before any figure or the report is written; an earlier report in
    ``--out``, made from the runs this one rewrote, is not left behind as if it were its."""
    (tmp_path / "report.md").write_text("an earlier report")
    with pytest.raises(SystemExit) as ended:
        reproduce.main(["--figures", "fig2", "--duration", "0.001", "--workers", "1",
                        "--out", str(tmp_path)])  # fmt: skip
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: --duration: too short for the report: run fig2_"), err
    # provenance.json, written first, names the command that made runs/
    assert sorted(p.name for p in tmp_path.iterdir()) == ["provenance.json", "runs"]


def test_no_rate_search_without_a_request_at_any_rate() -> None:
    rows = [{"setting": "a", "system": "vllm", "passes": None},
            {"setting": "a", "system": "orca_max", "passes": False},
            {"setting": "a", "system": "vllm", "passes": True}]  # fmt: skip
    assert reproduce.unmeasured_run([], [rows]) is None
    problem = reproduce.unmeasured_run([], [rows[:2]])
    assert problem == "vllm's rate search (a) held no request at any rate"


def test_a_fixed_rate_run_with_no_completed_count_is_unmeasured() -> None:
    # a NaN (a run row without the metric) had passed as a measured run
    for completed in (0, None, float("nan")):
        frame = pd.DataFrame([{"label": "fig2_vllm", "completed": completed}])
        assert reproduce.unmeasured_run([frame], []) == "run fig2_vllm completed no request"
    assert reproduce.unmeasured_run([pd.DataFrame([{"label": "x", "completed": 3}])], []) is None


def test_a_selection_runs_and_writes_only_its_figures(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="kvlab.reproduce")
    # a Hydra app run earlier in this process (the config-error tests) reconfigures logging
    # with disable_existing_loggers, which silences this logger for the rest of the session
    logging.getLogger("kvlab.reproduce").disabled = False
    reproduce.main(["--figures", "table1,fig13", "--duration", "8", "--workers", "1",
                    "--out", str(tmp_path)])  # fmt: skip
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert runs == sorted(
        [f"fig2_{s}" for s in reproduce.FIG2_SYSTEMS]
        + [f"fig13_alpaca_{s}" for s in reproduce.FIG2_SYSTEMS]
    )
    files = {p.name for p in tmp_path.iterdir() if p.is_file()}
    stems = ("table1", "fig13_batch")
    assert files == {"report.md", "provenance.json"} | {
        f"{st}.{ext}" for st in stems for ext in ("csv", "png", "pdf")
    }
    report = (tmp_path / "report.md").read_text()
    assert "## Table 1" in report and "## Fig. 13" in report
    assert "## Fig. 2:" not in report and "## Appendix" not in report
    # the report names the command that made it, flags and all
    made_by = "python -m experiments.reproduce --figures table1,fig13 --duration 8 --workers 1"
    assert f"Generated by `{made_by} --out {tmp_path}` in " in report
    # what the paper leaves open is said to be kvlab's reading
    assert markdown.TABLE1_UNITS in report and markdown.BATCH_DEFINITION in report
    # progress: one line when each figure's runs are done, one when its files are written
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("fig13: 8 jobs done (") for m in messages), messages
    assert any(m.startswith("fig13: wrote fig13_batch.csv/.png/.pdf (") for m in messages)
    assert any(m.startswith("table1: wrote table1.csv/.png/.pdf (") for m in messages)


def test_fig13_gives_the_paper_only_where_it_is_known() -> None:
    import pandas as pd

    from experiments.report.markdown import fig13_section, fig13_table

    runs = pd.DataFrame({"system": ["orca_oracle", "vllm"], "mean_batch_size": [12.0, 33.0],
                         "completed": [9, 9], "request_throughput": [1.0, 2.0],
                         "normalized_latency": [0.5, 0.1], "num_preemptions": [0, 3]})  # fmt: skip
    f13 = pd.concat([fig13_table(runs, "sharegpt", 2.0), fig13_table(runs, "alpaca", 30.0)])
    assert f13[f13["workload"] == "alpaca"]["paper_mean_batch"].isna().all()
    text = "\n".join(fig13_section(f13, runs, runs))
    assert "### (a) ShareGPT, 2 req/s" in text and "### (b) Alpaca, 30 req/s" in text
    # ShareGPT: kvlab − paper per system (paper: Orca (Oracle) 13.62, vLLM 30.42)
    assert "Gap (ShareGPT), kvlab − paper: Orca (Oracle) -1.62 (-12%); vLLM +2.58 (+8%)." in text
    assert text.count("Gap (") == 1 and "| vLLM | 33.00 | — | — |" in text


def test_fig15_alone_runs_fig14s_searches_and_writes_only_fig15(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from experiments.report import fig14_sampling, sharing
    from tests.test_sharing_figures import fake_runner

    calls: list = []
    with ThreadPoolExecutor(2) as pool:
        jobs = sharing.submit(pool, fake_runner(calls), 60.0, 0, 1.0, ["fig15"])
        text = sharing.write(jobs, tmp_path, sharing._plt(), 60.0, ["fig15"])
    assert set(jobs) == {"fig14"} and len(jobs["fig14"]) == len(fig14_sampling.searches(60.0, 0))
    assert {p.name for p in tmp_path.iterdir()} == {
        f"fig15_sharing.{e}" for e in ("csv", "png", "pdf")
    }
    assert "## Fig. 15" in text and "## Fig. 14" not in text
