"""Cost models: roofline (datasheet + efficiency factors), profiled (a measured per-operator
profile), calibrated (fitted to engine steps), recorded (replays measured step times);
``sim.cost.drifting`` scales another model's steps by a machine's measured speed drift.
Roofline and profiled take a serving-stack preset (``stack=``, :mod:`sim.cost.overhead`)."""

from __future__ import annotations

from typing import Any

from sim.catalog import GPUSpec, ModelSpec
from sim.cost.base import CostModel
from sim.cost.calibrated import CalibratedCostModel
from sim.cost.efficiency import Efficiency
from sim.cost.overhead import STACKS
from sim.cost.profiled import ProfiledCostModel
from sim.cost.recorded import RecordedCostModel
from sim.cost.roofline import RooflineCostModel

__all__ = [
    "STACKS",
    "CalibratedCostModel",
    "CostModel",
    "Efficiency",
    "ProfiledCostModel",
    "RecordedCostModel",
    "RooflineCostModel",
    "build_cost_model",
]

KINDS = ("roofline", "profiled", "calibrated", "recorded")


def build_cost_model(
    kind: str, model: ModelSpec | str, gpu: GPUSpec | str, tp: int = 1, **kw: Any
) -> CostModel:
    """Build a cost model by kind.

    - ``"roofline"``: ``kw`` goes to :class:`RooflineCostModel` (``dtype_bytes``,
      ``efficiency`` — an :class:`Efficiency` or a dict for ``Efficiency.from_config`` —,
      ``block_size``, ``stack`` — a preset name of :data:`STACKS` or None);
    - ``"profiled"``: ``profile=`` a profile path (kvlab's or Vidur's format) or an
      :class:`~sim.cost.profile.OperatorProfile`; optional ``stack``, ``block_size``,
      ``dtype_bytes``, ``efficiency_overrides`` (the all-reduce's two factors);
    - ``"calibrated"``: ``steps=`` a steps DataFrame to fit, or ``coefficients=`` (and
      optionally ``fit_stats=``) from a previous fit; other ``kw`` as for the constructor;
    - ``"recorded"``: ``step_times=`` the measured step seconds in order.
    """
    if kind == "roofline":
        eff = kw.pop("efficiency", None)
        if isinstance(eff, dict):
            eff = Efficiency.from_config(eff)
        return RooflineCostModel(model, gpu, tp, efficiency=eff, **kw)
    if kind == "profiled":
        if kw.get("profile") is None:
            raise ValueError("profiled cost model needs profile= (a profile file or directory)")
        if "efficiency" in kw:
            raise ValueError("efficiency overrides apply to cost=roofline, not cost=profiled")
        return ProfiledCostModel(kw.pop("profile"), model, gpu, tp, **kw)
    if kind == "calibrated":
        if "steps" in kw:
            return CalibratedCostModel.fit(kw.pop("steps"), model, gpu, tp, **kw)
        if "coefficients" in kw:
            return CalibratedCostModel(model, gpu, kw.pop("coefficients"), tp, **kw)
        raise ValueError("calibrated cost model needs steps= (to fit) or coefficients=")
    if kind == "recorded":
        if "step_times" not in kw:
            raise ValueError("recorded cost model needs step_times=")
        return RecordedCostModel(kw["step_times"])
    raise ValueError(f"unknown cost model kind {kind!r}; valid kinds: {', '.join(KINDS)}")
