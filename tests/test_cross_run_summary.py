"""Sittings of cpu_cross_run side by side: the worst error and the pairs that meet 5%."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from experiments.bench.cross_run_summary import main, summarise


def _rows(errors: dict[tuple[str, str], list[float]]) -> list[dict]:
    metrics = ("request_throughput", "mean_tpot_ms", "mean_e2el_ms")
    rows = []
    for (fit, on), errs in errors.items():
        role = "in-sample" if fit == on else "other run"
        for metric, err in zip(metrics, errs, strict=True):
            rows.append({"calibrated_on": fit, "validated_on": on, "role": role,
                         "metric": metric, "rel_err": err})  # fmt: skip
        # TTFT is not part of the target
        rows.append({"calibrated_on": fit, "validated_on": on, "role": role,
                     "metric": "mean_ttft_ms", "rel_err": 0.9})  # fmt: skip
    return rows


DOC = {
    "rows": _rows({("S", "S"): [0.3, 0.3, 0.3], ("S", "A"): [0.01, -0.04, 0.02],
                   ("S", "B"): [0.01, -0.06, 0.0]}),
    "timed_rows": _rows({("S", "A"): [0.01, 0.02, 0.03], ("S", "B"): [0.0, 0.01, -0.02]}),
    "repeatability": [{"metric": "mean_tpot_ms", "rel_diff": -0.012},
                      {"metric": "mean_ttft_ms", "rel_diff": 0.5}],
    "speed_shrinkage": {"tau": 0.02},
}  # fmt: skip


def test_each_way_of_validating_gets_its_worst_pair_and_count() -> None:
    rows = summarise(DOC, "s1", 0.05)
    assert [r["validated"] for r in rows] == ["as is", "timed"]  # no shrunk rows held
    as_is, timed = rows
    assert as_is["pairs"] == 2 and as_is["pairs_met"] == 1  # in-sample left out
    assert as_is["worst_err"] == -0.06 and as_is["worst_pair"] == "S -> B"
    assert as_is["worst_metric"] == "mean_tpot_ms"
    assert timed["pairs_met"] == 2 and timed["worst_err"] == 0.03
    assert as_is["engine_vs_itself"] == 0.012 and as_is["tau"] == 0.02
    assert summarise(DOC, "s1", 0.07)[0]["pairs_met"] == 2


def test_the_cli_writes_a_csv_and_names_a_bad_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sitting = tmp_path / "first"
    sitting.mkdir()
    (sitting / "cross_run.json").write_text(json.dumps(DOC))
    (sitting / "run_s").mkdir()
    (sitting / "run_s" / "metrics.json").write_text(json.dumps({"hardware": "Some CPU"}))
    out = tmp_path / "summary.csv"
    assert main([str(sitting), "--out", str(out)]) == 0
    with out.open() as f:
        written = list(csv.DictReader(f))
    assert [r["validated"] for r in written] == ["as is", "timed"]
    assert {r["machine"] for r in written} == {"Some CPU"}
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "cross_run.json").write_text("{}")
    for argv in ([str(sitting), str(tmp_path / "bad")], [str(tmp_path / "missing")]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
    bad, missing = capsys.readouterr().err.strip().splitlines()
    assert bad.startswith("error: ") and "bad/cross_run.json" in bad and "'rows'" in bad
    assert "missing/cross_run.json" in missing


def _other_run(**changes: object) -> dict:
    row = {"calibrated_on": "S", "validated_on": "A", "role": "other run",
           "metric": "mean_tpot_ms", "rel_err": 0.01}  # fmt: skip
    return {k: v for k, v in (row | changes).items() if v != "DROP"}


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"rows": [_other_run(rel_err=None)]}, "rows[0]: 'rel_err' is not a finite number"),
        ({"rows": [_other_run(), _other_run(rel_err="abc")]}, "rows[1]: 'rel_err'"),
        ({"rows": [_other_run(rel_err=float("nan"))]}, "(got nan)"),
        ({"rows": [_other_run(role="DROP")]}, "rows[0] has no 'role'"),
        ({"rows": [_other_run(validated_on="DROP")]}, "rows[0] has no 'validated_on'"),
        ({"rows": [1, 2]}, "rows[0] is not an object"),
        ({"rows": None}, "'rows' is not a list of rows (got null)"),
        ({"rows": [], "timed_rows": [_other_run(rel_err=True)]}, "timed_rows[0]: 'rel_err'"),
        ({"rows": [], "repeatability": [{"metric": "mean_tpot_ms", "rel_diff": "x"}]},
         "repeatability[0]: 'rel_diff'"),
    ],
)  # fmt: skip
def test_a_bad_row_is_one_line_naming_the_file_and_row(
    doc: dict, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cross_run.json").write_text(json.dumps(doc))
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"error: {tmp_path}/cross_run.json: ")
    assert says in err


def test_an_unused_in_sample_row_may_lack_its_error() -> None:
    from experiments.bench.cross_run_summary import check_sitting

    doc = {"rows": [_other_run(), _other_run(role="in-sample", rel_err=None)]}
    check_sitting(doc, "x.json")
    assert summarise(doc, "s", 0.05)[0]["worst_err"] == 0.01
