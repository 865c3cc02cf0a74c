"""The GPU scripts' code paths that only a CUDA device reaches, pinned on CPU.

The dry runs (``--dry``, ``DRY=1 gpu_all.sh``) never take the branches a real GPU takes:
the GPU plans (dtype, shapes, repeats), the device's own name in the outputs, the CUDA-event
timing, the bf16 correctness check. Here those branches run against a faked ``torch.cuda``
(its name, properties and events), so a change to them fails on any machine.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from experiments.bench import engine_gpu, gpu_env, kernels_gpu, profile_gpu, timing
from experiments.bench.gpu_report import pricing
from experiments.lib.checks import ConfigError
from sim.catalog import get_gpu
from tests.test_gpu_all_script import calls, parts, run_script

H100_NAME = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def fake_h100(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.cuda`` reports one H100 SXM (name, capability, properties)."""
    props = SimpleNamespace(total_memory=80 * 2**30, multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: H100_NAME)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *_: props)


# --- gpu_env -------------------------------------------------------------------------------


@pytest.mark.usefixtures("fake_h100")
def test_env_reports_the_device_s_name_capability_and_memory() -> None:
    """On a GPU, env.json's ``gpu`` holds the device's own name (what the hardware catalog
    matches), its capability as "major.minor", its memory in GiB and its SM count."""
    info = gpu_env.gpu_info()
    assert info["cuda_available"] is True and info["device_count"] == 1
    assert info["name"] == H100_NAME and get_gpu(info["name"]).name == "h100"
    assert info["capability"] == "9.0"
    assert info["memory_gib"] == pytest.approx(80.0)
    assert info["multiprocessors"] == 132


def test_env_fails_when_an_import_fails_even_dry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module that does not import stops gpu_all.sh (exit 1), in a dry run too; the
    failure is listed in env.json."""
    monkeypatch.setattr(gpu_env, "check_imports", lambda: {"core": "ok", "simpy": "boom"})
    out = tmp_path / "env.json"
    assert gpu_env.main(["--out", str(out), "--dry"]) == 1
    assert json.loads(out.read_text())["import_failures"] == {"simpy": "boom"}


@pytest.mark.usefixtures("fake_h100")
def test_env_passes_on_a_gpu_when_everything_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside dry mode, a visible CUDA device and no import failure is exit 0."""
    monkeypatch.setattr(gpu_env, "check_imports", lambda: {"core": "ok"})
    out = tmp_path / "env.json"
    assert gpu_env.main(["--out", str(out)]) == 0
    assert json.loads(out.read_text())["gpu"]["name"] == H100_NAME


# --- profile_gpu ---------------------------------------------------------------------------


def test_the_gpu_profile_plan_is_the_documented_one() -> None:
    """The GPU profile: OPT-13B, fp16 on CUDA, block 16, token counts 1..4096, decode totals
    up to 2^17, median of 30 after 5 warm-up calls, a GPU sleep and a 256 MiB write before
    each repeat; and the cache holds every decode batch at block 16 (not refused)."""
    plan = profile_gpu.make_plan(dry=False)
    assert plan.device.type == "cuda" and not plan.dry
    assert (plan.model, plan.dtype, plan.block_size) == ("opt-13b", torch.float16, 16)
    assert plan.token_counts == tuple(2**i for i in range(13))
    assert plan.max_context_tokens == 2**17
    assert max(t for _, t in profile_gpu.decode_points(plan)) == 2**17
    assert (plan.repeats, plan.warmup) == (30, 5)
    assert plan.flush_bytes == 256 << 20 and plan.sleep_cycles > 0
    assert not plan.thread_clock and plan.in_model_tokens == 0 and plan.backend == "triton"
    assert profile_gpu.blocks_short(plan) is None


@pytest.mark.usefixtures("fake_h100")
def test_a_gpu_profile_s_sidecar_names_the_device_as_torch_reports_it() -> None:
    """The sidecar's ``gpu`` is ``torch.cuda.get_device_name`` (gpu_report finds the
    catalog GPU from it), its dtype fp16, and its method says CUDA events and median, with
    no CPU malloc note."""
    meta = profile_gpu.sidecar(profile_gpu.make_plan(dry=False), [])
    assert meta["gpu"] == H100_NAME and meta["dtype"] == "float16" and meta["dry"] is False
    assert meta["method"].startswith("CUDA events, median of 30 after 5")
    assert "MEANINGLESS" not in meta["method"] and "malloc" not in meta["method"]
    p = pricing({**meta, "complete": True}, None)
    assert (p.gpu, p.width, p.block, p.as_measured) == ("h100", 2, 16, False)


# --- timing: the CUDA-event branch ---------------------------------------------------------


class _FakeCuda:
    """Logs what ``timing.time_ms`` asks of ``torch.cuda``; an event's time can be read only
    after a synchronize that follows its record (as on a device)."""

    def __init__(self, times: list[float]) -> None:
        self.log: list[str] = []
        self.times = list(times)

    def synchronize(self) -> None:
        self.log.append("sync")

    def _sleep(self, cycles: int) -> None:
        self.log.append(f"sleep {cycles}")

    def Event(self, enable_timing: bool = False) -> Any:
        assert enable_timing
        cuda = self

        class Event:
            at = -1

            def record(self) -> None:
                cuda.log.append("record")
                self.at = len(cuda.log)

            def elapsed_time(self, end: Any) -> float:
                assert "sync" in cuda.log[end.at :], "event read before a synchronize"
                return cuda.times.pop(0)

        return Event()


def test_cuda_timing_brackets_only_the_call_and_syncs_before_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On CUDA each repeat is: GPU sleep, L2 flush write, start event, the call, end event;
    the events are read only after a synchronize, and the result is their median."""
    cuda = _FakeCuda([5.0, 1.0, 2.0, 100.0, 3.0])
    flushes: list[int] = []

    class Buffer:
        def fill_(self, value: int) -> None:
            cuda.log.append("flush")

    def empty(n: int, dtype: Any = None, device: Any = None) -> Buffer:
        flushes.append(n)
        return Buffer()

    fake_torch = SimpleNamespace(empty=empty, uint8=torch.uint8, cuda=cuda)
    monkeypatch.setattr(timing, "torch", fake_torch)
    ms = timing.time_ms(lambda: cuda.log.append("fn"), torch.device("cuda"), 5, 2, 64, 7)
    assert ms == 3.0 and flushes == [64]
    repeat = ["sleep 7", "flush", "record", "fn", "record"]
    assert cuda.log == ["fn", "fn", "sync", *repeat * 5, "sync"]


# --- engine_gpu ----------------------------------------------------------------------------


def test_the_gpu_engine_plan_serves_fp16_with_a_12_gib_budget() -> None:
    """The GPU engine runs: CUDA, fp16, Triton, both models with the paper's 12 GiB KV
    budget, no swap space, a torch cross-check expected to take at least 50 s."""
    plan = engine_gpu.make_plan(dry=False)
    assert (plan.device, plan.dtype, plan.backend) == ("cuda", "float16", "triton")
    assert [m.kv_budget_gb for m in plan.models] == [12.0, 12.0]
    assert plan.swap_space_gb == 0.0 and plan.torch_run_s == 50.0


@pytest.mark.usefixtures("fake_h100")
def test_gpu_engine_metadata_names_the_device() -> None:
    """summary.json's ``device`` is the device's own name on a GPU (not the dry label), and
    its timings are not marked meaningless."""
    plan = replace(engine_gpu.make_plan(dry=False), hardware="h100")
    meta = engine_gpu.metadata(plan, [])
    assert meta["device"] == H100_NAME and meta["hardware"] == "h100" and meta["dry"] is False
    assert "MEANINGLESS" not in meta["timings"]


def test_the_gpu_s_cache_is_emptied_after_each_run_even_a_failed_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a GPU each engine run ends with the allocator's cache emptied (the next model's
    weights need the memory), also when the run raised."""
    emptied: list[bool] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))

    def fail(spec: Any, out: Path) -> dict[str, Any]:
        raise RuntimeError("CUDA out of memory")

    doc: dict[str, Any] = {"errors": {}}
    spec = engine_gpu.RunSpec("r", "opt-13b", "vllm", "offline", "triton", ())
    assert engine_gpu._serve_logged(spec, Path("unused"), doc, fail) is None
    assert emptied == [True] and "out of memory" in doc["errors"]["r"]


def _serve_fake(
    monkeypatch: pytest.MonkeyPatch,
    lengths: list[float],
    max_seconds: float,
    spent: float = 0.0,
    missing: tuple[str, ...] = (),
) -> dict[str, Any]:
    """``serve_all`` over the GPU plan's first runs, the i-th taking ``lengths[i]`` seconds
    of a fake clock, each row without the ``missing`` metrics (no summary written)."""
    plan = engine_gpu.make_plan(dry=False)
    specs = engine_gpu.run_specs(plan, {m.model: Path("t.csv") for m in plan.models})
    specs = specs[: len(lengths)]
    now = [0.0]
    took = dict(zip((s.name for s in specs), lengths, strict=True))

    def serve(spec: engine_gpu.RunSpec, out: Path) -> dict[str, Any]:
        now[0] += took[spec.name]
        return {"run": spec.name, "model": spec.model, "system": spec.system,
                "mode": spec.mode, "backend": spec.backend,
                **dict.fromkeys(engine_gpu.SUMMARY_KEYS, 1.0),
                **dict.fromkeys(missing)}  # fmt: skip

    doc: dict[str, Any] = {"meta": {}, "rows": [], "errors": {}, "skipped": [],
                           "skip_reasons": {}}  # fmt: skip
    monkeypatch.setattr(engine_gpu, "write_summary", lambda out, doc: None)
    engine_gpu.serve_all(plan, specs, Path("unused"), max_seconds, doc, lambda: now[0], serve,
                         spent=spent)  # fmt: skip
    return doc


def test_the_expected_length_is_the_longest_run_so_far_not_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a 30 s run and a 5 s one (35 s spent), a third run is expected to take 30 s: it
    would end past a 60 s cap, so it is skipped."""
    doc = _serve_fake(monkeypatch, [30.0, 5.0, 1.0], 60.0)
    assert len(doc["rows"]) == 2 and len(doc["skipped"]) == 1


def test_a_run_without_a_metric_does_not_stop_the_runs_after_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A row lacking its throughput and batch (None) is kept and its progress line says
    n/a; the next run is still served."""
    doc = _serve_fake(monkeypatch, [1.0, 1.0], 600.0,
                      missing=("output_throughput", "mean_batch_size"))  # fmt: skip
    assert len(doc["rows"]) == 2 and not doc["errors"]
    assert "n/a tok/s, batch n/a" in capsys.readouterr().out


def test_the_time_spent_before_the_runs_counts_toward_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With 100 s already spent (traces, start-up) under a 120 s cap, a first 30 s run ends
    at 130 s: the next, expected to take 30 s more, is skipped."""
    doc = _serve_fake(monkeypatch, [30.0, 30.0], 120.0, spent=100.0)
    assert len(doc["rows"]) == 1 and len(doc["skipped"]) == 1


def test_no_ratio_for_a_vllm_run_that_produced_no_throughput() -> None:
    """A vllm run without an output throughput (it failed) gets no ratio to its baselines,
    and the summary is still written (no error)."""
    base = {"model": "opt-13b", "mode": "offline", "backend": "triton", "mean_batch_size": 2.0}
    rows = [
        {**base, "run": "opt-13b_vllm_offline", "system": "vllm", "output_throughput": None},
        {**base, "run": "opt-13b_orca_max_offline", "system": "orca_max",
         "output_throughput": 10.0},
    ]  # fmt: skip
    assert engine_gpu.ratios(rows) == []


def test_a_skipped_run_fails_the_engine_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run skipped for the time cap makes the engine part exit 1 (not all was measured),
    though no run raised."""

    def serve_all(plan: Any, specs: Any, out: Path, cap: float, doc: dict, **_: Any) -> None:
        doc["skipped"].append(specs[-1].name)
        doc["skip_reasons"][specs[-1].name] = "would end past --max-seconds"

    monkeypatch.setattr(engine_gpu, "serve_all", serve_all)
    assert engine_gpu.main(["--out", str(tmp_path), "--dry"]) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["errors"] == {} and len(summary["skipped"]) == 1


# --- kernels_gpu ---------------------------------------------------------------------------


def test_the_gpu_kernel_plan_checks_fp16_and_bf16() -> None:
    """On a GPU the kernels are checked in fp16 and bf16 (the module doc), on CUDA."""
    plan = kernels_gpu.make_plan(dry=False)
    assert plan.device.type == "cuda" and set(plan.dtypes) == {torch.float16, torch.bfloat16}


@pytest.mark.usefixtures("fake_h100")
def test_gpu_kernel_metadata_names_the_device() -> None:
    """results.json's ``device`` is the device's own name on a GPU, timings not marked
    meaningless."""
    meta = kernels_gpu.metadata(kernels_gpu.make_plan(dry=False), [])
    assert meta["device"] == H100_NAME and meta["dry"] is False
    assert "MEANINGLESS" not in meta["timings"]


def _cpu_gpu_plan() -> kernels_gpu.Plan:
    """The dry plan's tiny shapes with ``dry`` false, its last dtype bf16: what the GPU
    branches do, on CPU (no timing: ``time_ms`` is faked)."""
    return replace(kernels_gpu.make_plan(dry=True), dry=False,
                   dtypes=(torch.float32, torch.bfloat16))  # fmt: skip


@pytest.mark.usefixtures("fake_h100")
def test_gpu_benchmarks_time_fp16_whatever_the_checked_dtypes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Outside a dry run fig18a, long_context and block_size time fp16 (the paper's
    setting), not the last checked dtype (bf16); long_context's split count is the one the
    kernel picks for the device's SM count."""
    from kernels.paged_attention import choose_num_splits

    monkeypatch.setattr(kernels_gpu, "time_ms", lambda fn, plan: 1.0)
    dtypes: list[torch.dtype] = []
    make_batch = kernels_gpu.decode_batch

    def decode_batch(*args: Any, **kwargs: Any) -> kernels_gpu.DecodeBatch:
        dtypes.append(args[4])
        return make_batch(*args, **kwargs)

    monkeypatch.setattr(kernels_gpu, "decode_batch", decode_batch)
    plan = replace(_cpu_gpu_plan(), long_contexts=(1024,), long_batches=(1,))
    assert {r["dtype"] for r in kernels_gpu.run_fig18a(plan)} == {"float16"}
    rows = kernels_gpu.run_long_context(plan, copy_gbps=1.0)
    kernels_gpu.run_block_size(plan)
    assert set(dtypes) == {torch.float16}
    _, kv_heads, dim = plan.long_heads
    assert [r["kv_gbytes"] for r in rows] == [2 * 1024 * kv_heads * dim * 2 / 1e9]  # fp16
    assert rows[0]["num_splits"] == choose_num_splits(kv_heads, 1024, 132) > 1


@pytest.mark.usefixtures("fake_h100")
def test_long_context_skips_a_batch_over_a_quarter_of_free_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On CUDA a long-context batch whose K/V would take more than a quarter of the free
    device memory is skipped; the others run."""
    plan = replace(kernels_gpu.make_plan(dry=False), long_heads=(4, 2, 16),
                   long_contexts=(32, 64), long_batches=(1, 2))  # fmt: skip
    per_token = 2 * 2 * 16 * 2  # K and V, kv heads, dim, fp16
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *_: (4 * 64 * per_token, 1 << 40))
    batch = SimpleNamespace(attend=lambda num_splits=None: None, kv_bytes=lambda: 1)
    monkeypatch.setattr(kernels_gpu, "decode_batch", lambda *a, **k: batch)
    monkeypatch.setattr(kernels_gpu, "time_ms", lambda fn, plan: 1.0)
    rows = kernels_gpu.run_long_context(plan, copy_gbps=1.0)
    assert [(r["batch"], r["context"]) for r in rows] == [(1, 32), (1, 64), (2, 32)]


def test_a_failed_correctness_check_fails_the_kernel_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kernels_gpu exits 1 when a kernel's result is off (a correctness row not ok), even
    though every section ran."""
    bad = kernels_gpu._check_row("store_kv", "case", torch.bfloat16, 0.5, 0.0)
    monkeypatch.setattr(kernels_gpu, "copy_bandwidth_gbps", lambda plan: 1.0)
    monkeypatch.setattr(kernels_gpu, "run_correctness", lambda plan: [bad])
    for name in ("run_fig18a", "run_block_size"):
        monkeypatch.setattr(kernels_gpu, name, lambda plan: [])
    monkeypatch.setattr(kernels_gpu, "run_long_context", lambda plan, gbps: [])
    assert bad["ok"] is False
    assert kernels_gpu.main(["--out", str(tmp_path), "--dry"]) == 1
    assert json.loads((tmp_path / "results.json").read_text())["errors"] == {}


@pytest.mark.parametrize("err", [float("nan"), 0.06])
def test_a_kernel_check_fails_on_nan_or_over_its_tolerance(err: float) -> None:
    """A NaN error or one over the tolerance is not ok."""
    assert kernels_gpu._check_row("paged_attention", "c", torch.bfloat16, err, 5e-2)["ok"] is False


# --- gpu_report pricing --------------------------------------------------------------------


def _meta(gpu: str, dtype: str = "float16") -> dict[str, Any]:
    return {"gpu": gpu, "model": "opt-13b", "dtype": dtype, "block_size": 16, "dry": False}


def test_a_known_device_is_priced_as_itself_not_as_measured() -> None:
    """A profile from a device the catalog names is carried to that GPU (not used as
    measured), with or without ``--hardware`` naming the same GPU; the width follows the
    sidecar's dtype."""
    for hardware in (None, "h100"):
        p = pricing(_meta(H100_NAME), hardware)
        assert (p.gpu, p.as_measured, p.width) == ("h100", False, 2)
    assert pricing(_meta("NVIDIA H200", "float32"), None).width == 4
    unknown = pricing(_meta("NVIDIA H100 NVL"), "h100")
    assert (unknown.gpu, unknown.as_measured) == ("h100", True)


def test_hardware_other_than_the_profile_s_device_is_refused() -> None:
    """``--hardware`` naming another GPU than the one the profile's device is: refused."""
    with pytest.raises(ConfigError, match="measured on h100"):
        pricing(_meta(H100_NAME), "h200")


def test_a_sidecar_without_complete_still_prices_the_tables(tmp_path: Path) -> None:
    """Only ``"complete": false`` marks a cut profile: a sidecar without the key (profiles
    written before it existed) is used."""
    from experiments.bench.gpu_report import profile_problem

    (tmp_path / "operator_profile.csv").write_text("op,num_tokens,context_tokens,time_ms\n")
    side = tmp_path / "operator_profile.json"
    side.write_text(json.dumps(_meta(H100_NAME)))
    assert profile_problem(tmp_path) is None
    side.write_text(json.dumps({**_meta(H100_NAME), "complete": False}))
    assert "complete: false" in str(profile_problem(tmp_path))


def test_forward_gap_bins_decode_only_steps_by_sequences() -> None:
    """forward_gap reads decode-only steps (a mixed step is left out), binned by sequence
    count and labelled by the bin's first and last count ("1-1", "3-4"), with the host's
    time in the forward call where the run recorded it."""
    import pandas as pd

    from experiments.bench.gpu_report import forward_gap_rows

    steps = pd.DataFrame({
        "prefill_tokens": [0, 0, 0, 7], "decode_seqs": [1, 3, 4, 3],
        "duration_s": [0.02, 0.03, 0.03, 0.05], "forward_s": [0.01, 0.02, 0.02, 0.04],
        "forward_issue_s": [0.01, 0.01, 0.01, 0.01],
    })  # fmt: skip
    priced = SimpleNamespace(profile_seconds=lambda df: df["forward_s"] / 2)
    rows = forward_gap_rows(Path("run"), steps, priced)
    assert [(r["seqs"], r["steps"]) for r in rows] == [("1-1", 1), ("3-4", 2)]
    assert rows[1]["forward_ms"] == pytest.approx(20.0)
    assert rows[1]["forward_issue_ms"] == pytest.approx(10.0)  # the host's time, when recorded


def test_a_stall_is_a_step_over_ten_times_the_run_s_median() -> None:
    """stalls.csv counts steps over ``STALL_FACTOR`` (10) times the run's median step."""
    import pandas as pd

    from experiments.bench.gpu_report import stall_row

    def stalls(durations: list[float]) -> int:
        return stall_row(Path("run"), pd.DataFrame({"duration_s": durations}))["stalls"]

    assert stalls([1.0, 1.0, 1.0, 5.0]) == 0
    assert stalls([1.0, 1.0, 1.0, 20.0]) == 1


# --- gpu_all.sh ----------------------------------------------------------------------------


def test_a_deadline_cut_engine_keeps_at_least_half_its_limit_to_run(tmp_path: Path) -> None:
    """Under a deadline that cuts the engine's limit below twice its 15 s reserve, the
    engine's --max-seconds is half its limit, not the limit less 15 s (which would leave it
    almost nothing to run)."""
    _, out, _ = run_script(tmp_path, DEADLINE_S="40", LIMIT_SCALE="1")
    engine = next(r for r in parts(out) if r["part"] == "engine")
    limit = int(engine["limit_s"])
    assert 15 < limit < 30
    max_seconds = int(calls(tmp_path)[3].split("--max-seconds ")[1].split()[0])
    assert max_seconds == limit // 2


@pytest.mark.parametrize(
    "module", ["profile_gpu", "engine_gpu", "kernels_gpu", "sync_check", "host_time"]
)
def test_every_gpu_part_refuses_to_run_without_a_gpu(
    module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without ``--dry`` and with no CUDA device, each GPU part stops with one usage line
    naming the missing device (exit 2) before it measures or writes anything."""
    import importlib

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    main = importlib.import_module(f"experiments.bench.{module}").main
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "out")])
    assert exc.value.code == 2 and "no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# --- host_time -----------------------------------------------------------------------------


def test_a_module_class_named_norm_is_timed_as_norm() -> None:
    """A norm that is no ``nn.LayerNorm`` (Llama's RMSNorm: any class named ``*Norm``) is
    hooked and its time goes to ``norm``, not ``rest``."""
    from torch import nn

    from experiments.bench.host_time import HostTally, instrument

    class RMSNorm(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    model = nn.Sequential(RMSNorm())
    tally = HostTally()
    instrument(model, tally)
    tally.active = True
    model(torch.ones(2))
    assert set(tally.seconds) == {"norm"}


def test_a_stall_is_judged_against_its_own_run_s_median() -> None:
    """A step is a stall when over ``STALL_FACTOR`` times the median of its own run, whatever
    the other runs' steps take."""
    from experiments.bench.host_time import PARTS, summarize

    def row(run: str, ms: float) -> dict[str, Any]:
        parts = dict.fromkeys(PARTS, 0.0)
        return {"run": run, "kind": "decode", "issue_ms": ms, "total_ms": ms, **parts,
                "linear": 0.1, "attention": 0.1, "rest": ms, "gc_generation": -1}  # fmt: skip

    rows = [row("fast", ms) for ms in (1.0, 1.0, 1.0, 15.0)]
    rows += [row("slow", 100.0) for _ in range(4)]
    stalls = summarize(rows).set_index("run")["stall_steps"]
    assert stalls.to_dict() == {"fast": 1, "slow": 0}


# --- sync_check ----------------------------------------------------------------------------


def test_the_sync_check_s_own_frames_are_not_the_site() -> None:
    """The site of a synchronizing operation is the innermost kvlab frame that is not the
    sync check's own wrapper."""
    import traceback

    from experiments.bench.sync_check import REPO, kvlab_site

    frame = traceback.FrameSummary
    stack = [
        frame(str(REPO / "engine/runner.py"), 125, "forward"),
        frame(str(REPO / "experiments/bench/sync_check.py"), 111, "forward"),
    ]
    assert kvlab_site(stack) == "engine/runner.py:125"


def test_a_sync_report_outside_the_forward_is_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only synchronizing operations torch reports inside the forward call are counted;
    one outside it (here: raised between steps) is shown as any other warning."""
    import warnings

    import experiments.serve
    from experiments.bench.sync_check import check

    serve_to_end = experiments.serve.run_to_end

    def run_to_end(steps: Any) -> Any:
        warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
        return serve_to_end(steps)

    monkeypatch.setattr(experiments.serve, "run_to_end", run_to_end)
    with pytest.warns(UserWarning, match="synchronizing"):
        doc = check(True, 100.0, 6, tmp_path)
    assert doc["sync_sites"] == {} and doc["steps"] > 0
