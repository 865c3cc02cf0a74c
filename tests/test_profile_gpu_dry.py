"""The operator profile script in its ``--dry`` mode (CPU, tiny models, Triton interpreter)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from experiments.bench.profile_gpu import COLUMNS, FORMAT, OPS, Profiler, main, make_plan, measure

SIDECAR_KEYS = {"format", "model", "gpu", "dtype", "tp", "block_size", "date", "command",
                "torch", "triton"}  # fmt: skip


@pytest.mark.slow
def test_dry_run_writes_the_profile_format(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path), "--dry"]) == 0
    with (tmp_path / "operator_profile.csv").open() as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == COLUMNS
        rows = list(reader)
    meta = json.loads((tmp_path / "operator_profile.json").read_text())
    assert set(meta) >= SIDECAR_KEYS
    assert meta["format"] == FORMAT and meta["tp"] == 1 and meta["block_size"] == 16
    assert meta["model"] == "tiny-opt" and meta["dtype"] == "float32" and meta["dry"] is True
    assert meta["complete"] is True
    assert [r["op"] for r in rows] == sorted((r["op"] for r in rows), key=OPS.index)
    assert {r["op"] for r in rows} == set(OPS)
    plan = make_plan(dry=True)
    for op in OPS:
        points = [(int(r["num_tokens"]), int(r["context_tokens"])) for r in rows if r["op"] == op]
        assert points == sorted(points), op
        if op == "attn_decode":
            assert len(points) == len({(n, c) for n in plan.token_counts
                                        for c in plan.seq_contexts if n * c <= 64})  # fmt: skip
        else:
            assert [n for n, _ in points] == list(plan.token_counts), op
            assert all(c == (n if op == "attn_prefill" else 0) for n, c in points), op
    assert all(float(r["time_ms"]) > 0 for r in rows)


def test_llama_layer_profiles_and_other_launches_no_matmul_or_attention() -> None:
    plan = replace(make_plan(dry=True, model="tiny-llama"), token_counts=(1, 2), seq_contexts=(16,))
    prof = Profiler(plan)
    assert not any(isinstance(m, nn.Linear) for m in prof.stub.modules())
    assert all(isinstance(m, nn.Linear) for m in prof.linears) and len(prof.linears) == 7
    assert prof.layer.self_attn.backend.name == "triton"  # the stub is a copy
    rows = measure(plan, log=lambda _: None)
    assert {r["op"] for r in rows} == set(OPS)


def test_profiled_attention_is_a_valid_paged_batch() -> None:
    """The metadata the profiler builds gives the reference result through the Triton path."""
    from engine.attention.torch_ref import TorchRefBackend

    prof = Profiler(replace(make_plan(dry=True), token_counts=(4,), max_context_tokens=128))
    cfg = prof.config
    meta = prof._meta([1, 3, 1], [40, 20, 17])
    q = torch.randn(5, cfg.num_heads, cfg.head_dim)
    k, v = torch.randn(5, cfg.num_kv_heads, cfg.head_dim), torch.randn(5, cfg.num_kv_heads, 16)
    caches = (prof.k_cache.clone(), prof.v_cache.clone())
    got = prof.backend.forward(q, k, v, *caches, meta, 0.25)
    ref = TorchRefBackend().forward(q, k, v, prof.k_cache, prof.v_cache, meta, 0.25)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    assert torch.equal(caches[0], prof.k_cache)  # both stored the new K at the same slots
    with pytest.raises(ValueError, match="blocks"):  # 9 blocks asked of a cache of 8
        prof._meta([1, 1, 1], [48, 48, 48])


def test_importing_the_script_leaves_triton_unimported() -> None:
    """``--dry`` sets TRITON_INTERPRET in ``main``; triton 3.6 reads it at import, so no
    module the script imports at its top may import triton."""
    code = "import sys, experiments.bench.profile_gpu; print('triton' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_bad_arguments_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, needle in (
        (["--block-size", "12"], "power of two"),
        (["--model", "gpt-9"], "gpt-9"),
        (["--single-calls"], "--single-calls needs --cpu"),
    ):
        with pytest.raises(SystemExit):
            main(["--out", "unused", "--dry", *argv])
        assert needle in capsys.readouterr().err


def test_cpu_mode_times_the_cpu_engine_settings(tmp_path: Path) -> None:
    """--cpu measures what kvlab's CPU engine runs (torch attention, thread CPU time, dense
    small row counts); a shrunk plan of it measures every op with positive times."""
    from experiments.bench.profile_gpu import CPU_TOKENS, decode_points, sidecar

    plan = make_plan(dry=False, cpu=True)
    assert plan.device.type == "cpu" and not plan.dry and plan.backend == "torch"
    assert plan.thread_clock and plan.model == "opt-125m" and plan.dtype == torch.float32
    assert plan.token_counts == CPU_TOKENS and set(range(1, 65)) <= set(CPU_TOKENS)
    assert {n for n, _ in decode_points(plan)} == set(plan.decode_batches)
    small = replace(make_plan(dry=False, model="tiny-opt", cpu=True), token_counts=(1, 3),
                    seq_contexts=(16,), decode_batches=(2,), repeats=1)  # fmt: skip
    prof = Profiler(small)
    assert prof.backend.name == "torch" and prof.layer.self_attn.backend.name == "torch"
    rows = measure(small, log=lambda _: None)
    assert {r["op"] for r in rows} == set(OPS)
    assert [(r["num_tokens"], r["context_tokens"]) for r in rows if r["op"] == "attn_decode"] == [
        (2, 32)
    ]
    assert all(r["time_ms"] > 0 for r in rows)
    meta = sidecar(small, ["--cpu"])
    assert meta["gpu"] == "cpu" and meta["dry"] is False and "thread's CPU time" in meta["method"]
    assert meta["attention"] == "torch"


def test_passes_sweep_every_point_and_keep_each_points_median() -> None:
    """--passes K: K sweeps, one yield per point and sweep, one row per point whose time is
    the median of its sweeps, each sweep's time kept in ``sweeps_ms``."""
    from experiments.bench import profile_gpu

    small = replace(make_plan(dry=False, model="tiny-opt", cpu=True, passes=3),
                    token_counts=(1, 2), seq_contexts=(16,), decode_batches=(2,), repeats=1,
                    flush_bytes=1 << 16, in_model_tokens=0)  # fmt: skip
    seen: list[float] = []
    fake = iter(float(x) for x in range(1, 1000))

    def fake_time(self: Profiler, fn: object) -> float:
        seen.append(next(fake))
        return seen[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Profiler, "time", fake_time)
        steps = profile_gpu.measuring(small, log=lambda _: None)
        yields = 0
        try:
            while True:
                next(steps)
                yields += 1
        except StopIteration as done:
            rows = done.value
    per_sweep = profile_gpu.num_points(small) // 3
    assert yields == profile_gpu.num_points(small) == len(seen) == 3 * per_sweep
    assert len(rows) == per_sweep == 4 * 2 + 1
    # sweep k measures point i as the (k * per_sweep + i + 1)-th call: the median is sweep 2's
    order = [(op, t) for t in (1, 2) for op in ("linear", "other", "attn_prefill", "lm_head")]
    order.append(("attn_decode", 2))
    for i, key in enumerate(order):
        row = next(r for r in rows if (r["op"], r["num_tokens"]) == key)
        assert row["time_ms"] == per_sweep + i + 1
        # every sweep's time is kept, in sweep order
        sweeps = [float(x) for x in row["sweeps_ms"].split(";")]
        assert sweeps == [k * per_sweep + i + 1 for k in range(3)]


def test_a_seeded_plan_visits_every_point_once_per_sweep_in_its_own_order() -> None:
    """With ``order_seed`` each sweep is a permutation of the sorted sweep, drawn from
    (seed, sweep): sweeps differ, the same seed repeats them, and each measured time lands
    on the point measured (a drift within a sweep then falls on neighbours independently)."""
    from experiments.bench import profile_gpu

    sorted_plan = replace(make_plan(dry=False, model="tiny-opt", cpu=True, passes=4),
                          token_counts=(1, 2, 3, 4, 5), seq_contexts=(16,),
                          decode_batches=(1, 2), repeats=1, flush_bytes=1 << 16,
                          in_model_tokens=0)  # fmt: skip
    assert sorted_plan.order_seed is None
    plan = replace(sorted_plan, order_seed=7)
    orders = [profile_gpu.sweep_points(plan, k) for k in range(4)]
    base = profile_gpu.sweep_points(sorted_plan, 0)
    assert all(sorted(o) == sorted(base) and len(o) == len(base) for o in orders)
    assert len({tuple(o) for o in orders}) == 4 and tuple(base) not in {tuple(o) for o in orders}
    assert orders == [profile_gpu.sweep_points(replace(plan), k) for k in range(4)]
    assert profile_gpu.sweep_points(replace(plan, order_seed=8), 0) != orders[0]
    calls = iter(float(x) for x in range(1, 1000))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Profiler, "time", lambda self, fn: next(calls))
        rows = profile_gpu.measure(plan, log=lambda _: None)
    n = len(base)
    for row in rows:
        key = ("attn_decode" if row["op"] == "attn_decode" else row["op"], row["num_tokens"],
               row["context_tokens"] if row["op"] == "attn_decode" else 0)  # fmt: skip
        sweeps = [float(x) for x in row["sweeps_ms"].split(";")]
        assert sweeps == [k * n + orders[k].index(key) + 1 for k in range(4)], key
        units = [int(x) for x in row["sweep_units"].split(";")]
        assert units == [orders[k].index(key) for k in range(4)], key


def test_single_calls_time_each_point_once_per_sweep_and_keep_the_mean() -> None:
    """--single-calls: one unrecorded call of every point first (a first call is cold), then
    one call per point and sweep with no warm-up, in the model's forward too, and a point's
    time is the mean of its sweeps; the sidecar says so."""
    from experiments.bench import in_model, profile_gpu
    from experiments.bench.profile_gpu import sidecar

    plan = make_plan(dry=False, model="tiny-opt", cpu=True, passes=3, single_calls=True)
    assert (plan.repeats, plan.warmup, plan.across_sweeps) == (1, 0, "mean")
    assert plan.order_seed == 0 and make_plan(dry=False, cpu=True).order_seed is None
    method = sidecar(plan, ["--cpu", "--single-calls"])["method"]
    assert (
        "one call per point and sweep, no warm-up but one unrecorded call of every point "
        "before the first sweep"
        in method
        and "mean of 3 sweeps" in method
    )
    assert plan.warm_up_sweep and not make_plan(dry=False, cpu=True).warm_up_sweep
    assert "random order" in method
    small = replace(plan, token_counts=(1, 2), seq_contexts=(16,), decode_batches=(2,),
                    flush_bytes=1 << 16, in_model_tokens=1)  # fmt: skip
    fake = iter(float(x) ** 2 for x in range(1, 1000))  # squares: mean and median differ
    forwards: list[tuple[int, int]] = []

    def fake_forward(self: object, meta: object, positions: object, repeats: int, warmup: int):
        forwards.append((repeats, warmup))
        return dict.fromkeys(("linear", "other", "attn", "lm_head"), next(fake))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Profiler, "time", lambda self, fn: next(fake))
        mp.setattr(in_model.InModelTimer, "time", fake_forward)
        rows = profile_gpu.measure(small, log=lambda _: None)
    # per sweep and the warm-up: the 1-token point in the forward, the decode point alone
    assert forwards == [(1, 0)] * 4
    # the warm-up's six calls (the forward, 2 tokens' four ops, the decode) are not recorded
    recorded = [float(x) for r in rows for x in r["sweeps_ms"].split(";")]
    assert min(recorded) == 7.0**2
    assert len(rows) == 4 + 4 + 1
    units = {(r["op"], r["num_tokens"]): r["sweep_units"] for r in rows}
    assert len({units[op, 1] for op in ("linear", "other", "attn_prefill", "lm_head")}) == 1
    for row in rows:
        sweeps = [float(x) for x in row["sweeps_ms"].split(";")]
        assert len(sweeps) == 3 and len(set(sweeps)) == 3
        assert row["time_ms"] == pytest.approx(sum(sweeps) / 3)
        assert row["time_ms"] != pytest.approx(sorted(sweeps)[1])
    with pytest.raises(ValueError, match="--cpu"):
        make_plan(dry=True, single_calls=True)


def test_cpu_flush_is_twice_the_largest_cache(tmp_path: Path) -> None:
    from experiments.bench.profile_gpu import cpu_flush_bytes

    for index, size in (("index0", "48K"), ("index2", "1024K"), ("index3", "16384K")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "size").write_text(size + "\n")
    assert cpu_flush_bytes(tmp_path) == 32 << 20
    assert cpu_flush_bytes(tmp_path / "absent") == 64 << 20
    assert make_plan(dry=False, cpu=True).flush_bytes > 0


def test_cache_state_benchmark_writes_its_table(tmp_path: Path) -> None:
    from experiments.bench import cpu_cache_state

    with pytest.MonkeyPatch.context() as mp:  # a tiny model and few shapes: seconds
        mp.setattr(cpu_cache_state, "ATTENTION", (("decode attention 2 x 16", 2, 16),))
        mp.setattr(cpu_cache_state, "LINEAR", (("linear layers, 1 row", 1),))
        assert cpu_cache_state.main(["--out", str(tmp_path), "--repeats", "2",
                                     "--model", "tiny-opt"]) == 0  # fmt: skip
    doc = json.loads((tmp_path / "cpu_cache_state.json").read_text())
    names = [r["operator"] for r in doc["rows"]]
    assert names == ["decode attention 2 x 16", "linear layers, 1 row"]
    for row in doc["rows"]:
        assert all(row[f"{s}_ms"] > 0 for s in cpu_cache_state.STATES)


def test_in_model_timer_sums_each_op_over_the_layers_and_divides_by_them() -> None:
    """With a clock that advances 1 ms per reading, every linear layer and every attention
    call of every layer is counted once and divided by the layer count; ``other`` is the
    forward's remaining readings, ``lm_head`` the logits after it."""
    from experiments.bench import in_model
    from sim.catalog import get_model

    plan = make_plan(dry=False, model="tiny-opt", cpu=True)
    prof = Profiler(replace(plan, repeats=2, token_counts=(1, 4), seq_contexts=(16,)))
    whole = prof.whole
    assert whole is not None and whole.layers == get_model("tiny-opt").num_layers > 1
    linears_per_layer = sum(
        isinstance(m, torch.nn.Linear) for m in whole.model.decoder().layers[0].modules()
    )
    ticks = iter(range(10**6))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(in_model.time, "thread_time", lambda: next(ticks) * 1e-3)
        with torch.inference_mode():
            ms = prof.in_model([1, 1], [16, 16])
    layers = whole.layers
    assert ms["linear"] == pytest.approx(linears_per_layer)
    assert ms["attn"] == pytest.approx(1.0)
    assert ms["lm_head"] == pytest.approx(1.0)
    # each reading between start and mid: two per linear and per attention, and mid itself
    readings = 2 * linears_per_layer * layers + 2 * layers + 1
    assert ms["other"] == pytest.approx((readings - (linears_per_layer + 1) * layers) / layers)


def test_cpu_plan_times_small_points_in_the_model_and_large_ones_alone() -> None:
    """Points of at most ``in_model_tokens`` tokens give all four token ops from one forward
    (one yield), larger ones are timed op by op (four); every op has a positive row."""
    from experiments.bench import profile_gpu

    small = replace(make_plan(dry=False, model="tiny-opt", cpu=True), token_counts=(1, 3),
                    seq_contexts=(16,), decode_batches=(1, 2), repeats=1, in_model_tokens=1,
                    flush_bytes=1 << 16)  # fmt: skip
    assert profile_gpu.num_points(small) == 1 + 4 + 2
    steps = profile_gpu.measuring(small, log=lambda _: None)
    yields = 0
    try:
        while True:
            next(steps)
            yields += 1
    except StopIteration as done:
        rows = done.value
    assert yields == profile_gpu.num_points(small)
    assert {(r["op"], r["num_tokens"]) for r in rows} == {
        *((op, t) for op in ("linear", "other", "attn_prefill", "lm_head") for t in (1, 3)),
        ("attn_decode", 1), ("attn_decode", 2),
    }  # fmt: skip
    assert all(r["time_ms"] > 0 for r in rows)
    assert "inside the whole model's forward" in profile_gpu.sidecar(small, [])["method"]


def test_filled_sweep_units_are_what_measuring_wrote(tmp_path: Path) -> None:
    """``fill_sweep_units`` rebuilds the column of a profile taken before it existed from
    the plan's order, sorted or seeded, exactly as ``measuring`` writes it."""
    import pandas as pd

    from experiments.bench import fill_sweep_units, profile_gpu

    for seed in (None, 3):
        plan = replace(make_plan(dry=False, model="tiny-opt", cpu=True, passes=3),
                       token_counts=(1, 2, 70), seq_contexts=(16,), decode_batches=(1, 2),
                       repeats=1, flush_bytes=1 << 16, in_model_tokens=2,
                       order_seed=seed)  # fmt: skip
        calls = iter(float(x) for x in range(1, 1000))
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Profiler, "time", lambda self, fn, calls=calls: next(calls))
            mp.setattr(Profiler, "in_model",
                       lambda self, q, c, calls=calls: dict.fromkeys(
                           ("linear", "other", "attn", "lm_head"), next(calls)))  # fmt: skip
            rows = profile_gpu.measure(plan, log=lambda _: None)
        out = tmp_path / f"seed-{seed}"
        profile_gpu.write_profile(out, rows, {})
        written = pd.read_csv(out / "operator_profile.csv")
        written.drop(columns="sweep_units").to_csv(out / "operator_profile.csv", index=False)
        assert fill_sweep_units.fill(out, plan) == len(rows)
        filled = pd.read_csv(out / "operator_profile.csv")
        assert filled["sweep_units"].tolist() == written["sweep_units"].tolist()
        assert filled["time_ms"].tolist() == written["time_ms"].tolist()
    with pytest.raises(ValueError, match="not a point of the plan"):
        fill_sweep_units.fill(out, replace(plan, token_counts=(1,)))
    for argv in ([str(out), "--order", "random"], [str(tmp_path / "absent"), "--order", "0"]):
        with pytest.raises(SystemExit):
            fill_sweep_units.main(argv)


def test_a_block_size_the_cache_cannot_hold_or_a_file_as_out_is_refused_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from experiments.bench import profile_gpu

    def no_measuring(*_: object, **__: object) -> None:
        raise AssertionError("measured before refusing")

    monkeypatch.setattr(profile_gpu, "measure", no_measuring)
    monkeypatch.setattr(profile_gpu, "pin_malloc", lambda: None)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    afile = tmp_path / "afile"
    afile.write_text("")
    for argv, needle in (
        (["--out", str(tmp_path / "p"), "--cpu", "--model", "tiny-opt", "--block-size", "1024"],
         "--block-size 1024 is too large for this profile: a decode batch of 64 sequences"),
        (["--out", str(tmp_path / "p"), "--dry", "--block-size", "32"], "(at most 16 here)"),
        (["--out", str(afile), "--dry"], f"--out: {afile} is a file, not a folder"),
        (["--out", str(afile / "sub" / "p"), "--dry"], f"lies under {afile}, a file"),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and needle in err, err
    assert not (tmp_path / "p").exists()
    for block_size in (16, 512):
        plan = make_plan(False, "tiny-opt", block_size, cpu=True)
        assert profile_gpu.blocks_short(plan) is None
