"""Sittings of ``cpu_cross_run`` side by side: ``python -m experiments.bench.cross_run_summary
SITTING_DIR... [--out CSV] [--within 0.05]``.

Issue 9's target: a model calibrated on one run predicts another run's throughput, mean TPOT
and mean E2E within 5%. For each sitting's ``cross_run.json`` and each way it was validated
(``as is``; ``timed``, at the sitting's speed as measured; ``shrunk``, at that speed shrunk by
its own scatter, where the sitting has it), one row: the worst relative error over every pair
of distinct runs (``role`` "other run") and those three metrics, which pair and metric it
was, how many pairs meet ``--within`` on all three, and the engine against itself (its worst
repeatability difference on the same metrics). Also the shrinkage's ``tau`` and the machine
the runs were served on (``hardware`` in ``run_s/metrics.json`` beside the file, where kept).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from experiments.bench.tables import print_table, write_csv
from experiments.lib.args import OneLineParser
from experiments.lib.checks import ConfigError
from experiments.lib.cli import plain_cli
from experiments.lib.results import read_metrics

TARGET_METRICS = ("request_throughput", "mean_tpot_ms", "mean_e2el_ms")
MODES = (("as is", "rows"), ("timed", "timed_rows"), ("shrunk", "shrunk_rows"))


def read_sitting(path: Path) -> dict[str, Any]:
    """A sitting's ``cross_run.json`` (``path`` is the file or its folder), checked by
    :func:`check_sitting`; a :class:`ConfigError` naming the file when it is missing or not a
    cross-run result."""
    file = path if path.suffix == ".json" else path / "cross_run.json"
    try:
        doc = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(str(file), f"not a readable cross_run.json ({err})") from None
    if not isinstance(doc, dict) or "rows" not in doc:
        raise ConfigError(str(file), "has no 'rows': not a cpu_cross_run result")
    check_sitting(doc, str(file))
    return doc


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_sitting(doc: dict[str, Any], file: str) -> None:
    """Raise a :class:`ConfigError` naming ``file`` and the row for what :func:`summarise`
    cannot use: ``rows`` (or a ``timed_rows``/``shrunk_rows`` it holds) not a list of
    objects with ``role`` and ``metric``; an "other run" row on a target metric without a
    finite ``rel_err`` or without ``calibrated_on``/``validated_on``; a ``repeatability``
    row whose ``rel_diff`` is neither null nor a finite number."""
    for _, key in MODES:
        rows = doc.get(key)
        if rows is None and key != "rows":
            continue
        if not isinstance(rows, list):
            raise ConfigError(file, f"'{key}' is not a list of rows", rows)
        for i, r in enumerate(rows):
            where = f"{key}[{i}]"
            if not isinstance(r, dict):
                raise ConfigError(file, f"{where} is not an object", r)
            for name in ("role", "metric"):
                if name not in r:
                    raise ConfigError(file, f"{where} has no '{name}'")
            if r["role"] != "other run" or r["metric"] not in TARGET_METRICS:
                continue
            if not _number(r.get("rel_err")):
                raise ConfigError(file, f"{where}: 'rel_err' is not a finite number",
                                  r.get("rel_err"))  # fmt: skip
            for name in ("calibrated_on", "validated_on"):
                if name not in r:
                    raise ConfigError(file, f"{where} has no '{name}'")
    repeat = doc.get("repeatability") or []
    if not isinstance(repeat, list):
        raise ConfigError(file, "'repeatability' is not a list of rows", repeat)
    for i, r in enumerate(repeat):
        where = f"repeatability[{i}]"
        if not isinstance(r, dict) or "metric" not in r:
            raise ConfigError(file, f"{where} is not an object with a 'metric'", r)
        if r.get("rel_diff") is not None and not _number(r["rel_diff"]):
            raise ConfigError(file, f"{where}: 'rel_diff' is neither null nor a finite number",
                              r["rel_diff"])  # fmt: skip
    shrinkage = doc.get("speed_shrinkage")
    if shrinkage is not None and not isinstance(shrinkage, dict):
        raise ConfigError(file, "'speed_shrinkage' is not an object", shrinkage)


def machine_of(path: Path) -> str:
    """The ``hardware`` the sitting's span run recorded, or ``?``."""
    folder = path.parent if path.suffix == ".json" else path
    try:
        return str(read_metrics(folder / "run_s")["hardware"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return "?"


def summarise(
    doc: dict[str, Any], name: str, within: float, machine: str = "?"
) -> list[dict[str, Any]]:
    """One row per way ``doc`` was validated (:data:`MODES`, those it holds)."""
    repeat = [
        abs(r["rel_diff"]) for r in doc.get("repeatability", [])
        if r["metric"] in TARGET_METRICS and r.get("rel_diff") is not None
    ]  # fmt: skip
    tau = (doc.get("speed_shrinkage") or {}).get("tau")
    out = []
    for mode, key in MODES:
        rows = [
            r for r in doc.get(key) or []
            if r["role"] == "other run" and r["metric"] in TARGET_METRICS
        ]  # fmt: skip
        if not rows:
            continue
        worst = max(rows, key=lambda r: abs(r["rel_err"]))
        pairs: dict[tuple[str, str], bool] = {}
        for r in rows:
            pair = (r["calibrated_on"], r["validated_on"])
            pairs[pair] = pairs.get(pair, True) and abs(r["rel_err"]) <= within
        out.append({
            "sitting": name, "machine": machine, "validated": mode,
            "pairs_met": sum(pairs.values()), "pairs": len(pairs), "worst_err": worst["rel_err"],
            "worst_pair": f"{worst['calibrated_on']} -> {worst['validated_on']}",
            "worst_metric": worst["metric"],
            "engine_vs_itself": max(repeat, default=float("nan")),
            "tau": float("nan") if tau is None else tau,
        })  # fmt: skip
    return out


@plain_cli
def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m experiments.bench.cross_run_summary")
    parser.add_argument("sittings", nargs="+", type=Path, help="cpu_cross_run output folders")
    parser.add_argument("--within", type=float, default=0.05, help="the target (0.05: 5%%)")
    parser.add_argument("--out", type=Path, help="write the rows to this CSV")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not 0 < args.within < 1:
        raise ConfigError("--within", "must lie between 0 and 1", args.within)
    rows = []
    for path in args.sittings:
        doc = read_sitting(path)
        rows += summarise(doc, path.name or str(path), args.within, machine_of(path))
    print_table(f"every pair of distinct runs, within {args.within:.0%} on "
                f"{', '.join(TARGET_METRICS)}", rows)  # fmt: skip
    if args.out is not None:
        write_csv(args.out, rows)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
