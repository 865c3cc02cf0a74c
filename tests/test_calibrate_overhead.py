"""The overhead model fitted to kvlab's own engine (experiments.calibrate_overhead) and the
``measured`` stack preset the simulator reads from its file."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from core.metrics.phases import CPU_PHASES, PHASE_COLUMNS
from core.plan import BatchShape
from experiments import calibrate_overhead
from experiments.bench.cpu_cross_run import serve_run
from experiments.lib.checks import ConfigError
from experiments.lib.setup import make_cost_model
from sim.catalog import get_gpu, get_model
from sim.cost import RooflineCostModel
from sim.cost.overhead import describe_stack, fit_line, get_stack, relative_errors
from sim.cost.stack_file import fit_measured_overhead, load_stack_file

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "sim/cost/stacks/kvlab-cpu-tiny-opt.json"


def _steps(seqs: list[int], a: float, b: float, seed: int = 0) -> pd.DataFrame:
    """Steps whose CPU phases sum to ``a + b x seqs`` times a +-10% deterministic wobble."""
    rng = np.random.default_rng(seed)
    total = (a + b * np.asarray(seqs, float)) * rng.uniform(0.9, 1.1, len(seqs))
    frame = pd.DataFrame({"prefill_seqs": 0, "decode_seqs": seqs})
    for i, col in enumerate(PHASE_COLUMNS):
        share = 0.25 if col in CPU_PHASES else 0.0
        frame[col] = total * share + (1.0 if col == "forward_s" else 0.0) * i
    return frame


def test_fit_recovers_a_known_line_and_reports_its_errors() -> None:
    seqs = [s for s in range(1, 33) for _ in range(9)]
    steps = _steps(seqs, 2e-4, 1.5e-5)
    doc = fit_measured_overhead([("run", steps.sample(frac=1.0, random_state=1))], "half", 3)
    cpu = doc["cpu"]
    assert cpu["per_step_s"] == pytest.approx(2e-4, rel=0.1)
    assert cpu["per_seq_s"] == pytest.approx(1.5e-5, rel=0.05)
    assert cpu["train_max_err"] < 0.2 and cpu["heldout_max_err"] < 0.2  # medians of +-10%
    train = doc["fit"]["points"]["train"]
    xs, ys = zip(*[p[:2] for p in train], strict=True)
    errs = relative_errors(cpu["per_step_s"], cpu["per_seq_s"], xs, ys)
    assert cpu["train_mape"] == pytest.approx(float(np.mean(errs)))
    assert all(p[2] >= 3 for p in train)  # only sequence counts with enough steps
    assert fit_line([1.0, 2.0, 3.0], [3.0, 5.0, 7.0]) == pytest.approx((1.0, 2.0))


def test_split_by_runs_holds_out_the_last_run_and_half_splits_by_step_index() -> None:
    a = _steps([1, 2, 3, 4] * 6, 1e-4, 1e-5)
    b = _steps([8, 9] * 6, 1e-4, 1e-5, seed=3)
    doc = fit_measured_overhead([("a", a), ("b", b)], "runs", 3)
    assert [p[0] for p in doc["fit"]["points"]["train"]] == [1, 2, 3, 4]
    assert [p[0] for p in doc["fit"]["points"]["heldout"]] == [8, 9]
    half = fit_measured_overhead([("a", _steps([1] * 6 + [2] * 6 + [5] * 6 + [6] * 6, 1, 1))])
    assert [p[0] for p in half["fit"]["points"]["train"]] == [1, 2]
    with pytest.raises(ValueError, match="two runs"):
        fit_measured_overhead([("a", a)], "runs", 3)
    with pytest.raises(ValueError, match="no column schedule_s"):
        fit_measured_overhead([("old", a.drop(columns=["schedule_s"]))])


def test_runs_whose_cpu_phases_took_no_time_are_refused_not_divided_by() -> None:
    zero = _steps([1, 2, 3, 4] * 6, 0.0, 0.0)
    with pytest.raises(ValueError, match="spent no CPU time in the four phases"):
        fit_measured_overhead([("a", zero)], "half", 3)


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    run = [
        "model=tiny-opt",
        "workload.num_requests=16",
        "workload.rate=40",
        "kv_cache_gb=0.002",
        "progress=false",
    ]
    yield serve_run(tmp_path_factory.mktemp("overhead"), run)


def test_fit_of_a_tiny_cpu_engine_run_feeds_the_measured_stack(
    engine_run: Path, tmp_path: Path, capsys
) -> None:
    """A real engine run's steps.csv goes through the whole path (read, fit, stack file,
    simulator). Its CPU phase seconds are replaced by a known line first: a measured
    per-sequence slope of tiny-opt is microseconds, and under load its sign is noise."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(engine_run, run)
    steps = pd.read_csv(run / "steps.csv")
    seqs = steps["prefill_seqs"] + steps["decode_seqs"]
    assert seqs.nunique() >= 2 and all(c in steps for c in CPU_PHASES)
    for col in CPU_PHASES:
        steps[col] = (1e-4 + 2e-5 * seqs) / len(CPU_PHASES)
    steps.to_csv(run / "steps.csv", index=False)
    out = tmp_path / "stack.json"
    argv = [str(run), "--out", str(out), "--min-steps", "3"]
    assert calibrate_overhead.main(argv) == 0
    assert "held out" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["kind"] == "stack" and doc["base"] == "vllm-2023" and doc["measured_on"]
    stack = load_stack_file(out)
    assert stack.name == "measured" and not stack.overlapped and stack.cpu is not None
    assert stack.cpu.per_step_s == pytest.approx(1e-4, rel=1e-6)
    assert stack.cpu.per_seq_s == pytest.approx(2e-5, rel=1e-6)
    # the simulator adds exactly the fitted CPU seconds to a step (serial stack)
    plain = RooflineCostModel("opt-13b", "a100-40gb", stack=stack)
    shape = BatchShape(decode_seqs=8, decode_ctx_tokens=8 * 64)
    base = RooflineCostModel("opt-13b", "a100-40gb", stack="vllm-2023")
    assert base.stack.cpu is not None
    assert plain.step_time(shape) - base.step_time(shape) == pytest.approx(
        stack.cpu.seconds(8) - base.stack.cpu.seconds(8), rel=1e-9, abs=1e-15
    )
    cfg = {"system": {"name": "vllm"}, "cost": {"kind": "roofline", "stack": "measured",
                                                "stack_path": str(out)}}  # fmt: skip
    model = make_cost_model(cfg, get_model("opt-13b"), get_gpu("a100-40gb"))
    assert "stack measured" in model.describe() and "split half" in model.describe()


def test_shipped_measured_fit_reproduces_its_points_within_the_stated_error() -> None:
    """The committed kvlab CPU stack (tiny-opt on the development VM, engine thread CPU
    time; see its ``fit`` and the README): re-fitting its train points gives its constants;
    stated error: within 5% of every train point (3% on average) and within 15% of every
    held-out point (8% on average)."""
    doc = json.loads(SHIPPED.read_text())
    cpu, points = doc["cpu"], doc["fit"]["points"]
    xs, ys = zip(*[(p[0], p[1]) for p in points["train"]], strict=True)
    a, b = fit_line(xs, ys)
    assert cpu["per_step_s"] == pytest.approx(a, rel=1e-9)
    assert cpu["per_seq_s"] == pytest.approx(b, rel=1e-9)
    errs = relative_errors(a, b, xs, ys)
    assert max(errs) < 0.05 and np.mean(errs) < 0.03
    assert cpu["train_mape"] == pytest.approx(float(np.mean(errs)))
    held = relative_errors(a, b, *zip(*[(p[0], p[1]) for p in points["heldout"]], strict=True))
    assert cpu["heldout_mape"] == pytest.approx(float(np.mean(held)))
    assert max(held) < 0.15 and np.mean(held) < 0.08
    assert load_stack_file(SHIPPED).cpu is not None


def test_measured_stack_needs_its_file_and_bad_files_get_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cost\.stack_path"):
        get_stack("measured")
    with pytest.raises(ValueError, match=r"known stacks: none, vllm-2023, vllm-v1, measured"):
        get_stack("vllm-2099")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "calibrated"}))
    with pytest.raises(ValueError, match=r"bad\.json: not a stack file"):
        load_stack_file(bad)
    bad.write_text(json.dumps({"kind": "stack", "cpu": {"per_step_s": 1}}))
    with pytest.raises(ValueError, match=r"bad\.json: cpu\.per_seq_s: missing"):
        load_stack_file(bad)
    good = json.loads(SHIPPED.read_text())
    for change, message in (
        ({"cpu": {**good["cpu"], "per_step_s": math.nan}}, r"cpu\.per_step_s must be a finite"),
        ({"cpu": {**good["cpu"], "per_seq_s": math.inf}}, r"cpu\.per_seq_s must be a finite"),
        (
            {"cpu": {**good["cpu"], "per_step_s": "abc"}},
            r"bad\.json: cpu\.per_step_s: not a number \(got 'abc'\)$",
        ),
        ({"cpu": 5}, r"bad\.json: cpu: not a mapping of the fit's numbers \(got 5\)$"),
        (
            {"cpu": {**good["cpu"], "heldout_mape": "0.07"}},
            r"cpu\.heldout_mape: not a number \(got '0\.07'\)$",
        ),
        ({"cpu": {**good["cpu"], "train_max_err": None}}, r"cpu\.train_max_err: not a number"),
        (
            {"cpu": {**good["cpu"], "heldout_mape": 0.07, "heldout_max_err": None}},
            r"cpu\.heldout_max_err: null while cpu\.heldout_mape is 0\.07 \(both or neither\)$",
        ),
        ({"fit": {**good["fit"], "phases": "schedule_s"}}, r"fit\.phases: not a list of names"),
        ({"fit": None}, r"fit: not a mapping"),
        ({"cpu": {**good["cpu"], "per_seq_s": -1e-6}}, r"cpu\.per_seq_s must be a finite"),
        ({"overlapped": "false"}, r"overlapped must be true or false \(got 'false'\)"),
        ({"base": "vllm-2099"}, r"unknown base 'vllm-2099'; known bases: none, vllm-2023"),
    ):
        bad.write_text(json.dumps({**good, **change}))
        with pytest.raises(ValueError, match=message):
            load_stack_file(bad)
    gpu, model = get_gpu("a100-40gb"), get_model("opt-13b")
    system = {"name": "vllm"}
    for cost, key in (
        ({"kind": "roofline", "stack": "measured"}, "cost.stack_path"),
        ({"kind": "roofline", "stack": "vllm-2023", "stack_path": str(bad)}, "cost.stack_path"),
        ({"kind": "profiled", "stack": "measured", "stack_path": str(bad)}, "cost.stack_path"),
    ):
        with pytest.raises(ConfigError, match=key):
            make_cost_model({"system": system, "cost": cost}, model, gpu)


def test_a_run_without_phase_columns_is_one_line(tmp_path: Path, capsys) -> None:
    _steps([1, 2], 1, 1).drop(columns=list(PHASE_COLUMNS)).to_csv(tmp_path / "steps.csv")
    for run in (tmp_path, tmp_path / "nope"):
        with pytest.raises(SystemExit) as exit_:
            calibrate_overhead.main([str(run), "--out", str(tmp_path / "s.json")])
        assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "no column schedule_s" in err[0] and "no steps.csv" in err[1]


def test_a_fit_the_points_cannot_support_fails_unless_dry(tmp_path: Path, capsys) -> None:
    """CPU time falling with the sequences (a negative slope) is an error on a real run and,
    with --dry (meaningless timings), a report with no file; a run that is not there is an
    error either way."""
    _steps([s for s in range(1, 9) for _ in range(6)], 1e-3, -1e-4).to_csv(
        tmp_path / "steps.csv", index=False
    )
    out = tmp_path / "s.json"
    with pytest.raises(SystemExit) as exit_:
        calibrate_overhead.main([str(tmp_path), "--out", str(out)])
    assert exit_.value.code == 2 and "negative term" in capsys.readouterr().err
    assert calibrate_overhead.main([str(tmp_path), "--out", str(out), "--dry"]) == 0
    assert "dry: no fit" in capsys.readouterr().out and not out.exists()
    with pytest.raises(SystemExit) as exit_:  # --dry forgives the fit, not a missing run
        calibrate_overhead.main([str(tmp_path / "absent"), "--out", str(out), "--dry"])
    assert exit_.value.code == 2 and "no steps.csv" in capsys.readouterr().err


def test_measured_stack_prices_swaps_as_kvlab_engine_issues_them() -> None:
    """kvlab's engine swaps a step's blocks with a gather, a transfer and a scatter per
    direction (engine.kv_cache): the measured stack charges 3 call latencies per direction
    that moves blocks, whatever the blocks and layers; vllm-2023 keeps a copy per block per
    layer for K and V."""
    from core.defaults import swap_chunk_blocks
    from sim.cost.stack_file import KVLAB_SWAP_CALLS

    measured = load_stack_file(SHIPPED)
    assert measured.copies_per_block_per_layer == 0
    assert measured.swap_calls_per_direction == KVLAB_SWAP_CALLS == 3
    plain = RooflineCostModel("opt-13b", "a100-40gb", block_size=16)
    kv = RooflineCostModel("opt-13b", "a100-40gb", stack=measured, block_size=16)
    lat = measured.copy_latency_s
    for shape, directions in (
        (BatchShape(swap_out_blocks=1), 1),
        (BatchShape(swap_out_blocks=swap_chunk_blocks(kv.block_bytes)), 1),  # one full chunk
        (BatchShape(swap_in_blocks=4, swap_out_blocks=6), 2),
    ):
        extra = kv.transfer_time(shape) - plain.transfer_time(shape)
        assert extra == pytest.approx(directions * KVLAB_SWAP_CALLS * lat), shape
    assert kv.transfer_time(BatchShape()) == 0.0
    # past SWAP_CHUNK_BYTES a direction moves in chunks, 3 calls each, as the engine does
    per_chunk = swap_chunk_blocks(kv.block_bytes)
    assert 1 < per_chunk < 10_000
    big = BatchShape(swap_out_blocks=2 * per_chunk + 1, swap_in_blocks=per_chunk)
    extra = kv.transfer_time(big) - plain.transfer_time(big)
    assert extra == pytest.approx((3 + 1) * KVLAB_SWAP_CALLS * lat)
    v0 = RooflineCostModel("opt-13b", "a100-40gb", stack="vllm-2023", block_size=16)
    assert v0.stack.swap_calls_per_direction == 0
    one = BatchShape(swap_out_blocks=1)
    assert v0.transfer_time(one) - plain.transfer_time(one) == pytest.approx(40 * 2 * lat)
    assert "3 calls per swap direction per chunk of 256 MiB" in describe_stack(measured)
    assert "per swap direction" not in describe_stack(v0.stack)


def test_the_measured_stack_keeps_its_own_cpu_fit_at_any_tp() -> None:
    """A stack file's fit is the engine's whole CPU time: the 2023 stack's Ray term is not
    added at tp > 1, nor named among its sources."""
    stack = load_stack_file(SHIPPED)
    assert not stack.ray_workers and "ray_workers" not in stack.sources
    shape = BatchShape(decode_seqs=8, decode_ctx_tokens=8 * 256)
    model = RooflineCostModel("opt-66b", "a100-40gb", tp=4, stack=stack)
    assert model.stack.cpu is stack.cpu
    assert "Ray" not in describe_stack(model.stack)
    assert model.step_time(shape) > 0


def test_runs_of_different_devices_or_timers_are_not_fitted_together(tmp_path: Path) -> None:
    import json

    from experiments.calibrate_overhead import measured_on
    from experiments.lib.checks import ConfigError

    for name, timer in (("a", "wall"), ("b", "thread_cpu")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "engine.json").write_text(
            json.dumps({"device": "CPU", "step_timer": timer})
        )
    assert measured_on([tmp_path / "a", tmp_path / "a"]) == "CPU"
    with pytest.raises(ConfigError, match=r"different devices or step timers \(CPU, CPU \(thread"):
        measured_on([tmp_path / "a", tmp_path / "b"])
