"""``experiments.calibrate`` and ``experiments.validate`` on a tiny CPU engine run."""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from experiments import calibrate, validate
from experiments.bench.cpu_cross_run import serve_run
from experiments.lib.checks import ConfigError
from experiments.lib.setup import with_profile_found

# 12 requests into 0.002 GiB of fp32 tiny-opt KV (2048 slots): vllm runs a real batch and
# Poisson arrivals at 30/s leave idle gaps and mid-run arrivals.
RUN = [
    "model=tiny-opt",
    "workload.num_requests=12",
    "workload.rate=30",
    "kv_cache_gb=0.002",
    "progress=false",
]


def _serve(tmp: Path, overrides: list[str]) -> Path:
    return serve_run(tmp, [*RUN, *overrides])


@pytest.fixture(scope="module")
def online_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield _serve(tmp_path_factory.mktemp("online"), [])


def test_calibration_fit_has_finite_stats(online_run: Path, capsys) -> None:
    assert calibrate.main([str(online_run)]) == 0
    doc = json.loads((online_run / "calibration.json").read_text())
    assert doc["kind"] == "calibrated" and doc["model"] == "tiny-opt"
    assert doc["dtype_bytes"] == 4  # the run's float32, not the catalog's fp16 default
    stats = doc["fit_stats"]
    assert stats["n_steps"] >= 4
    assert math.isfinite(stats["r2"]) and stats["r2"] <= 1.0
    assert math.isfinite(stats["mape"]) and stats["mape"] >= 0.0
    assert all(c >= 0 and math.isfinite(c) for c in doc["coefficients"].values())
    assert "R²=" in capsys.readouterr().out


def test_calibration_weighting_flag_reaches_the_fit(online_run: Path, tmp_path: Path) -> None:
    out = {w: tmp_path / f"{w}.json" for w in ("absolute", "relative")}
    for weighting, path in out.items():
        args = [str(online_run), "--out", str(path), "--weighting", weighting]
        assert calibrate.main(args) == 0
    docs = {w: json.loads(p.read_text()) for w, p in out.items()}
    assert {w: d["fit_stats"]["weighting"] for w, d in docs.items()} == {
        "absolute": "absolute", "relative": "relative",
    }  # fmt: skip
    # the two objectives weigh the steps differently, so the coefficients differ
    assert docs["absolute"]["coefficients"] != docs["relative"]["coefficients"]
    with pytest.raises(SystemExit):
        calibrate.main([str(online_run), "--weighting", "squared"])


def test_validation_with_the_calibrated_model_writes_its_file(online_run: Path) -> None:
    calibrate.main([str(online_run)])
    out = online_run / "validation_calibrated.json"
    assert validate.main([str(online_run), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = {r["metric"]: r for r in doc["comparison"]}
    assert set(rows) == set(validate.METRICS)
    assert doc["simulator"]["completed"] == doc["engine"]["completed"] == 12
    assert doc["exact_replay_expected"] is False
    assert all(math.isfinite(rows[m]["simulator"]) for m in ("output_throughput", "mean_e2el_ms"))


# vllm_v1 with a small cache and token budget: recompute preemptions under prefix caching
V1_PREEMPTING = [
    "system=vllm_v1",
    "kv_cache_gb=0.0004",
    "system.max_num_batched_tokens=64",
    "system.max_num_seqs=64",
]


@pytest.mark.parametrize("mode", ["online", "offline", "vllm_v1", "vllm_v1_preempting"])
def test_recorded_replay_reproduces_the_engine_metrics(
    mode: str, online_run: Path, tmp_path: Path
) -> None:
    """Each step at its recorded time, the simulator serves the run as the engine did. The
    vllm_v1 runs have prefix caching on and no token ids in the workload: the simulator
    gives each request the ids the engine drew, so a request preempted by recompute hits
    its own blocks (prompt and generated) in both."""
    extra = {
        "online": None, "offline": ["mode=offline"], "vllm_v1": ["system=vllm_v1"],
        "vllm_v1_preempting": V1_PREEMPTING,
    }[mode]  # fmt: skip
    run_dir = online_run if extra is None else _serve(tmp_path, extra)
    out = tmp_path / "validation.json"
    assert validate.main([str(run_dir), "--recorded", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["exact_replay_expected"] is True
    assert doc["recorded_steps_left"] == 0
    rows = {r["metric"]: r for r in doc["comparison"]}
    if mode == "vllm_v1_preempting":  # the memory side is compared too
        assert rows["num_preemptions"]["engine"] == doc["engine"]["num_preemptions"] > 0
        assert rows["kv_token_states_pct"]["simulator"] > 0
    engine, sim = doc["engine"], doc["simulator"]
    summary_keys = set(sim) - {"wall_s"}
    assert {"num_steps", "mean_batch_size", "normalized_latency"} <= summary_keys
    for key in summary_keys:
        assert sim[key] == engine[key], key
    assert all(r["rel_err"] == 0.0 for r in doc["comparison"])


@pytest.mark.parametrize(
    "extra",
    [
        ["workload.beam_width=2"],
        # the engine audit's runs: 3 beams on 40 blocks (then under V1's rules, which now
        # refuse beams); v0 swapping beams under chunked prefill on 30 (both diverged when the
        # simulator drew its own beams)
        ["workload.beam_width=3", "num_gpu_blocks=40", "kv_cache_gb=null"],
        [
            "system.chunked_prefill=true",
            "system.max_num_batched_tokens=256",
            "system.max_num_seqs=8",
            "workload.beam_width=2",
            "num_gpu_blocks=30",
            "kv_cache_gb=null",
            "system.preemption_mode=swap",
        ],
    ],
    ids=["vllm", "vllm_40_blocks", "chunked_swap_30_blocks"],
)
def test_a_beam_search_run_replays_the_engines_beams(extra: list[str], tmp_path: Path) -> None:
    """The engine ranks beams by its model's log-probabilities, the simulator by seeded
    scores (sim.beams): replayed, the simulator takes the engine's choices from beams.csv
    and serves the run as the engine did. Without the file it says why it need not."""
    run_dir = _serve(tmp_path, extra)
    assert (run_dir / "beams.csv").is_file()
    out = tmp_path / "validation.json"
    assert validate.main([str(run_dir), "--recorded", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["exact_replay_expected"] is True and doc["recorded_steps_left"] == 0
    assert all(r["rel_err"] == 0.0 for r in doc["comparison"]), doc["comparison"]
    engine, sim = doc["engine"], doc["simulator"]
    for key in set(sim) - {"wall_s"}:
        assert sim[key] == engine[key], key
    (run_dir / "beams.csv").unlink()
    try:  # the simulator's own beams: a replay that may diverge, or finish inexactly
        doc = validate.validate(run_dir, recorded=True)
    except ConfigError as exc:
        assert "the replay diverged" in str(exc)
    else:
        assert doc["exact_replay_expected"] is False
        assert doc["not_exact_because"].startswith("12 beam-search request(s) and no beams.csv")
        assert "beam_search_requests" not in doc["simulator"]


def test_the_engine_counts_the_preemptions_its_full_cpu_pool_recomputed(
    tmp_path: Path,
) -> None:
    """Two-sample groups always swap (vLLM v0's rule); a pool of 3 blocks (16 KiB each,
    tiny-opt in fp32) takes only a group of at most 3 blocks, so most recompute, and the
    run's metrics count those alone. Every request arrives during the first step (1e9 req/s),
    so the schedule, and with it which groups fit the pool, does not hang on step times."""
    pool = ["workload.n=2", "num_gpu_blocks=24", "kv_cache_gb=null", "swap_space_gb=0.00005",
            "workload.rate=1e9"]  # fmt: skip
    metrics = json.loads((_serve(tmp_path, pool) / "metrics.json").read_text())
    assert 0 < metrics["num_swap_fallbacks"] < metrics["num_preemptions"]


def test_a_beams_csv_that_does_not_fit_the_run_is_one_line(tmp_path: Path) -> None:
    run_dir = _serve(tmp_path, ["workload.beam_width=2"])
    rows = (run_dir / "beams.csv").read_text().splitlines()
    (run_dir / "beams.csv").write_text("\n".join([rows[0], "0,999,0,0,5,-1.0", *rows[1:]]))
    with pytest.raises(ConfigError, match=r"--recorded: .*step 0 chooses beams of request 999"):
        validate.validate(run_dir, recorded=True)
    (run_dir / "beams.csv").write_text("\n".join([rows[0], "0,1,x,0,5,-1.0"]))
    with pytest.raises(ConfigError, match=r"run_dir: .*beams\.csv: line 2: expected 6 numbers"):
        validate.validate(run_dir, recorded=True)


def test_recorded_replay_of_a_cut_steps_file_is_one_line(
    online_run: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    run_dir = tmp_path / "cut"
    shutil.copytree(online_run, run_dir)
    lines = (run_dir / "steps.csv").read_text().splitlines(keepends=True)
    (run_dir / "steps.csv").write_text("".join(lines[: len(lines) // 2]))
    with pytest.raises(SystemExit) as exit_:
        validate.main([str(run_dir), "--recorded", "--out", str(tmp_path / "v.json")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "steps.csv" in err and "but metrics.json counts" in err and "\n" not in err


def test_validate_needs_a_calibration_or_recorded(online_run: Path) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        validate.validate(online_run)
    with pytest.raises(ConfigError, match="--calibration: not a calibration document"):
        validate.validate(online_run, {"kind": "roofline"})


def test_calibrate_names_a_directory_that_is_not_a_run(tmp_path: Path, capsys) -> None:
    with pytest.raises(ConfigError, match=r"run_dir: not a run directory: no config\.yaml"):
        calibrate.calibrate(tmp_path)
    with pytest.raises(SystemExit) as exc:
        calibrate.main([str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: run_dir: ") and "\n" not in err


def test_calibrate_names_run_dir_when_it_is_a_file(tmp_path: Path, capsys) -> None:
    """A file given as RUN_DIR is a run_dir error; it was reported against --out, which the
    command line did not give (the default output lies inside RUN_DIR)."""
    file = tmp_path / "a_file"
    file.write_text("")
    with pytest.raises(SystemExit) as exc:
        calibrate.main([str(file)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: run_dir: not a run directory (no such folder)")
    assert "\n" not in err


def test_open_loop_prediction_is_step_time_row_by_row(online_run: Path) -> None:
    """``predict_steps`` prices each measured step as ``step_time`` prices its shape."""
    import pandas as pd

    from core.plan import BatchShape

    model = calibrate.calibrate(online_run)
    steps = pd.read_csv(online_run / "steps.csv")
    steps = steps[(steps["prefill_tokens"] + steps["decode_seqs"]) > 0].head(40)
    fields = ("prefill_tokens", "prefill_seqs", "prefill_attn_pairs", "prefill_kv_read_tokens",
              "decode_seqs", "decode_ctx_tokens")  # fmt: skip
    by_shape = [
        model.step_time(BatchShape(**{f: int(row[f]) for f in fields}))
        for _, row in steps.iterrows()
    ]
    assert model.predict_steps(steps).tolist() == pytest.approx(by_shape, rel=1e-12)


def test_calibrate_on_a_profile_of_another_model_is_one_line(
    online_run: Path, tmp_path: Path, capsys
) -> None:
    """``--profile`` with a profile of a model other than the run's: exit 2, one line that
    names the flag and both models; nothing is written."""
    from tests.test_cost_profiled import synthetic_rows, write_profile

    prof = write_profile(tmp_path / "p", synthetic_rows(), gpu="cpu", model="opt-125m")
    out = tmp_path / "cal.json"
    with pytest.raises(SystemExit) as exc:
        calibrate.main([str(online_run), "--profile", str(prof), "--out", str(out)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --profile: ") and "\n" not in err
    assert "opt-125m" in err and "tiny-opt" in err
    assert not out.exists()


@pytest.fixture(scope="module")
def thread_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The online run on one thread's CPU time, as a CPU operator profile is timed."""
    yield _serve(tmp_path_factory.mktemp("thread"), ["threads=1", "step_timer=thread_cpu"])


def _tiny_opt_cpu_profile(out: Path, dtype: str) -> Path:
    """A synthetic operator profile of tiny-opt on the CPU in ``dtype``, written to ``out``."""
    from tests.test_cost_profiled import synthetic_rows, write_profile

    return write_profile(out, synthetic_rows(), gpu="cpu", model="tiny-opt", dtype=dtype)


def test_calibrate_on_a_profile_writes_a_file_validate_and_simulate_take(
    thread_run: Path, online_run: Path, tmp_path: Path, capsys
) -> None:
    """A profile of the run's model, dtype, block size and clock: the calibration names
    it, fits only the terms on top (roofline terms 0), and ``validate`` rebuilds the model
    from the file. The same profile in another dtype, or a run timed on the wall clock, is
    one line naming both."""
    prof = _tiny_opt_cpu_profile(tmp_path / "p", "float32")
    out = tmp_path / "cal.json"
    args = [str(thread_run), "--profile", str(prof), "--out", str(out), "--weighting", "relative"]
    assert calibrate.main(args) == 0
    doc = json.loads(out.read_text())
    assert doc["profile"] == os.path.relpath(prof, out.parent)  # the two can move together
    doc = with_profile_found(doc, out)
    assert Path(doc["profile"]).resolve() == Path(prof).resolve()
    roofline = ("linear_flop_time", "attn_flop_time", "byte_time")
    assert [doc["coefficients"][t] for t in roofline] == [0.0, 0.0, 0.0]
    assert "as measured; the terms below are fitted on top" in capsys.readouterr().out
    result = validate.validate(thread_run, doc)
    assert "as measured" in result["cost_model"]
    assert result["simulator"]["request_throughput"] > 0
    half = _tiny_opt_cpu_profile(tmp_path / "p16", "float16")
    for run, message in (
        (thread_run, "measured in float16, the run in float32"),
        (online_run, "served with step_timer=wall, threads=None"),
    ):
        bad = half if run == thread_run else prof
        with pytest.raises(SystemExit) as exc:
            calibrate.main([str(run), "--profile", str(bad), "--out", str(tmp_path / "x.json")])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip()
        assert message in err and err.startswith("error: --profile: ") and "\n" not in err


def test_calibrate_target_host_fits_the_time_outside_the_forward(
    thread_run: Path, tmp_path: Path, capsys
) -> None:
    """``--target host`` on a profile: the terms fit the run's measured time outside the
    forward (recorded in the file); without ``--profile``, or on a steps.csv without
    ``forward_s``, it is one line naming the flag."""
    import shutil

    prof = _tiny_opt_cpu_profile(tmp_path / "p", "float32")
    out = tmp_path / "cal.json"
    args = [str(thread_run), "--profile", str(prof), "--out", str(out), "--target", "host"]
    assert calibrate.main(args) == 0
    doc = json.loads(out.read_text())
    assert doc["fit_stats"]["target"] == "host"
    with pytest.raises(SystemExit) as exc:
        calibrate.main([str(thread_run), "--target", "host"])
    assert exc.value.code == 2 and "--target host" in capsys.readouterr().err
    bare = tmp_path / "bare"
    shutil.copytree(thread_run, bare)
    steps = pd.read_csv(bare / "steps.csv")
    steps.drop(columns=["forward_s"]).to_csv(bare / "steps.csv", index=False)
    with pytest.raises(SystemExit) as exc:
        calibrate.main([str(bare), "--profile", str(prof), "--out", str(out), "--target", "host"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --target: ") and "forward_s" in err and "\n" not in err


def test_a_calibrations_relative_profile_is_also_looked_for_beside_it(tmp_path: Path) -> None:
    (tmp_path / "prof").mkdir()
    cal = tmp_path / "calibration.json"
    assert with_profile_found({"profile": "prof"}, cal)["profile"] == str(tmp_path / "prof")
    assert with_profile_found({"profile": "absent"}, cal)["profile"] == "absent"  # unchanged
    assert with_profile_found({"kind": "calibrated"}, cal) == {"kind": "calibrated"}


def test_a_shipped_calibrations_profile_is_found_from_another_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calibrations under docs/ name their profile from the repository root; run from
    another working directory (as ``cost.path`` is found there) they find it too."""
    repo = Path(__file__).resolve().parents[1]
    sitting = repo / "docs" / "validation" / "cpu-engine" / "eighteenth-sitting"
    cal = sitting / "run_a" / "calibration.json"
    name = json.loads(cal.read_text())["profile"]
    monkeypatch.chdir(tmp_path)
    assert with_profile_found({"profile": name}, cal)["profile"] == str(repo / name)
    (tmp_path / name).mkdir(parents=True)  # one of the same name here is read from here
    assert with_profile_found({"profile": name}, cal)["profile"] == name


def test_a_calibration_from_another_machine_finds_its_profile_beside_it(tmp_path: Path) -> None:
    """gpu_all.sh's layout, fitted on the device under /tmp/kvlab-gpu and copied here."""
    call = tmp_path / "h200" / "second-run"
    (call / "profile").mkdir(parents=True)
    (call / "engine").mkdir()
    cal = call / "engine" / "calibration.json"
    moved = with_profile_found({"profile": "/nonexistent-device-dir/kvlab-gpu/profile"}, cal)
    assert moved["profile"] == str(call / "profile")
    gone = {"profile": "/nonexistent-device-dir/kvlab-gpu/other"}
    assert with_profile_found(gone, cal) == gone  # not found anywhere: left for the error
    (tmp_path / "other").mkdir()  # two levels above the call's folder: unrelated, not taken
    assert with_profile_found(gone, cal) == gone


def test_a_calibration_whose_steps_overflow_is_one_line(
    online_run: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A constant that passes the document's checks but overflows the clock (1e308 s a
    step) ends validate with one line, not a traceback (sim.driver.StepPriceError)."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    assert calibrate.main([str(online_run)]) == 0
    capsys.readouterr()  # calibrate's own lines (a scatter warning on a loaded machine)
    doc = json.loads((online_run / "calibration.json").read_text())
    doc["coefficients"]["constant"] = 1e308
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps(doc))
    args = [str(online_run), "--calibration", str(huge), "--out", str(tmp_path / "v.json")]
    with pytest.raises(SystemExit) as exit_:
        validate.main(args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "out of range" in err and err.count("\n") == 1
    assert not (tmp_path / "v.json").exists()


def test_a_calibration_measured_on_another_device_or_timer_is_refused(tmp_path: Path) -> None:
    """Its constants are another machine's (or another clock's) step times."""
    import json

    from experiments.calibrate import check_measured_alike
    from experiments.lib.checks import ConfigError

    (tmp_path / "engine.json").write_text(json.dumps({"device": "GPU X", "step_timer": "wall"}))
    check_measured_alike({"measured_on": "GPU X", "step_timer": "wall"}, tmp_path, "--calibration")
    check_measured_alike({}, tmp_path, "--calibration")  # older files record neither
    with pytest.raises(ConfigError, match="another device \\(CPU Y\\); this run's is GPU X"):
        check_measured_alike({"measured_on": "CPU Y"}, tmp_path, "--calibration")
    with pytest.raises(ConfigError, match="another step timer \\(thread_cpu\\)"):
        check_measured_alike({"measured_on": "GPU X", "step_timer": "thread_cpu"}, tmp_path, "k")


def test_a_fit_of_scattered_steps_warns_and_says_how_to_time_them() -> None:
    # a run served with torch's threads on a shared 2-core machine fitted at MAPE 772% and
    # R² 0.11, and calibrate wrote it without a word
    from experiments.calibrate import scatter_warning

    cpu_wall = {"measured_on": "cpu", "step_timer": "wall"}
    line = scatter_warning(7.72, cpu_wall)
    assert line is not None and line.startswith("warning: the fit misses the run's steps by 772%")
    assert "threads=1 step_timer=thread_cpu" in line
    assert "idle machine" in scatter_warning(0.9, {"measured_on": "cuda:0"})
    assert scatter_warning(0.45, cpu_wall) is None  # within SCATTERED_MAPE
    assert scatter_warning(None, cpu_wall) is None


def test_repeated_streams_counts_requests_the_engine_generates_alike() -> None:
    """Same prompt ids and greedy, beams of one width, or one sample seed (sample i of seed s
    draws with s + i), or a request's parallel samples drawn with top-k 1: the engine
    generates the same tokens. Unseeded draws, other prompts and prompts without ids do not
    count."""
    from core.request import Request, SamplingParams

    def req(i: int, ids: tuple[int, ...] | None, **sampling: Any) -> Request:
        return Request(i, 0.0, 4, 8, SamplingParams(**sampling), ids)

    a, b = (1, 2, 3, 4), (1, 2, 3, 5)
    assert validate.repeated_streams([req(0, a), req(1, a), req(2, b)]) == 2
    assert validate.repeated_streams([req(0, a), req(1, a, temperature=1.0, top_k=1)]) == 2
    assert validate.repeated_streams([req(0, a, beam_width=2), req(1, a, beam_width=2)]) == 2
    assert validate.repeated_streams([req(0, a, beam_width=2), req(1, a, beam_width=3)]) == 0
    seeded = [req(0, a, n=2, seed=7), req(1, a, temperature=1.0, seed=8)]
    assert validate.repeated_streams(seeded) == 2
    assert validate.repeated_streams([req(0, a, n=2), req(1, a, n=2)]) == 0  # own seeds
    assert validate.repeated_streams([req(0, None), req(1, None), req(2, b)]) == 0
    # one request's parallel samples drawn with top-k 1 are one stream, prompt ids or none
    assert validate.repeated_streams([req(0, None, n=2, temperature=1.0, top_k=1)]) == 1
    assert validate.repeated_streams([req(0, a, n=3, temperature=1.0, top_k=1), req(1, b)]) == 1


def test_a_recorded_replay_says_prefix_caching_of_repeated_greedy_prompts_need_not_match(
    tmp_path: Path,
) -> None:
    """vllm_v1 (prefix caching on, greedy) on a dataset of 3 prompts drawn 10 times, all at
    once into 19 blocks: the engine's repeats of a prompt generate the same tokens, and a
    request preempted by recompute finds another's generated blocks, which the simulator's
    stand-in ids cannot match (the replay's batches differ). The replay says so instead of
    expecting an exact match; sampled at temperature 1 the requests draw apart and it does."""
    rows = [
        {"instruction": " ".join(f"w{i}_{k}" for k in range(20 + 7 * i)), "input": "",
         "output": " ".join(["o"] * 40)}
        for i in range(3)
    ]  # fmt: skip
    data = tmp_path / "alpaca.json"
    data.write_text(json.dumps(rows))
    common = ["system=vllm_v1", "workload=alpaca_json", f"workload.path={data}",
              "workload.with_token_ids=true", "workload.num_requests=10",
              "workload.duration_s=null", "mode=offline", "kv_cache_gb=0.0003"]  # fmt: skip
    run_dir = _serve(tmp_path / "greedy", common)
    doc = validate.validate(run_dir, recorded=True)
    assert doc["exact_replay_expected"] is False
    assert doc["not_exact_because"].startswith("prefix caching and 10 request(s) whose prompt")
    run_dir = _serve(tmp_path / "sampled", [*common, "workload.temperature=1.0"])
    doc = validate.validate(run_dir, recorded=True)
    assert doc["exact_replay_expected"] is True and "not_exact_because" not in doc
    assert all(r["rel_err"] == 0.0 for r in doc["comparison"]), doc["comparison"]
    rows = {r["metric"]: r for r in doc["comparison"]}  # the prefix cache's side is compared
    assert rows["prefix_cache_hit_pct"]["engine"] == doc["engine"]["prefix_cache_hit_pct"] > 0


@pytest.mark.parametrize("top_k", [1, -1])
def test_a_recorded_replay_says_parallel_samples_drawn_alike_need_not_match(
    tmp_path: Path, top_k: int
) -> None:
    """vllm_v1 (prefix caching on) with 8 requests of 2 samples each into 19 blocks, so
    groups are preempted by recompute: with top-k 1 a request's samples generate the same
    tokens, and the re-admitted group shares one sample's cached blocks in the engine, not
    in the simulator (the replay ran out of recorded steps, with no reason given, before).
    Sampled with top-k off they draw apart and the replay is exact."""
    from core.request import Request, SamplingParams
    from core.workload.trace_io import write_trace

    sampling = SamplingParams(n=2, temperature=1.0, top_k=top_k)
    ids = [tuple((7 * i + 3 * k) % 500 + 5 for k in range(40 + 7 * i)) for i in range(8)]
    write_trace(tmp_path / "t.csv", [Request(i, 0.0, len(p), 40, sampling, p) for i, p in
                                     enumerate(ids)])  # fmt: skip
    run_dir = serve_run(tmp_path / "run", [
        "model=tiny-opt", "system=vllm_v1", "workload=trace", f"workload.path={tmp_path}/t.csv",
        "mode=offline", "kv_cache_gb=0.0003", "progress=false",
    ])  # fmt: skip
    assert pd.read_csv(run_dir / "requests.csv")["num_preemptions"].sum() > 0
    if top_k == -1:
        doc = validate.validate(run_dir, recorded=True)
        assert doc["exact_replay_expected"] is True and "not_exact_because" not in doc
        return
    try:
        doc = validate.validate(run_dir, recorded=True)
    except ConfigError as err:  # the replay parted from the recording: it says why it may
        assert "8 request(s)" in str(err) and "parallel samples are alike" in str(err)
    else:
        assert doc["exact_replay_expected"] is False
        assert "parallel samples are alike" in doc["not_exact_because"]


def test_a_replay_offers_the_rate_over_the_runs_own_arrival_window(tmp_path: Path) -> None:
    """A run drawn over ``duration_s`` offers its requests over that window, not up to its
    last arrival; the simulator's ``offered_rate`` in ``validation.json`` is over the same
    window (it was over the span to the last arrival)."""
    run_dir = _serve(tmp_path, ["workload.num_requests=null", "workload.duration_s=0.5"])
    out = tmp_path / "validation.json"
    assert validate.main([str(run_dir), "--recorded", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    n = doc["engine"]["num_requests"]
    assert doc["engine"]["offered_rate"] == pytest.approx(n / 0.5)
    assert doc["simulator"]["offered_rate"] == doc["engine"]["offered_rate"]


def test_tables_out_writes_the_simulators_tables_beside_the_engines(
    online_run: Path, tmp_path: Path, capsys
) -> None:
    """``--tables-out`` writes the replay's steps.csv and requests.csv in the run's own
    columns (less the engine's timings of its phases); an exact replay's plan columns equal
    the engine's row for row. The run
    directory itself is refused (its tables would be overwritten), in one line."""
    tables = tmp_path / "sim"
    out = tmp_path / "validation.json"
    assert validate.main([str(online_run), "--recorded", "--out", str(out),
                          "--tables-out", str(tables)]) == 0  # fmt: skip
    for name in ("steps.csv", "requests.csv"):
        engine, sim = pd.read_csv(online_run / name), pd.read_csv(tables / name)
        assert set(sim.columns) <= set(engine.columns), name
        assert len(sim) == len(engine), name
    engine, sim = pd.read_csv(online_run / "steps.csv"), pd.read_csv(tables / "steps.csv")
    plan = ["prefill_seqs", "prefill_tokens", "decode_seqs", "decode_ctx_tokens", "kv_free"]
    assert sim[plan].equals(engine[plan])
    before = (online_run / "steps.csv").read_bytes()
    with pytest.raises(SystemExit) as exit_:
        validate.main([str(online_run), "--recorded", "--out", str(out),
                       "--tables-out", str(online_run)])  # fmt: skip
    assert exit_.value.code == 2
    assert "--tables-out" in capsys.readouterr().err
    assert (online_run / "steps.csv").read_bytes() == before
