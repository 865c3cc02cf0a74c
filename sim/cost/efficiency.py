"""Efficiency factors of the roofline cost model, each with the place its value comes from.

Every factor names its source (a measurement, a cited report, or a
calibration on ONE named published data point) and is printed beside any reproduced figure.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

_FIELDS = (
    "compute",
    "memory",
    "per_step_overhead_s",
    "allreduce_latency_s",
    "peer_link_efficiency",
    "pcie_bandwidth",
)


def _default_sources() -> dict[str, str]:
    return {
        "compute": "kvlab's engine profiled on the lent H200 (2026-12-04): OPT-13B's "
        "matmuls of one layer at 4,096 tokens, fp16, 712-719 TFLOP/s of 989 dense peak, "
        "median 0.72 over the five calls (docs/validation/h200/{first,second,third,fourth,"
        "fifth}-run/profile/operator_profile.csv, line 14, op linear); the largest token "
        "count measured, as cost=profiled takes it. Applied to every GPU: no other GPU's "
        "matmuls were measured here",
        "memory": "kvlab's device-to-device copy benchmark on the lent H200 (2026-12-04): "
        "4.22-4.24 TB/s of 4.8 -> 0.88 (docs/validation/h200/*/kernels/results.json, "
        "copy_gbps). Applied to every GPU",
        "per_step_overhead_s": "0: no fixed time added to a step beyond the serving stack's "
        "CPU time per step (cost.stack, printed with the constants; cost.stack=none leaves the "
        "roofline lower bound); a calibrated model replaces it",
        "allreduce_latency_s": "0: not measured; bandwidth term only (lower bound)",
        "peer_link_efficiency": "1: the datasheet peer link's bandwidth (upper bound)",
        "pcie_bandwidth": "None: the GPU's datasheet host link per direction (PCIe Gen4 x16 "
        "32 GB/s on A100, Gen5 x16 64 GB/s on H100/H200)",
    }


@dataclass(frozen=True)
class Efficiency:
    """Fractions of datasheet peaks a step achieves, and fixed costs.

    - ``compute``: fraction of ``GPUSpec.peak_flops`` matmuls reach, in (0, 1];
    - ``memory``: fraction of ``GPUSpec.mem_bandwidth`` streaming kernels reach, in (0, 1];
    - ``per_step_overhead_s``: seconds added to every non-empty step;
    - ``allreduce_latency_s``: seconds added to every all-reduce call (tp > 1);
    - ``peer_link_efficiency``: fraction of ``GPUSpec.peer_link_bandwidth`` all-reduces
      reach, in (0, 1];
    - ``pcie_bandwidth``: host-link bytes/s for swaps; ``None`` uses the GPU's.
    ``source`` holds one text per field saying where its value comes from.
    """

    compute: float = 0.72
    memory: float = 0.88
    per_step_overhead_s: float = 0.0
    allreduce_latency_s: float = 0.0
    peer_link_efficiency: float = 1.0
    pcie_bandwidth: float | None = None
    source: dict[str, str] = field(default_factory=_default_sources)

    def __post_init__(self) -> None:
        for name in ("compute", "memory", "peer_link_efficiency"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"efficiency {name} must be in (0, 1], got {value}")
        for name in ("per_step_overhead_s", "allreduce_latency_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.pcie_bandwidth is not None and self.pcie_bandwidth <= 0:
            raise ValueError(f"pcie_bandwidth must be positive, got {self.pcie_bandwidth}")
        missing = [f for f in _FIELDS if f not in self.source]
        if missing:
            raise ValueError(f"efficiency source lacks an entry for {', '.join(missing)}")

    def with_values(self, sources: dict[str, str], **values: float | None) -> Efficiency:
        """A copy with ``values`` changed; each changed field needs its new source text."""
        unknown = set(values) - set(_FIELDS)
        if unknown:
            raise ValueError(f"unknown efficiency fields {sorted(unknown)}; valid: {_FIELDS}")
        undocumented = set(values) - set(sources)
        if undocumented:
            raise ValueError(f"give a source for {sorted(undocumented)}")
        return replace(self, **values, source={**self.source, **sources})  # type: ignore[arg-type]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Efficiency:
        """Defaults overridden by ``config``'s fields; ``config["source"]`` must give a
        source text for each overridden field."""
        values = {k: v for k, v in config.items() if k != "source"}
        return cls().with_values(dict(config.get("source", {})), **values)

    def describe(self) -> str:
        """A printable table: field, value, source."""
        rows = [f"{'factor':<20} {'value':>10}  source"]
        for f in fields(self):
            if f.name == "source":
                continue
            value = getattr(self, f.name)
            shown = "None" if value is None else f"{value:.4g}"
            rows.append(f"{f.name:<20} {shown:>10}  {self.source.get(f.name, '?')}")
        return "\n".join(rows)
