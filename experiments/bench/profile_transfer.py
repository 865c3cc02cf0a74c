"""How far does a profile carry? ``cost=profiled``'s transfer held against measured tables. ::

    python -m experiments.bench.profile_transfer [--vidur DIR] [--out DIR]

``cost=profiled`` prices a model, GPU or tensor-parallel degree it has no profile of by
transferring the profile it has (:mod:`sim.cost.profiled`): the reproduction's Fig. 12 (b)
and (c) (OPT-66B at tp 4, OPT-175B at tp 8) and every GPU but the A100 rest on it. Vidur's
tables (``--vidur``, default ``../shared/measurements/vidur`` beside the repository)
measured the decoder layer's matmuls (``linear``) and elementwise operators (``other``) of
three model-GPU pairs at tp 1, 2, 4 and 8. The source is the one kvlab ships: A100
Llama-2-7B at tp 1. Every other table and tp is held out:

- A100 CodeLlama-34B at tp 1, 2, 4, 8: another layer shape (hidden 8192, 8 KV heads);
- A100 Llama-2-7B at tp 2, 4, 8: tensor parallelism alone;
- H100 Llama-2-7B at tp 1, 2, 4, 8: another GPU;
- the same H100 tables priced from the whole A100 folder (every table at every tp), whose
  table nearest each target's shard is transferred (:func:`~sim.cost.profiled.
  nearest_shard`; ``H100 Llama-2-7B (A100 set)``).

For each, the profiled model built on the source for that model, GPU and tp prices one layer's
``linear`` and ``other`` at every measured token count (:meth:`ProfiledCostModel.
layer_op_seconds`), against the measured medians. Writes ``--out``'s ``transfer_points.csv``
(every point) and ``transfer_errors.csv`` (per target, tp, op and token band: mean signed
error, mean absolute error, largest absolute error, in %) and prints the table.

Which shard a profile was measured on matters too: ``shard_matrix.csv`` prices every A100
table's matmuls from every other A100 table (Llama-2-7B and CodeLlama-34B at tp 1, 2, 4,
8: eight shards of 25-692 M weights), with each shard's weights beside the mean error on
1-64 and 513-4,096 tokens.

One constant is fitted: the matmuls' fixed part (:mod:`sim.cost.fixed_latency`). The source
carries the shipped profile's, fitted on CodeLlama-34B's A100 tables, so the A100
Llama-2-7B and H100 rows hold it out and the CodeLlama-34B rows do not; each A100 table of
the set carries its own table's; in ``shard_matrix.csv`` each source carries the other
model's. ``--no-fixed-part`` prices every transfer without one (the rule before
2026-12-05's fixed part: ``docs/validation/profile-transfer/after/``).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np

from experiments.bench.tables import print_table, write_csv
from experiments.lib.args import OneLineParser
from experiments.lib.checks import ConfigError
from experiments.lib.cli import check_out_dir, plain_cli
from sim.catalog import ModelSpec, get_model
from sim.cost.profile import (
    LayerShape,
    OperatorProfile,
    read_profile_set,
    read_vidur_profile,
    read_vidur_tables,
)
from sim.cost.profiled import ProfiledCostModel, nearest_shard, shard_weights

VIDUR = Path(__file__).resolve().parents[2] / "../shared/measurements/vidur"
SOURCE = ("a100/mlp_llama-2-7b.csv", 1)
FIXED_SOURCE = "a100/mlp_codellama-34b.csv"  # as experiments.lib.embed_profile's
TARGETS = (
    ("A100 CodeLlama-34B", "a100/mlp_codellama-34b.csv", (1, 2, 4, 8)),
    ("A100 Llama-2-7B", "a100/mlp_llama-2-7b.csv", (2, 4, 8)),
    ("H100 Llama-2-7B", "h100/mlp_llama-2-7b.csv", (1, 2, 4, 8)),
)
# priced from every A100 table at once (``cost.profile=<the a100 folder>``): the one nearest
# each target's shard is transferred to the H100
SET_TARGETS = (("H100 Llama-2-7B (A100 set)", "h100/mlp_llama-2-7b.csv", (1, 2, 4, 8)),)
MATRIX_TABLES = (
    ("A100 Llama-2-7B", "a100/mlp_llama-2-7b.csv"),
    ("A100 CodeLlama-34B", "a100/mlp_codellama-34b.csv"),
)
# token-count bands: decode-sized steps, mid-sized, prefill-sized
BANDS = ((1, 64), (65, 512), (513, 4096))
OPS = ("linear", "other", "layer")


def model_of(shape: LayerShape, name: str) -> ModelSpec:
    """A Llama-family model with ``shape``'s decoder layer (the catalog's LLaMA-7B
    otherwise: only the layer is priced here)."""
    return replace(
        get_model("llama-7b"),
        name=name,
        hidden_size=shape.hidden_size,
        num_heads=shape.num_heads,
        num_kv_heads=shape.kv_size // shape.head_dim,
        head_dim=shape.head_dim,
        ffn_hidden_size=shape.ffn_hidden_size,
        gated_mlp=shape.gated_mlp,
    )


def points(
    source: OperatorProfile | list[OperatorProfile], label: str, measured: OperatorProfile
) -> list[dict]:
    """One row per measured token count: the measured and priced seconds of each op, priced
    from ``source`` (a profile, or a set of them: :func:`sim.cost.profiled.nearest_shard`
    picks one)."""
    assert measured.layer_shape is not None
    target = model_of(measured.layer_shape, label)
    if isinstance(source, list):
        source = nearest_shard(source, measured.layer_shape, measured.tp, measured.gpu)
    cost = ProfiledCostModel(source, target, measured.gpu, tp=measured.tp, stack="none")
    n, _, lin = measured.ops["linear"]
    n_other, _, other = measured.ops["other"]
    assert np.array_equal(n, n_other)
    got = {op: cost.layer_op_seconds(op, n) for op in ("linear", "other")}
    got["layer"] = got["linear"] + got["other"]
    want = {"linear": lin, "other": other, "layer": lin + other}
    return [
        {
            "target": label,
            "tp": measured.tp,
            "num_tokens": int(tokens),
            **{f"{op}_measured_ms": round(float(want[op][i]) * 1e3, 6) for op in OPS},
            **{f"{op}_priced_ms": round(float(got[op][i]) * 1e3, 6) for op in OPS},
        }
        for i, tokens in enumerate(n)
    ]


def errors(rows: list[dict]) -> list[dict]:
    """Per op and token band (and all of them) of one target and tp: the error's mean, mean
    absolute and largest absolute value, in %."""
    n = np.array([r["num_tokens"] for r in rows])
    out = []
    for op in OPS:
        want = np.array([r[f"{op}_measured_ms"] for r in rows])
        err = 100 * (np.array([r[f"{op}_priced_ms"] for r in rows]) - want) / want
        for lo, hi in (*BANDS, (1, int(n.max()))):
            sel = (n >= lo) & (n <= hi)
            out.append(
                {
                    "target": rows[0]["target"],
                    "tp": rows[0]["tp"],
                    "op": op,
                    "tokens": f"{lo}-{hi}" if (lo, hi) in BANDS else "all",
                    "points": int(sel.sum()),
                    "mean_error_pct": round(float(err[sel].mean()), 1),
                    "mean_abs_error_pct": round(float(np.abs(err[sel]).mean()), 1),
                    "max_abs_error_pct": round(float(np.abs(err[sel]).max()), 1),
                }
            )
    return out


def summary(errs: list[dict]) -> list[dict]:
    """The printed table: per target and tp, the layer's mean absolute error and each op's
    mean error on decode-sized and prefill-sized steps."""
    by = {(e["target"], e["tp"], e["op"], e["tokens"]): e for e in errs}
    small, large = (f"{lo}-{hi}" for lo, hi in (BANDS[0], BANDS[-1]))
    return [
        {
            "target": t,
            "tp": tp,
            "layer |err| %": by[(t, tp, "layer", "all")]["mean_abs_error_pct"],
            **{
                f"{op} err % ({band} tok)": by[(t, tp, op, band)]["mean_error_pct"]
                for op in OPS
                for band in (small, large)
            },
        }
        for t, tp in dict.fromkeys((e["target"], e["tp"]) for e in errs)
    ]


def with_fixed_parts_of(prof: OperatorProfile, donor: OperatorProfile) -> OperatorProfile:
    """``prof`` carrying ``donor``'s fixed parts (both ops) and their sources."""
    return replace(
        prof,
        linear_fixed_s=donor.linear_fixed_s,
        linear_fixed_source=donor.linear_fixed_source,
        other_fixed_s=donor.other_fixed_s,
        other_fixed_source=donor.other_fixed_source,
    )


def without_fixed_part(prof: OperatorProfile) -> OperatorProfile:
    """``prof`` priced by the plain roofline ratio (no fixed part)."""
    return replace(prof, linear_fixed_s=0.0, linear_fixed_source=None, other_fixed_s=0.0,
                   other_fixed_source=None)  # fmt: skip


def shard_matrix(vidur: Path, fixed_part: bool = True) -> list[dict]:
    """Every A100 table's ``linear`` priced from every other A100 table (two models at four
    tp each): the mean error on 1-64 and 513-4,096 tokens against both shards' weights.
    Each source carries the fixed part fitted on the other model's tables (or none)."""
    by_model = {label: read_vidur_tables(vidur / path) for label, path in MATRIX_TABLES}
    tables = []
    for label, own in by_model.items():
        other = next(t for lab, t in by_model.items() if lab != label)[0]
        for prof in own:
            held_out = with_fixed_parts_of(prof, other)
            tables.append((label, held_out if fixed_part else without_fixed_part(prof)))
    rows = []
    for target_label, target in tables:
        for source_label, source in tables:
            if source is target:
                continue
            errs = errors(points(source, target_label, target))
            by = {e["tokens"]: e["mean_error_pct"] for e in errs if e["op"] == "linear"}
            rows.append(
                {
                    "target": target_label,
                    "target_tp": target.tp,
                    "target_shard_M": round(shard_weights(target) / 1e6),
                    "source": source_label,
                    "source_tp": source.tp,
                    "source_shard_M": round(shard_weights(source) / 1e6),
                    "linear_err_pct_1_64": by[f"{BANDS[0][0]}-{BANDS[0][1]}"],
                    "linear_err_pct_513_4096": by[f"{BANDS[-1][0]}-{BANDS[-1][1]}"],
                }
            )
    return rows


def run(vidur: Path, fixed_part: bool = True) -> tuple[list[dict], list[dict]]:
    """(every point, the errors) of every held-out table against the source's transfer,
    with the fixed parts the module doc says (or none)."""
    fixed = read_vidur_tables(vidur / FIXED_SOURCE)[0]
    source = with_fixed_parts_of(read_vidur_profile(vidur / SOURCE[0], SOURCE[1]), fixed)
    a100_set = read_profile_set(vidur / "a100")
    if not fixed_part:
        source = without_fixed_part(source)
        a100_set = [without_fixed_part(p) for p in a100_set]
    all_points: list[dict] = []
    errs: list[dict] = []
    for label, path, tps in TARGETS:
        for tp in tps:
            rows = points(source, label, read_vidur_profile(vidur / path, tp))
            all_points += rows
            errs += errors(rows)
    for label, path, tps in SET_TARGETS:  # from the A100 folder, by the nearest shard
        for tp in tps:
            rows = points(a100_set, label, read_vidur_profile(vidur / path, tp))
            all_points += rows
            errs += errors(rows)
    return all_points, errs


@plain_cli
def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m experiments.bench.profile_transfer", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--vidur", type=Path, default=VIDUR,
                        help="Vidur's profile tables: a100/, h100/ (default: "
                             "../shared/measurements/vidur beside the repository)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("results/profile_transfer"),
                        help="directory for the three CSV files")  # fmt: skip
    parser.add_argument("--no-fixed-part", action="store_true",
                        help="price every transfer by the plain roofline ratio, without the "
                             "matmuls' fitted fixed part (the rule before it)")  # fmt: skip
    args = parser.parse_args(argv)
    if not args.vidur.is_dir():
        raise ConfigError("--vidur", "not a directory", str(args.vidur))
    check_out_dir(args.out)  # before the tables' seconds of work
    # far shards are priced on purpose here: their warning is what the tables measure
    logging.getLogger("sim.cost.profiled").setLevel(logging.ERROR)
    fixed_part = not args.no_fixed_part
    all_points, errs = run(args.vidur, fixed_part)  # a damaged table: one line (plain_cli)
    matrix = shard_matrix(args.vidur, fixed_part)
    print_table(
        "priced against measured, error %: from the shipped A100 Llama-2-7B tp-1 table, or"
        " ('A100 set') from the A100 folder's table nearest each shard",
        summary(errs),
    )
    print_table("A100 matmuls priced from another A100 table (linear error %)", matrix)
    args.out.mkdir(parents=True, exist_ok=True)
    written = {"transfer_points.csv": all_points, "transfer_errors.csv": errs,
               "shard_matrix.csv": matrix}  # fmt: skip
    for name, rows in written.items():
        write_csv(args.out / name, rows)
    print("wrote " + ", ".join(str(args.out / name) for name in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
