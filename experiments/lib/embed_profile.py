"""Write the profile the simulator ships, derived from Vidur's A100 measurement.

``python -m experiments.lib.embed_profile`` reads
``../shared/measurements/vidur/a100/mlp_llama-2-7b.csv`` (Vidur, microsoft/vidur 7d47513,
MIT) with :func:`sim.cost.profile.read_vidur_profile` and writes its ``linear`` and ``other``
operators, tp 1, in kvlab's operator-profile format to :data:`EMBEDDED`, so ``cost=profiled``
(and ``experiments.reproduce``'s paper-era clock) runs on a machine without ``../shared``.
The numbers are Vidur's medians summed per operator group;
``tests/test_embedded_profile.py`` checks the shipped file against a fresh derivation when
``../shared`` is present. Llama-2-7B's layer shape is LLaMA-7B's (hidden 4096, 32 heads,
gated MLP 11008; Touvron et al. 2023), so the profile names the catalog's ``llama-7b``.

The fixed parts of the matmuls and of the elementwise operators (``linear_fixed_s``,
``other_fixed_s``, :mod:`sim.cost.fixed_latency`) are fitted on
another model's tables on the same GPU, :data:`FIXED_SOURCE` (CodeLlama-34B at tp 1, 2, 4
and 8: shards of 87-692 M weights), so that Llama-2-7B's own tables at tp 2, 4 and 8 stay
held out for the transfer it serves (``python -m experiments.bench.profile_transfer``).

The tensor-parallel all-reduce's latency and achieved fraction of the peer link
(``allreduce_latency_s``, ``peer_link_efficiency``, :mod:`sim.cost.allreduce`) are fitted on
:data:`ALLREDUCE_SOURCE`, Vidur's all-reduce table on A100s, against the A100's NVLink
(the catalog's ``a100-80gb``); ``python -m experiments.bench.allreduce_fit`` reports the fit's
error on the sizes it holds out.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path

from experiments.lib.results import write_atomic
from sim.catalog import get_gpu
from sim.cost.allreduce import fit_allreduce, read_allreduce_table
from sim.cost.profile import FORMAT, read_vidur_profile, read_vidur_tables

REPO = Path(__file__).resolve().parents[2]
SOURCE = Path("../shared/measurements/vidur/a100/mlp_llama-2-7b.csv")
FIXED_SOURCE = Path("../shared/measurements/vidur/a100/mlp_codellama-34b.csv")
ALLREDUCE_SOURCE = Path("../shared/measurements/vidur/a100/all_reduce_pairwise_nvlink.csv")
VIDUR = "microsoft/vidur 7d47513, MIT"
EMBEDDED = Path("sim/cost/profiles/vidur-a100-llama-2-7b")


def derive(
    source: Path, fixed_source: Path, allreduce_source: Path
) -> tuple[str, dict[str, object]]:
    """The profile CSV text and sidecar derived from Vidur's ``source`` table at tp 1, with
    the matmuls' fixed part fitted over ``fixed_source``'s tables and the all-reduce's
    constants over ``allreduce_source`` (both on the same GPU)."""
    prof = read_vidur_profile(source, tp=1)
    link = get_gpu(prof.gpu).peer_link_bandwidth
    allreduce = fit_allreduce(read_allreduce_table(allreduce_source), link)
    fixed = read_vidur_tables(fixed_source)[0]
    if fixed.gpu != prof.gpu:
        raise ValueError(f"{fixed_source}: measured on {fixed.gpu}, the profile on {prof.gpu}")
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["op", "num_tokens", "context_tokens", "time_ms"])
    for op in ("linear", "other"):
        n, c, t = prof.ops[op]
        for ni, ci, ti in zip(n, c, t, strict=True):
            writer.writerow([op, int(ni), int(ci), repr(round(float(ti) * 1e3, 9))])
    meta = {
        "format": FORMAT,
        "model": "llama-7b",
        "gpu": prof.gpu,
        "dtype": "float16",
        "tp": 1,
        "block_size": None,
        "ops": ["linear", "other"],
        "other_residual_adds": prof.other_residual_adds,
        "linear_fixed_s": round(fixed.linear_fixed_s, 12),
        "linear_fixed_source": f"{fixed.linear_fixed_source} ({VIDUR})",
        "other_fixed_s": round(fixed.other_fixed_s, 12),
        "other_fixed_source": f"{fixed.other_fixed_source} ({VIDUR})",
        "allreduce_latency_s": round(allreduce.latency_s, 12),
        "peer_link_efficiency": round(allreduce.efficiency, 6),
        "allreduce_source": f"NCCL ring all-reduce, Vidur's {allreduce.note} ({VIDUR})",
        "date": "Vidur commit 7d47513",
        "command": "python -m experiments.lib.embed_profile",
        "source": f"{prof.source}: linear = attn_pre_proj + attn_post_proj + mlp_up_proj + "
        "mlp_down_proj, other = input_layernorm + attn_rope + post_attention_layernorm + "
        "mlp_act + add (medians, ms per layer)",
    }
    return buf.getvalue(), meta


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(
        prog="python -m experiments.lib.embed_profile",
        description=f"Rewrite {EMBEDDED} from {SOURCE}, {FIXED_SOURCE} and {ALLREDUCE_SOURCE} "
        "(takes no arguments).",
    ).parse_args(argv)
    text, meta = derive(REPO / SOURCE, REPO / FIXED_SOURCE, REPO / ALLREDUCE_SOURCE)
    out = REPO / EMBEDDED
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "operator_profile.csv", text)
    write_atomic(out / "operator_profile.json", json.dumps(meta, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
