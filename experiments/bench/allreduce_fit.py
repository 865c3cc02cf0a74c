"""The tensor-parallel all-reduce's two constants, fitted and held out. ::

    python -m experiments.bench.allreduce_fit [--table CSV] [--out DIR] [--no-plot]

The paper-era clock (``cost=profiled`` with the shipped A100 profile) prices each of a
tensor-parallel step's all-reduces (two per layer) as ``latency + 2 (n - 1) / n × bytes /
(efficiency × the peer link)`` (:mod:`sim.cost.allreduce`). Both constants are fitted on
Vidur's A100 all-reduce table (``--table``, default
``../shared/measurements/vidur/a100/all_reduce_pairwise_nvlink.csv`` beside the repository)
against the A100's NVLink, 300 GB/s per direction (the catalog's ``a100-80gb``), as
``experiments.lib.embed_profile`` does for the profile it ships.

Vidur measured a node of four A100s joined by NVLink in pairs (its node ``a100_pairwise
_nvlink``). The split, on the table's 2-GPU rows (one NVLink pair):

- the latency is fitted on the sizes up to 256 KiB;
- the efficiency on the sizes from 32 MiB;
- the sizes between are held out. Each reduce-scatters and gathers while both terms count.

The 4-GPU rows are held out as a second test. Their ring also crosses PCIe between the
pairs, so they are priced on the A100's PCIe Gen4 x16 link (32 GB/s per direction) at the
same efficiency: the rule ``cost=profiled`` applies to any GPU's peer link.

Prints the fit and the error by size band. Writes to ``--out``:
- ``fit.json``: the constants and how they were fitted;
- ``errors.csv``: every row, measured and predicted;
- ``bands.csv``: mean and median signed error and mean absolute error per GPU count and
  size band, in %;
- ``allreduce_fit.png``/``.pdf``: time against size, measured and fitted.
"""

from __future__ import annotations

import bisect
import itertools
import json
from pathlib import Path

import numpy as np

from experiments.bench.tables import print_table, write_csv
from experiments.lib.args import OneLineParser
from experiments.lib.checks import ConfigError
from experiments.lib.cli import plain_cli
from experiments.lib.results import write_atomic
from sim.catalog import get_gpu
from sim.cost.allreduce import (
    AllReduceFit,
    AllReduceTable,
    fit_allreduce,
    read_allreduce_table,
    ring_allreduce_s,
)

TABLE = (
    Path(__file__).resolve().parents[2]
    / "../shared/measurements/vidur/a100/all_reduce_pairwise_nvlink.csv"
)
GPU = "a100-80gb"  # Vidur's a100 profiles are A100 80GB (Vidur's README)
# edges (bytes) inside the held-out sizes; a decode step's all-reduce (tokens × hidden × 2 B)
# lies below 1 MiB up to some 40 sequences
HELD_OUT_EDGES = (2**20, 2**22, 2**24)


def size_text(b: float) -> str:
    return f"{b / 2**20:g} MiB" if b >= 2**20 else f"{b / 1024:g} KiB"


def size_bands(fit: AllReduceFit) -> tuple[list[float], list[str]]:
    """The band edges and names: the fit's latency band (``<= small_max``), the held-out
    sizes cut at :data:`HELD_OUT_EDGES` (each ``low < size <= high``) and its efficiency
    band (``>= large_min``); :func:`band_index` places a size."""
    edges = [fit.small_max, *(e for e in HELD_OUT_EDGES if fit.small_max < e < fit.large_min),
             fit.large_min]  # fmt: skip
    names = [f"<= {size_text(edges[0])}",
             *(f"{size_text(lo)}-{size_text(hi)}" for lo, hi in itertools.pairwise(edges)),
             f">= {size_text(edges[-1])}"]  # fmt: skip
    return edges, names


def band_index(size: float, edges: list[float]) -> int:
    """The band of ``size`` among :func:`size_bands`' names."""
    if size <= edges[0]:
        return 0
    if size >= edges[-1]:
        return len(edges)
    return bisect.bisect_left(edges, size)


def predictions(table: AllReduceTable, fit: AllReduceFit, pcie: float) -> list[dict]:
    """Every row of ``table`` with its prediction: the 2-GPU rows on the NVLink the fit is
    of, the others on the ``pcie`` link (bytes/s per direction) at the same efficiency;
    ``role`` says which rows the fit read."""
    rows = []
    for size, workers, measured in zip(table.size, table.workers, table.seconds, strict=True):
        link = fit.link_bandwidth if workers == fit.workers else pcie
        predicted = float(ring_allreduce_s(size, int(workers), fit.latency_s,
                                           fit.efficiency * link))  # fmt: skip
        role = fit.role(size, int(workers))
        role = f"fit: {role}" if role in ("latency", "efficiency") else role
        rows.append({
            "workers": int(workers), "size_bytes": int(size), "role": role,
            "measured_ms": round(float(measured) * 1e3, 6),
            "predicted_ms": round(predicted * 1e3, 6),
            "error_pct": round((predicted / float(measured) - 1) * 100, 3),
        })  # fmt: skip
    return rows


def bands(rows: list[dict], fit: AllReduceFit) -> list[dict]:
    """Mean and median signed error and mean absolute error (%) per GPU count and size band
    (:func:`size_bands`)."""
    edges, names = size_bands(fit)
    out = []
    for workers in sorted({r["workers"] for r in rows}):
        for i, name in enumerate(names):
            picked = [r for r in rows if r["workers"] == workers
                      and band_index(r["size_bytes"], edges) == i]  # fmt: skip
            if not picked:
                continue
            err = np.array([r["error_pct"] for r in picked])
            roles = sorted({r["role"] for r in picked})
            out.append({
                "workers": workers, "sizes": name, "rows": len(picked),
                "role": " + ".join(roles), "mean_error_pct": round(float(err.mean()), 1),
                "median_error_pct": round(float(np.median(err)), 1),
                "mean_abs_error_pct": round(float(np.abs(err).mean()), 1),
                "measured_median_ms": round(float(np.median([r["measured_ms"] for r in picked])),
                                            4),
            })  # fmt: skip
    return out


def held_out_summary(rows: list[dict]) -> list[dict]:
    """Mean and median signed error and mean and largest absolute error over each held-out
    set."""
    out = []
    for role in ("held out", "held out (another GPU count)"):
        err = np.array([r["error_pct"] for r in rows if r["role"] == role])
        if len(err):
            out.append({"rows": role, "count": len(err),
                        "mean_error_pct": round(float(err.mean()), 1),
                        "median_error_pct": round(float(np.median(err)), 1),
                        "mean_abs_error_pct": round(float(np.abs(err).mean()), 1),
                        "max_abs_error_pct": round(float(np.abs(err).max()), 1)})  # fmt: skip
    return out


def plot(rows: list[dict], fit: AllReduceFit, out: Path) -> Path:
    from experiments.report.figures import pyplot, save

    plt = pyplot(headless=True)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for workers, color in ((2, "tab:blue"), (4, "tab:orange")):
        mine = sorted((r for r in rows if r["workers"] == workers), key=lambda r: r["size_bytes"])
        if not mine:
            continue
        x = [r["size_bytes"] for r in mine]
        ax.scatter(x, [r["measured_ms"] for r in mine], s=4, color=color, alpha=0.4,
                   label=f"measured, {workers} GPUs")  # fmt: skip
        held = " (PCIe link, held out)" if workers != fit.workers else ""
        ax.plot(x, [r["predicted_ms"] for r in mine], color=color,
                label=f"fitted, {workers} GPUs{held}")  # fmt: skip
    for edge in (fit.small_max, fit.large_min):
        ax.axvline(edge, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("all-reduce size (bytes)")
    ax.set_ylabel("time (ms)")
    ax.set_title("Vidur's A100 all-reduce table: latency + bytes / bandwidth", fontsize=10)
    ax.legend(fontsize=8)
    path = save(fig, out, "allreduce_fit")
    plt.close(fig)
    return path


@plain_cli
def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m experiments.bench.allreduce_fit", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--table", type=Path, default=TABLE,
                        help="Vidur's all-reduce CSV (default: ../shared/measurements/"
                             "vidur/a100/all_reduce_pairwise_nvlink.csv beside the "
                             "repository)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("results/allreduce_fit"),
                        help="directory for fit.json, errors.csv, bands.csv and the "
                             "figure")  # fmt: skip
    parser.add_argument("--no-plot", action="store_true", help="write no figure")
    args = parser.parse_args(argv)
    if not args.table.is_file():
        raise ConfigError("--table", "not a file", str(args.table))
    gpu = get_gpu(GPU)
    table = read_allreduce_table(args.table)  # a damaged row: one line (plain_cli)
    fit = fit_allreduce(table, gpu.peer_link_bandwidth)
    rows = predictions(table, fit, gpu.host_link_bandwidth)
    print(f"fit: latency {fit.latency_s * 1e6:.1f} us, efficiency {fit.efficiency:.3f} "
          f"({fit.note})")  # fmt: skip
    by_band = bands(rows, fit)
    summary = held_out_summary(rows)
    print_table("error % by GPU count and size band (predicted / measured - 1)", by_band)
    print_table("held out", summary)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "latency_s": fit.latency_s, "efficiency": fit.efficiency,
        "link_bandwidth_bytes_per_s": fit.link_bandwidth, "workers": fit.workers,
        "small_max_bytes": fit.small_max, "large_min_bytes": fit.large_min,
        "rows": {"latency": fit.small_rows, "efficiency": fit.large_rows,
                 "held_out": fit.held_out_rows},
        "held_out": summary, "note": fit.note,
        "command": "python -m experiments.bench.allreduce_fit",
    }  # fmt: skip
    write_atomic(args.out / "fit.json", json.dumps(meta, indent=2) + "\n")
    write_csv(args.out / "errors.csv", rows)
    write_csv(args.out / "bands.csv", by_band)
    written = ["fit.json", "errors.csv", "bands.csv"]
    if not args.no_plot:
        written.append(plot(rows, fit, args.out).name)
    print("wrote " + ", ".join(str(args.out / name) for name in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
