"""Names of the engine's per-step phase columns in ``steps.csv`` (the engine times them,
:mod:`engine.phases`; the simulator's overhead fit reads them, :mod:`sim.cost.stack_file`).

Seconds per step: ``schedule_s`` (the scheduler's ``schedule`` calls), ``transfer_s``
(swaps and device block copies), ``prepare_s`` (input tensors and block tables),
``forward_s`` (the model), ``sample_s`` (the sampler), ``output_s`` (the scheduler's
update: appending tokens, stop checks; and recording the step); and ``forward_issue_s``,
not a phase of its own but the part of ``forward_s`` until the model's forward call
returned, before the device was synchronized. Where every operation is synchronous (CPU)
it equals ``forward_s``. On CUDA, where the host queues kernels, ``forward_s −
forward_issue_s`` is the time the host then waited for the device. The two are close when
the host's launches bound the forward, but also when the host waited for the device inside
the forward call (a synchronizing operation, a full launch queue): on the H200 they were
within 1% for every step, a GPU-bound prefill too (``docs/validation/h200.md``), and
``experiments.bench.sync_check`` tells which.
"""

from __future__ import annotations

PHASE_COLUMNS = (
    "schedule_s", "transfer_s", "prepare_s", "forward_s", "sample_s", "output_s",
    "forward_issue_s",
)  # fmt: skip
# The framework's CPU phases: the four a synchronous (vLLM v0-style) stack runs while the
# device waits; forward and transfers, the device's work, excluded.
CPU_PHASES = ("schedule_s", "prepare_s", "sample_s", "output_s")
