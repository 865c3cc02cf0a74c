"""A sweep's summary.csv as a table and figure (experiments.report.sweep_plot)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from experiments.report import sweep_plot


def _summary(folder: Path) -> Path:
    rows = [
        # two seeds at each point are averaged; a failed run is left out
        {"system": "vllm", "system.block_size": 8, "seed": 0, "request_throughput": 1.0,
         "status": "ok"},
        {"system": "vllm", "system.block_size": 8, "seed": 1, "request_throughput": 3.0,
         "status": "ok"},
        {"system": "vllm", "system.block_size": 16, "seed": 0, "request_throughput": 5.0,
         "status": "ok"},
        {"system": "vllm", "system.block_size": 16, "seed": 1, "request_throughput": None,
         "status": "failed"},
        {"system": "orca_max", "system.block_size": 8, "seed": 0, "request_throughput": 0.5,
         "status": "ok"},
    ]  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(folder / "summary.csv", index=False)
    return folder


def test_points_average_their_runs_and_leave_failed_ones_out(tmp_path: Path, capsys) -> None:
    pytest.importorskip("matplotlib")
    sweep = _summary(tmp_path / "sweep")
    argv = [str(sweep), "--x", "system.block_size", "--y", "request_throughput",
            "--hue", "system"]  # fmt: skip
    assert sweep_plot.main(argv) == 0
    table = pd.read_csv(sweep / "sweep_request_throughput.csv")
    vllm = table[table["system"] == "vllm"].set_index("system.block_size")
    assert vllm.loc[8, ["mean", "min", "max", "runs"]].tolist() == [2.0, 1.0, 3.0, 2]
    assert vllm.loc[16, "runs"] == 1
    assert (sweep / "sweep_request_throughput.png").is_file()
    assert "1 run(s) not finished" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "says"),
    [(["--x", "nope", "--y", "request_throughput"], "no column 'nope'; it has system"),
     (["--x", "system", "--hue", "system", "--y", "request_throughput"], "the x axis already"),
     (["--x", "system.block_size", "--y", "status"], "holds no number")],
)  # fmt: skip
def test_a_column_it_cannot_plot_is_one_line(tmp_path: Path, capsys, args, says) -> None:
    sweep = _summary(tmp_path / "sweep")
    assert sweep_plot.main([str(sweep), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and says in err and "\n" not in err


def test_axes_carry_units_categories_no_line_and_block_sizes_a_log2_scale(
    tmp_path: Path, monkeypatch
) -> None:
    pytest.importorskip("matplotlib")
    from experiments.report import figures

    kept = {}

    def keep(fig, out: Path, name: str) -> Path:
        kept[name] = fig
        return out / f"{name}.png"

    monkeypatch.setattr(figures, "save", keep)
    frame = pd.DataFrame(
        {"system": ["vllm", "orca_max"] * 3, "system.block_size": [8, 8, 16, 16, 32, 32],
         "normalized_latency": [0.1, 0.2, 0.1, 0.3, 0.2, 0.4], "mean_ttft_ms": [5.0] * 6,
         "status": ["ok"] * 6}
    )  # fmt: skip
    file = tmp_path / "summary.csv"
    by_system = {"mean_ttft_ms": sweep_plot.aggregate(frame, "system", "mean_ttft_ms", None, file)}
    sweep_plot.plot(by_system, "system", None, tmp_path)
    ax = kept["sweep_mean_ttft_ms"].axes[0]
    assert ax.get_ylabel() == "mean_ttft_ms (ms)" and ax.get_xlabel() == "system"
    assert all(line.get_linestyle() == "None" for line in ax.get_lines())
    by_block = {
        "normalized_latency": sweep_plot.aggregate(
            frame, "system.block_size", "normalized_latency", "system", file
        )
    }
    sweep_plot.plot(by_block, "system.block_size", "system", tmp_path)
    ax = kept["sweep_normalized_latency"].axes[0]
    assert ax.get_ylabel() == "normalized_latency (s/token)" and ax.get_xscale() == "log"
    assert any(line.get_linestyle() == "-" for line in ax.get_lines())


def _breakdown_summary(folder: Path) -> Path:
    parts = ("token_states", "reserved", "internal_frag", "external_frag", "free_at_limit", "free")
    shares = {  # (system, rate, seed): the six parts, each run's summing to 100
        ("vllm", 1.0, 0): (60, 0, 2, 1, 0, 37),
        ("vllm", 1.0, 1): (70, 0, 2, 1, 0, 27),
        ("vllm", 2.0, 0): (90, 0, 2, 3, 0, 5),
        ("orca_max", 1.0, 0): (20, 15, 55, 8, 0, 2),
    }
    rows = [
        {"system": s, "workload.rate": r, "seed": k, "status": "ok",
         **{f"kv_{p}_pct": v for p, v in zip(parts, values, strict=True)}}
        for (s, r, k), values in shares.items()
    ]  # fmt: skip
    rows.append({"system": "orca_max", "workload.rate": 2.0, "seed": 0, "status": "failed"})
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(folder / "summary.csv", index=False)
    return folder


def test_kv_breakdown_stacks_each_points_mean_parts(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("matplotlib")
    from experiments.report import figures

    kept = {}
    real_save = figures.save

    def keep(fig, out: Path, name: str) -> Path:
        kept[name] = fig
        return real_save(fig, out, name)

    monkeypatch.setattr(figures, "save", keep)
    sweep = _breakdown_summary(tmp_path / "sweep")
    argv = [str(sweep), "--x", "workload.rate", "--y", "kv_breakdown", "--hue", "system"]
    assert sweep_plot.main(argv) == 0
    table = pd.read_csv(sweep / "sweep_kv_breakdown.csv").set_index(["system", "workload.rate"])
    assert table.loc[("vllm", 1.0), ["kv_token_states_pct", "kv_free_pct", "runs"]].tolist() == [
        65.0, 32.0, 2]  # fmt: skip
    assert ("orca_max", 2.0) not in table.index  # the failed run is left out
    parts = [c for c in table.columns if c.startswith("kv_")]
    assert len(parts) == 6 and (table[parts].sum(axis=1).round(9) == 100).all()
    ax = kept["sweep_kv_breakdown"].axes[0]
    tops = sorted(round(p.get_y() + p.get_height(), 9) for p in ax.patches if p.get_height())
    assert tops[-3:] == [100.0] * 3  # three points, each stacked to 100
    assert len(ax.get_xticklabels()) == 3
    assert (sweep / "sweep_kv_breakdown.png").is_file()


def test_kv_breakdown_without_the_parts_is_one_line(tmp_path: Path, capsys) -> None:
    sweep = _summary(tmp_path / "sweep")
    assert sweep_plot.main([str(sweep), "--x", "system", "--y", "kv_breakdown"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "no column kv_token_states_pct" in err
    assert "\n" not in err


def test_every_metric_side_by_side_in_one_table(tmp_path: Path) -> None:
    # a paper's table: one row per point, each metric's mean (each KV part) beside the rest
    pytest.importorskip("matplotlib")
    sweep = _breakdown_summary(tmp_path / "sweep")
    summary = pd.read_csv(sweep / "summary.csv")
    summary["mean_ttft_ms"] = [100.0, 300.0, 50.0, 1234.5678, None]
    summary.to_csv(sweep / "summary.csv", index=False)
    argv = [str(sweep), "--x", "workload.rate", "--y", "mean_ttft_ms", "--y", "kv_breakdown",
            "--hue", "system"]  # fmt: skip
    assert sweep_plot.main(argv) == 0
    table = pd.read_csv(sweep / "sweep_table.csv")
    assert list(table.columns[:3]) == ["system", "workload.rate", "mean_ttft_ms"]
    assert list(table.columns[-2:]) == ["kv_free_pct", "runs"]
    vllm = table.set_index(["system", "workload.rate"]).loc[("vllm", 1.0)]
    assert vllm[["mean_ttft_ms", "kv_token_states_pct", "runs"]].tolist() == [200.0, 65.0, 2]
    assert len(table) == 3  # the failed run's point is left out
    md = (sweep / "sweep_table.md").read_text().splitlines()
    assert md[0].startswith("| system | workload.rate | mean_ttft_ms | kv_token_states_pct |")
    assert md[1].startswith("|---|") and len(md) == 5
    assert "| orca_max | 1.0 | 1235 | 20 |" in (sweep / "sweep_table.md").read_text()


def test_categories_keep_the_sweeps_order_and_numbers_ascend(tmp_path: Path, monkeypatch) -> None:
    # categories were sorted alphabetically (orca_max before vllm_v1 in every table and
    # figure) rather than shown as the sweep ran them
    pytest.importorskip("matplotlib")
    from experiments.report import figures

    kept = {}

    def keep(fig, out: Path, name: str) -> Path:
        kept[name] = fig
        return out / f"{name}.png"

    monkeypatch.setattr(figures, "save", keep)
    systems = ["vllm_v1", "vllm_v1_nopc", "orca_max"]
    rows = [
        {"system": s, "workload.rate": r, "status": "ok", "mean_ttft_ms": 10.0 * i + r,
         **{f"kv_{p}_pct": v for p, v in zip(
             ("token_states", "reserved", "internal_frag", "external_frag", "free_at_limit",
              "free"), (50, 0, 0, 0, 0, 50), strict=True)}}
        for r in (2.0, 1.0) for i, s in enumerate(systems)
    ]  # fmt: skip
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    pd.DataFrame(rows).to_csv(sweep / "summary.csv", index=False)
    argv = [str(sweep), "--x", "workload.rate", "--y", "mean_ttft_ms", "--y", "kv_breakdown",
            "--hue", "system"]  # fmt: skip
    assert sweep_plot.main(argv) == 0
    for name in ("sweep_mean_ttft_ms.csv", "sweep_kv_breakdown.csv", "sweep_table.csv"):
        table = pd.read_csv(sweep / name)
        assert list(dict.fromkeys(table["system"])) == systems, name
        assert list(table["workload.rate"][:2]) == [1.0, 2.0], name  # numbers ascend
    legend = kept["sweep_mean_ttft_ms"].axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == systems
    bars = kept["sweep_kv_breakdown"].axes[0].get_xticklabels()
    assert [t.get_text().split("\n")[0] for t in bars[:3]] == systems
    # the system on the x axis: its categories in the sweep's order
    assert sweep_plot.main([str(sweep), "--x", "system", "--y", "mean_ttft_ms"]) == 0
    ax = kept["sweep_mean_ttft_ms"].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == systems


def test_a_text_keys_missing_value_comes_last() -> None:
    # sweep_order's contract: a missing value last; a text key's came where it first
    # appeared (a job that did not set the key, e.g. two sweeps' summaries put together)
    frame = pd.DataFrame(
        {"workload": ["sharegpt", None, "alpaca", float("nan")], "y": [1.0, 2.0, 3.0, 4.0]}
    )
    order = sweep_plot.sweep_order(frame, "workload")
    assert order[:2] == ["sharegpt", "alpaca"] and len(order) == 3 and pd.isna(order[2])
    table = sweep_plot.aggregate(frame, "workload", "y", None, Path("summary.csv"))
    assert list(table["workload"][:2]) == ["sharegpt", "alpaca"]
    assert pd.isna(table["workload"][2]) and table["mean"][2] == 3.0


def _hardware_summary(folder: Path) -> Path:
    """A sweep of hardware x system x cost, as summary.csv lays it out: the overrides, then
    the headline metrics."""
    rows = [
        {"job": i, "hardware": h, "system": s, "cost": c, "completed": 10,
         "request_throughput": 1.0 + i, "status": "ok"}
        for i, (h, s, c) in enumerate(
            (h, s, c) for h in ("a100-80gb", "l40s") for s in ("vllm", "vllm_v1")
            for c in ("roofline", "profiled")
        )
    ]  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(folder / "summary.csv", index=False)
    return folder


def test_categories_on_x_with_systems_as_hue_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    sweep = _hardware_summary(tmp_path / "sweep")
    argv = [str(sweep), "--x", "hardware", "--hue", "system", "--y", "request_throughput"]
    assert sweep_plot.main(argv) == 0
    assert (sweep / "sweep_request_throughput.png").is_file()


def test_a_swept_key_neither_axis_names_is_warned_of(tmp_path: Path, capsys) -> None:
    pytest.importorskip("matplotlib")
    sweep = _hardware_summary(tmp_path / "sweep")
    argv = [str(sweep), "--x", "hardware", "--hue", "system", "--y", "request_throughput"]
    assert sweep_plot.main(argv) == 0
    err = capsys.readouterr().err
    assert "warning: each point averages runs of differing cost (roofline, profiled)" in err
    assert err.count("\n") == 1  # cost alone: hardware and system are the axes
    assert sweep_plot.main([*argv[:4], "cost", *argv[5:]]) == 0  # cost as the hue
    assert "differing system (vllm, vllm_v1)" in capsys.readouterr().err  # system now
