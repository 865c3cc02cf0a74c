"""Set a profile's first sweeps aside as cold calls:
``python -m experiments.bench.cold_sweep PROFILE_DIR --out DIR [--sweeps 1]``.

A ``profile_gpu --cpu --single-calls`` profile taken before its plan warmed every point
(before 2026-12-04) timed each point's first call in the process in its first sweep. That
call is cold: in the twentieth to twenty-second sittings (a VM that held its speed, malloc
pinned) the first call of a prefill's attention at 2,048 tokens took 3.8–4.9 times the
point's median over the other sweeps, and the LM head at 192 and 384 rows 1.5–2.7 times,
while the median point's first call was within 2% of its others. It then shows as the
machine running 9–44% slow over the sitting's first three stretches, where the engine's
steps ran at the price (``docs/validation/cpu-engine.md``).

This writes a copy of ``PROFILE_DIR`` into ``DIR`` whose ``time_ms`` is the summary (the
sidecar's: the mean for a single-call profile, else the median) of each point's sweeps after
the first ``--sweeps``, and whose sidecar records ``cold_sweeps``. The sweeps stay in
``sweeps_ms``, so a sitting's sweeps keep their places in it;
:func:`experiments.bench.speed_timeline.stretches` gives the cold ones no weight.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.bench import profile_gpu
from experiments.lib.args import OneLineParser
from experiments.lib.checks import ConfigError
from experiments.lib.cli import plain_cli
from experiments.lib.results import write_atomic


def cold_sweeps(meta: dict[str, object]) -> int:
    """How many of a profile's first sweeps are cold calls, from its sidecar (0 if unsaid)."""
    value = meta.get("cold_sweeps", 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError("cold_sweeps", f"must be a whole number >= 0, got {value!r}")
    return value


def set_aside(profile_dir: Path, out: Path, sweeps: int) -> Path:
    """Write ``profile_dir``'s profile into ``out`` with its first ``sweeps`` sweeps set
    aside (see the module doc); returns ``out``."""
    csv_path = profile_dir / "operator_profile.csv"
    json_path = profile_dir / "operator_profile.json"
    for path in (csv_path, json_path):
        if not path.is_file():
            raise ConfigError("PROFILE_DIR", f"{path.name} is missing", str(profile_dir))
    if out.resolve() == profile_dir.resolve():
        raise ConfigError("--out", "must differ from PROFILE_DIR", str(out))
    table = pd.read_csv(csv_path)
    meta = json.loads(json_path.read_text())
    if "sweeps_ms" not in table:
        raise ConfigError("PROFILE_DIR", "its profile records no sweeps_ms", str(profile_dir))
    already = cold_sweeps(meta)
    runs = [profile_gpu.parse_sweeps(cell) for cell in table["sweeps_ms"]]
    count = len(runs[0]) if runs else 0
    if any(len(r) != count for r in runs):
        raise ConfigError("PROFILE_DIR", "its rows hold different numbers of sweeps", str(csv_path))
    if not already <= sweeps < count:
        raise ConfigError("--sweeps", f"must be from {already} to {count - 1}, got {sweeps}")
    summary = np.mean if "mean of" in str(meta.get("method", "")) else np.median
    table["time_ms"] = [f"{summary(r[sweeps:]):.6g}" for r in runs]
    meta = {**meta, "cold_sweeps": sweeps,
            "cold_sweeps_note": f"time_ms summarises sweeps {sweeps + 1}-{count}; the first "
            f"{sweeps} set aside as cold calls by experiments.bench.cold_sweep"}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "operator_profile.csv", lambda tmp: table.to_csv(tmp, index=False))
    write_atomic(out / "operator_profile.json", json.dumps(meta, indent=2) + "\n")
    return out


@plain_cli
def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m experiments.bench.cold_sweep", description=__doc__.split("\n")[0]
    )
    parser.add_argument("profile", type=Path, help="a profile_gpu --out directory")
    parser.add_argument("--out", type=Path, required=True, help="where the copy goes")
    parser.add_argument("--sweeps", type=int, default=1, help="first sweeps set aside (1)")
    args = parser.parse_args(argv)
    out = set_aside(args.profile, args.out, args.sweeps)
    print(f"wrote {out}/operator_profile.csv and .json (first {args.sweeps} sweeps set aside)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
