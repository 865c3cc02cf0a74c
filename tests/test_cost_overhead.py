"""Framework overhead and stack presets: the fit reproduces its measured table, the stack
terms behave as stated, bad names fail clearly."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from core.plan import BatchShape
from experiments.lib.setup import make_cost_model
from sim.catalog import get_gpu, get_model
from sim.cost import RooflineCostModel, build_cost_model
from sim.cost.overhead import (
    A100_CPU_OVERHEAD,
    A100_CPU_OVERHEAD_RAY,
    CPU_OVERHEADS_CSV,
    FIG18A_GATHER_TOKENS_PER_BLOCK,
    STACKS,
    contiguous_kernel,
    contiguous_note,
    device_copy_seconds,
    extra_kv_tokens,
    fit_cpu_overheads,
    get_stack,
    read_cpu_overheads,
)

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
needs_table = pytest.mark.skipif(
    not (SHARED / CPU_OVERHEADS_CSV).exists(), reason="../shared measurements not present"
)


@needs_table
@pytest.mark.parametrize("group,ray", [(1, False), (2, False), (2, True)])
def test_stored_cpu_fit_is_the_fit_of_the_table(group: int, ray: bool) -> None:
    a, b, train, held, held_max = fit_cpu_overheads(SHARED / CPU_OVERHEADS_CSV, group, ray)
    stored = A100_CPU_OVERHEAD_RAY if ray else A100_CPU_OVERHEAD[group]
    assert stored.per_step_s == pytest.approx(a, rel=1e-3)
    assert stored.per_seq_s == pytest.approx(b, rel=1e-3)
    assert stored.train_mape == pytest.approx(train, abs=1e-3)
    assert stored.heldout_mape == pytest.approx(held, abs=1e-3)
    assert stored.heldout_max_err == pytest.approx(held_max, abs=1e-3)


@needs_table
def test_cpu_fit_reproduces_its_table_at_the_tables_points() -> None:
    """Stated error: within 6% at every tp-1 row (train and held out), 12% at tp >= 2
    (Qwen-72B excluded, see sim.cost.overhead)."""
    for row in read_cpu_overheads(SHARED / CPU_OVERHEADS_CSV):
        if "Qwen" in str(row["model"]):
            continue
        tp = int(row["tp"])
        fit = A100_CPU_OVERHEAD[1 if tp == 1 else 2]
        err = abs(fit.seconds(float(row["seqs"])) - float(row["total_s"])) / float(row["total_s"])
        assert err < (0.06 if tp == 1 else 0.12), row
        if tp > 1:  # with the driver's Ray calls: within 6% (sim.cost.overhead)
            total = float(row["total_s"]) + float(row["ray_s"])
            err = abs(A100_CPU_OVERHEAD_RAY.seconds(float(row["seqs"])) - total) / total
            assert err < 0.06, row


@needs_table
def test_the_left_out_qwen_rows_lie_where_the_docstring_says() -> None:
    """sim.cost.overhead: Qwen-72B's four phases lie 20-28% above the tp >= 2 line at batch
    8-96 (rows 65-75) and 18-25% below it at 112-128 (rows 76-77)."""
    fit = A100_CPU_OVERHEAD[2]
    rows = [r for r in read_cpu_overheads(SHARED / CPU_OVERHEADS_CSV) if "Qwen" in str(r["model"])]
    assert [int(r["row"]) for r in rows] == list(range(65, 78))
    for r in rows:
        above = float(r["total_s"]) / fit.seconds(float(r["seqs"])) - 1
        if r["seqs"] <= 96:
            assert 0.20 <= above <= 0.28 and r["row"] <= 75, r
        else:
            assert -0.255 <= above <= -0.18 and r["row"] >= 76, r


def test_only_the_2023_stack_adds_the_ray_term_and_only_at_tp_above_one() -> None:
    assert get_stack("vllm-2023", 1).cpu is A100_CPU_OVERHEAD[1]
    assert get_stack("vllm-2023", 4).cpu is A100_CPU_OVERHEAD_RAY
    assert get_stack("vllm-v1", 4).cpu is A100_CPU_OVERHEAD[2]
    shape = _decode(32, 512)
    with_ray = RooflineCostModel("opt-66b", "a100-40gb", tp=4, stack="vllm-2023")
    without = RooflineCostModel("opt-66b", "a100-40gb", tp=4,
                                stack=dataclasses.replace(get_stack("vllm-2023", 4),
                                                          cpu=A100_CPU_OVERHEAD[2]))  # fmt: skip
    extra = A100_CPU_OVERHEAD_RAY.seconds(32) - A100_CPU_OVERHEAD[2].seconds(32)
    assert 5e-3 < extra < 8e-3
    assert with_ray.step_time(shape) - without.step_time(shape) == pytest.approx(extra)


def test_unknown_stack_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown cost\.stack 'vllm-2099'; known stacks: none, "):
        get_stack("vllm-2099")
    with pytest.raises(ValueError, match="vllm-2023"):
        build_cost_model("roofline", "opt-13b", "a100-40gb", stack="nope")


def _decode(seqs: int, ctx: int) -> BatchShape:
    return BatchShape(decode_seqs=seqs, decode_ctx_tokens=seqs * ctx)


def test_serial_stack_adds_cpu_and_overlapped_stack_hides_it() -> None:
    plain = RooflineCostModel("opt-13b", "a100-40gb")
    serial = RooflineCostModel("opt-13b", "a100-40gb", stack="vllm-2023")
    overlap = RooflineCostModel("opt-13b", "a100-40gb", stack="vllm-v1")
    cpu = STACKS["vllm-2023"].cpu
    assert cpu is not None
    shape = _decode(32, 16)  # whole blocks: no tail, so only the per-block gather differs
    gpu = serial.step_time(shape) - cpu.seconds(32)
    assert gpu > plain.step_time(shape)
    assert overlap.step_time(shape) == pytest.approx(gpu, rel=1e-12)  # GPU longer than CPU
    assert serial.step_time(BatchShape()) == overlap.step_time(BatchShape()) == 0.0
    tiny = RooflineCostModel("tiny-opt", "h200", stack="vllm-v1")
    assert tiny.step_time(_decode(2, 8)) == pytest.approx(cpu.seconds(2))  # CPU-bound


def test_per_block_gather_cost_falls_with_block_size_and_tail_waste_grows() -> None:
    s = STACKS["vllm-2023"]
    seqs, ctx = 8, 8 * 512
    gather = {b: dataclasses.replace(s, block_granular=False) for b in (1, 16, 256)}
    costs = [extra_kv_tokens(gather[b], seqs, ctx, b) for b in (1, 16, 256)]
    assert costs == sorted(costs, reverse=True)
    # at block 16 with whole blocks, the extra is the Fig. 18a fraction of the K/V read
    assert extra_kv_tokens(gather[16], seqs, ctx, 16) == pytest.approx(
        FIG18A_GATHER_TOKENS_PER_BLOCK * (ctx + seqs * 7.5) / 16
    )
    waste_only = dataclasses.replace(s, gather_tokens_per_block=0.0)
    tails = [extra_kv_tokens(waste_only, seqs, ctx, b) for b in (1, 16, 256)]
    assert tails == [0.0, seqs * 7.5, seqs * 127.5]
    assert extra_kv_tokens(s, 0, 0, 16) == 0.0


def test_swap_costs_a_latency_per_copy_plus_bytes() -> None:
    m = RooflineCostModel("opt-13b", "a100-40gb", stack="vllm-2023", block_size=16)
    plain = RooflineCostModel("opt-13b", "a100-40gb", block_size=16)
    s = m.stack
    one, ten = BatchShape(swap_out_blocks=1), BatchShape(swap_in_blocks=4, swap_out_blocks=6)
    per_block_latency = 40 * s.copies_per_block_per_layer * s.copy_latency_s
    assert m.transfer_time(one) == pytest.approx(plain.transfer_time(one) + per_block_latency)
    assert m.transfer_time(ten) == pytest.approx(10 * m.transfer_time(one))
    # at a fixed number of bytes, small blocks pay more latency
    small = RooflineCostModel("opt-13b", "a100-40gb", stack="vllm-2023", block_size=1)
    assert small.transfer_time(BatchShape(swap_out_blocks=16)) > m.transfer_time(one)
    assert m.transfer_time(BatchShape()) == plain.transfer_time(BatchShape()) == 0.0


def test_device_copies_cost_a_call_latency_plus_bytes_read_and_written() -> None:
    """Stated: a step with CoW copies pays ``d2d_calls_per_step`` call latencies (vLLM v0:
    one kernel) plus 2 x block bytes per copied block at HBM bandwidth x 'memory'; nothing
    without copies; monotone in copies and in block bytes."""
    m = RooflineCostModel("opt-13b", "a100-40gb", stack="vllm-2023", block_size=16)
    plain = RooflineCostModel("opt-13b", "a100-40gb", block_size=16)
    s = m.stack
    assert s.d2d_calls_per_step == 1 and s.d2d_call_latency_s == pytest.approx(6e-6)
    rate = m.gpu.mem_bandwidth * m.efficiency.memory
    for n in (1, 3, 50):
        shape = BatchShape(copy_blocks=n)
        assert plain.transfer_time(shape) == pytest.approx(n * 2 * m.block_bytes / rate)
        assert m.transfer_time(shape) == pytest.approx(
            plain.transfer_time(shape) + s.d2d_call_latency_s
        )
    assert device_copy_seconds(s, 0, m.block_bytes, rate) == 0.0
    by_copies = [m.transfer_time(BatchShape(copy_blocks=n)) for n in range(0, 40, 3)]
    assert by_copies == sorted(by_copies) and len(set(by_copies)) == len(by_copies)
    by_block = [
        RooflineCostModel("opt-13b", "a100-40gb", stack="vllm-2023", block_size=b).transfer_time(
            BatchShape(copy_blocks=4)
        )
        for b in (1, 8, 16, 64)
    ]
    assert by_block == sorted(by_block) and by_block[0] < by_block[-1]
    # the step pays it: a decode step with copies costs exactly the copy term more
    shape, copied = _decode(8, 64), BatchShape(decode_seqs=8, decode_ctx_tokens=512, copy_blocks=2)
    assert m.step_time(copied) - m.step_time(shape) == pytest.approx(
        m.transfer_time(BatchShape(copy_blocks=2)), rel=1e-9
    )
    assert "d2d_call_latency_s" in m.describe()


def test_stacked_step_time_is_monotone_in_tokens_and_context() -> None:
    for stack in ("vllm-2023", "vllm-v1"):
        m = RooflineCostModel("opt-13b", "a100-40gb", stack=stack)
        for n in (1, 8, 64, 256):
            times = [m.step_time(_decode(n, c)) for c in (16, 256, 1024, 2048)]
            assert times == sorted(times) and times[0] < times[-1]
        by_batch = [m.step_time(_decode(n, 512)) for n in (1, 4, 32, 128, 256)]
        assert by_batch == sorted(by_batch) and by_batch[0] < by_batch[-1]
        assert "source" in m.describe() and stack in m.describe()


def test_a_contiguous_kernel_drops_only_the_per_block_terms() -> None:
    s = get_stack("vllm-2023")
    k = contiguous_kernel(s)
    assert (k.gather_tokens_per_block, k.block_granular) == (0.0, False)
    kept = ("name", "cpu", "overlapped", "copy_latency_s", "copies_per_block_per_layer",
            "d2d_call_latency_s", "d2d_calls_per_step", "ray_workers")  # fmt: skip
    assert all(getattr(k, f) == getattr(s, f) for f in kept)
    assert "contiguous" in k.sources["gather_tokens_per_block"]
    assert "Fig. 18a" in k.sources["gather_tokens_per_block"]
    assert extra_kv_tokens(k, 8, 8 * 512, 16) == 0.0
    assert contiguous_kernel(STACKS["none"]) is STACKS["none"]


DECODE = BatchShape(decode_seqs=8, decode_ctx_tokens=8 * 300)


def _step_s(system: str, block_size: int, kind: str = "profiled", **cost: object) -> float:
    config = {
        "system": {"name": system, "block_size": block_size},
        "cost": {"kind": kind, "stack": "vllm-2023", **cost},
    }
    if kind == "profiled":
        config["cost"]["profile"] = "sim/cost/profiles/vidur-a100-llama-2-7b"
    model = make_cost_model(config, get_model("opt-13b"), get_gpu("a100-40gb"))
    return model.step_time(DECODE)


@pytest.mark.parametrize("kind", ["profiled", "roofline"])
def test_a_contiguous_system_is_priced_without_the_paged_kernels_block_terms(kind: str) -> None:
    """Orca and FasterTransformer hold each sequence's K/V in one region: their decode step
    does not change with system.block_size, and is cheaper than vLLM's paged one."""
    for system in ("orca_pow2", "orca_max", "fastertransformer"):
        assert _step_s(system, 8, kind) == _step_s(system, 64, kind)
    assert _step_s("vllm", 8, kind) != _step_s("vllm", 64, kind)
    assert _step_s("orca_pow2", 16, kind) < _step_s("vllm", 16, kind)
    assert _step_s("orca_pow2", 16, kind, stack="none") == _step_s("vllm", 16, kind, stack="none")


def test_the_measured_stack_keeps_the_block_terms_for_a_contiguous_system() -> None:
    """kvlab's engine reads a contiguous region through a block table, as it reads pages."""
    measured = {"stack": "measured", "stack_path": "sim/cost/stacks/kvlab-cpu-tiny-opt.json"}
    assert _step_s("orca_pow2", 8, **measured) == _step_s("vllm", 8, **measured)
    assert _step_s("orca_pow2", 8, **measured) != _step_s("orca_pow2", 64, **measured)


def test_the_contiguous_note_says_what_a_contiguous_system_is_priced_without() -> None:
    note = contiguous_note(get_stack("vllm-2023"))
    assert "gather_tokens_per_block 0 and block_granular False" in note and "Fig. 18a" in note
    assert contiguous_note(STACKS["none"]) == "" and contiguous_note(None) == ""
