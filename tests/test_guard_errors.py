"""Input guards no other test reached: each bad input gets its guard's error, naming the
key, file or row at fault.

Each is driven through the most public function that reaches it; the file inputs a run
reads (``cost.stack_path``, ``cost.profile``) are also run through the simulator's command
line, in-process and once as a real process per kind of file (one line, exit 2, no
traceback)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from core.loop import StallError
from core.request import Request, SamplingParams, SequenceGroup
from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_ref import TorchRefBackend
from engine.engine import EngineError
from engine.kv_cache import KVBudgetError, resolve_kv_budget
from engine.sampler import Sampler
from experiments import simulate
from sim.catalog import HardwareError, gpu_from_config, model_from_config
from sim.cost import build_cost_model
from sim.cost.allreduce import fit_allreduce, read_allreduce_table
from sim.cost.calibrated import check_calibration_doc
from sim.cost.efficiency import Efficiency
from sim.cost.overhead import A100_CPU_OVERHEAD, cpu_overhead_for_tp, read_cpu_overheads
from sim.cost.profile import read_profile, read_vidur_profile
from sim.cost.roofline import RooflineCostModel
from sim.cost.stack_file import fit_measured_overhead, load_stack_file, split_steps
from tests.engine_helpers import make_engine, one_torch_thread  # noqa: F401 (autouse fixture)
from tests.kv_helpers import spawn
from tests.test_allreduce import write_table
from tests.test_config_errors import REPO, SIM_SMALL, run_cli
from tests.test_cost_profiled import synthetic_rows, write_profile

VIDUR_A100 = REPO.parent / "shared/measurements/vidur/a100/mlp_llama-2-7b.csv"


# -- engine: attention reference, sampler, KV budget, step -----------------------------------
def _attn(**bad: object) -> tuple:
    """One sequence of 2 new tokens (4 q heads, 2 kv heads, dim 4) in a 2-block cache."""
    t = {
        "q": torch.zeros(2, 4, 4),
        "k": torch.zeros(2, 2, 4),
        "v": torch.zeros(2, 2, 4),
        "k_cache": torch.zeros(2, 4, 2, 4),
        "v_cache": torch.zeros(2, 4, 2, 4),
    }
    meta = {
        "query_start_loc": torch.tensor([0, 2], dtype=torch.int32),
        "context_lens": torch.tensor([2], dtype=torch.int32),
        "block_tables": torch.tensor([[0]], dtype=torch.int32),
        "slot_mapping": torch.tensor([0, 1]),
    }
    for key, value in bad.items():
        (t if key in t else meta)[key] = value
    m = AttentionMetadata(**meta, max_query_len=2, max_context_len=2)  # type: ignore[arg-type]
    return t["q"], t["k"], t["v"], t["k_cache"], t["v_cache"], m, 0.5


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"q": torch.zeros(2, 8)}, r"q, k, v must be \[T, heads, head_dim\]"),
        ({"v": torch.zeros(2, 2, 2)}, r"inconsistent shapes .*v \(2, 2, 2\)"),
        ({"q": torch.zeros(2, 3, 4)}, r"query heads \(3\) not a multiple of kv heads \(2\)"),
        ({"k_cache": torch.zeros(2, 4, 1, 4)}, r"cache shape \(2, 4, 1, 4\) does not match"),
        ({"query_start_loc": torch.tensor([0, 3], dtype=torch.int32)},
         r"metadata covers 3 tokens but q has 2"),
        ({"v_cache": torch.zeros(3, 4, 2, 4)}, r"k_cache \(2, 4, 2, 4\) and v_cache \(3, 4"),
        ({"k_cache": torch.zeros(4, 2, 2, 4).transpose(0, 1)}, r"must be contiguous"),
        ({"slot_mapping": torch.tensor([0])}, r"slot_mapping has shape \(1,\), expected \(2,\)"),
    ],
)  # fmt: skip
def test_the_reference_attention_refuses_inconsistent_inputs(bad: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TorchRefBackend().forward(*_attn(**bad))


def test_a_sequence_without_new_tokens_gets_no_output() -> None:
    # a second sequence with no query token in the batch is skipped, not attended for
    args = _attn(
        query_start_loc=torch.tensor([0, 2, 2], dtype=torch.int32),
        context_lens=torch.tensor([2, 1], dtype=torch.int32),
        block_tables=torch.tensor([[0], [1]], dtype=torch.int32),
    )
    assert TorchRefBackend().forward(*args).shape == (2, 4, 4)


def test_the_sampler_refuses_logits_of_another_batch_and_a_partial_beam_group() -> None:
    with pytest.raises(ValueError, match=r"logits \(1, 4\) do not match 0 sampling sequences"):
        Sampler().sample([], torch.zeros(1, 4))
    group = SequenceGroup(
        Request(7, 0.0, 3, 4, SamplingParams(beam_width=2), (1, 2, 3)), first_seq_id=0
    )
    spawn(group.seqs[0])  # the second beam, as the first step's fork makes it
    live = group.live_seqs()
    with pytest.raises(ValueError, match=r"request 7: 1 of its 2 beams sample this step"):
        Sampler().sample(live[:1], torch.zeros(1, 4))


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"fraction": 1.5}, r"fraction must be in \(0, 1\], got 1.5"),
     ({"gib": 0}, r"KV budget must be positive, got 0 bytes")],
)  # fmt: skip
def test_a_kv_budget_out_of_range_is_refused(kw: dict, match: str) -> None:
    with pytest.raises(KVBudgetError, match=match):
        resolve_kv_budget("cpu", **kw)


def test_a_scheduler_stall_in_one_step_becomes_an_engine_error(monkeypatch) -> None:
    engine = make_engine()

    def stall(_clock: object) -> None:
        raise StallError("scheduler vllm has 1 waiting ... but scheduled nothing")

    monkeypatch.setattr(engine.loop, "step", stall)
    with pytest.raises(EngineError, match=r"scheduler vllm has 1 waiting") as err:
        engine.step()
    assert isinstance(err.value.__cause__, StallError)


def test_an_empty_batch_runs_no_model() -> None:
    engine = make_engine()
    batch = type("B", (), {"input_ids": torch.empty(0, dtype=torch.long)})()
    logits = engine.runner.forward(batch)  # type: ignore[arg-type]
    assert logits.shape == (0, engine.model_config.vocab_size)


# -- simulator: cost-model arguments and documents ---------------------------------------------
@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: build_cost_model("profiled", "opt-13b", "a100-40gb", profile="p", efficiency={}),
         r"efficiency overrides apply to cost=roofline, not cost=profiled"),
        (lambda: build_cost_model("calibrated", "opt-13b", "a100-40gb"),
         r"calibrated cost model needs steps= \(to fit\) or coefficients="),
        (lambda: RooflineCostModel("opt-13b", "a100-40gb", block_size=0),
         r"block_size and dtype_bytes must be >= 1, got 0, 2"),
        (lambda: Efficiency(pcie_bandwidth=0), r"pcie_bandwidth must be positive, got 0"),
        (lambda: check_calibration_doc({"coefficients": {}, "model": "m", "gpu": 3}),
         r"^gpu: expected a name, got 3"),
        (lambda: check_calibration_doc({"coefficients": {}, "model": "m", "fit_stats": [1]}),
         r"^fit_stats: expected a mapping, got \[1\]"),
        (lambda: split_steps([], "thirds"), r"unknown split 'thirds'; known splits: "),
        (lambda: fit_measured_overhead([]), r"no runs to fit"),
        (lambda: model_from_config({}, "configs/model/x.yaml"),
         r"^configs/model/x.yaml: give model.name, model.shape or model.hf_config"),
        (lambda: model_from_config({}), r"^give model.name, model.shape or model.hf_config"),
    ],
)  # fmt: skip
def test_a_bad_cost_argument_or_document_names_it(build, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build()


def test_a_gpu_without_a_peer_link_names_the_key() -> None:
    cfg = {"name": "x", "memory_gb": 40, "mem_bandwidth_gbs": 1555, "peak_tflops": 312,
           "host_link_gbs": 32, "peer_link_gbs": 300}  # fmt: skip
    with pytest.raises(HardwareError, match=r"^x.yaml: GPU 'x' lacks peer_link") as err:
        gpu_from_config(cfg, "x.yaml")
    assert err.value.key == "peer_link"


def test_the_single_gpu_cpu_fit_is_the_tp1_row() -> None:
    assert cpu_overhead_for_tp(1, ray_workers=True) is A100_CPU_OVERHEAD[1]


# -- simulator: measured tables (CSV files) -----------------------------------------------------
def _kvlab_dir(tmp: Path, rows: list | None = None, header: str | None = None) -> Path:
    d = write_profile(tmp / "prof", synthetic_rows() if rows is None else rows)
    if header is not None:
        csv = d / "operator_profile.csv"
        csv.write_text(header + "\n" + csv.read_text().split("\n", 1)[1])
    return d


def _vidur(tmp: Path, gpu: str = "a100", edit=lambda f: f) -> Path:
    (tmp / gpu).mkdir(exist_ok=True)
    path = tmp / gpu / VIDUR_A100.name
    edit(pd.read_csv(VIDUR_A100)).to_csv(path, index=False)
    return path


TP = "num_tensor_parallel_workers"
DUPLICATE = [synthetic_rows()[0], ("linear", 1, 0, 0.6), *synthetic_rows()[1:]]  # rows 2, 3


@pytest.mark.parametrize(
    ("read", "match"),
    [
        (lambda t: read_profile((_kvlab_dir(t) / "operator_profile.csv").unlink() or t / "prof"),
         r"prof/operator_profile.csv: cannot read \(No such file or directory\)"),
        (lambda t: read_profile(_kvlab_dir(t, DUPLICATE)),
         r"operator_profile.csv: row 3: op linear sizes not increasing: \(1.0, 0.0\) again "
         r"\(row 2; each size is measured once\)"),
        (lambda t: read_profile(_kvlab_dir(t, header="op,num_tokens,context_tokens,ms")),
         r"operator_profile.csv: row 2: need op,num_tokens,context_tokens,time_ms \(no time_ms"),
        (lambda t: read_profile(_kvlab_dir(t, [*synthetic_rows()[:-1], ("lm_head", 9, 0, "x")])),
         r"operator_profile.csv: row \d+: time_ms is 'x', not a number"),
        (lambda t: read_vidur_profile(_vidur(t), tp=3),
         rf"mlp_llama-2-7b.csv: no rows with {TP} == 3"),
        (lambda t: read_vidur_profile(_vidur(t, gpu="v100")),
         r"mlp_llama-2-7b.csv: GPU directory 'v100' unknown; known: a100, h100"),
        (lambda t: read_vidur_profile(_vidur(t, edit=lambda f: f.drop(columns=[TP]))),
         rf"mlp_llama-2-7b.csv: row 2: no {TP} column"),
        (lambda t: read_vidur_profile(
            _vidur(t, edit=lambda f: f.drop(columns=["time_stats.mlp_act.median"]))),
         r"mlp_llama-2-7b.csv: row 2: bad or missing Vidur column .*time_stats.mlp_act.median"),
        (lambda t: read_allreduce_table(_edit(write_table(t / "ar.csv", 4e-5, 1e11), 4, "x")),
         r"ar.csv: row 2: time_stats.all_reduce.median is 'x' \(a finite number of ms > 0"),
        (lambda t: read_allreduce_table(_edit(write_table(t / "ar.csv", 4e-5, 1e11), 8, "two")),
         r"ar.csv: row 2: size is 'two' \(a whole number >= 1 expected\)"),
        (lambda t: read_cpu_overheads(_write(t / "cpu.csv", "model_name,batch_size\nm,x\n")),
         r"cpu.csv: row 2: bad or missing column"),  # the line, as csv_rows numbers rows
    ],
)  # fmt: skip
def test_a_bad_table_names_its_file_and_row(tmp_path: Path, read, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        read(tmp_path)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _edit(path: Path, column: int, value: str) -> Path:
    """``path`` with field ``column`` of its first data row set to ``value``."""
    lines = path.read_text().split("\n")
    fields = lines[1].split(",")
    fields[column] = value
    lines[1] = ",".join(fields)
    return _write(path, "\n".join(lines))


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"link_bandwidth": 0}, r"link_bandwidth must be > 0, got 0"),
     ({"link_bandwidth": 1e11, "small_max": 1e6, "large_min": 1e3},
      r"need 0 < small_max < large_min, got 1000000.0, 1000.0")],
)  # fmt: skip
def test_an_allreduce_fit_refuses_bad_bands(tmp_path: Path, kw: dict, match: str) -> None:
    table = read_allreduce_table(write_table(tmp_path / "ar.csv", 4e-5, 1e11))
    with pytest.raises(ValueError, match=match):
        fit_allreduce(table, **kw)


# -- the simulator's command line ---------------------------------------------------------------
def _stack_args(t: Path) -> list[str]:
    return ["cost.stack=measured", f"cost.stack_path={_write(t / 'stack.json', '{oops')}"]


def _profile_args(t: Path) -> list[str]:
    return ["cost=profiled", f"cost.profile={_kvlab_dir(t, DUPLICATE)}"]


CLI = [
    (_stack_args, r"error: cost.stack_path: \S*stack.json: not JSON \("),
    (lambda t: [*_stack_args(t)[:1], f"cost.stack_path={t / 'none.json'}"],
     r"error: cost.stack_path: \S*none.json: cannot read the stack file \(No such file"),
    (_profile_args, r"error: cost.profile: \S*operator_profile.csv: row \d+: op linear sizes"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "line"), CLI)
def test_a_bad_input_file_is_one_line_naming_key_and_file(tmp_path: Path, args, line) -> None:
    status, _, err = run_cli(simulate, [*SIM_SMALL, *args(tmp_path)], tmp_path)
    assert status == 2 and re.fullmatch(line + r".*", err.strip()), err
    with pytest.raises(ValueError, match=r"stack.json: not JSON"):
        load_stack_file(_write(tmp_path / "stack.json", "{oops"))


@pytest.mark.parametrize(("args", "line"), [CLI[0], CLI[2]])
def test_a_bad_input_file_in_a_real_process(tmp_path: Path, args, line) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    cmd = [sys.executable, "-m", "experiments.simulate", *SIM_SMALL, *args(tmp_path),
           f"hydra.run.dir={tmp_path / 'run'}", f"index={tmp_path / 'index.csv'}"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert re.fullmatch(line + r".*", proc.stderr.strip()), proc.stderr


def test_a_vidur_tp_written_as_a_float_reads_as_the_whole_number(tmp_path: Path) -> None:
    """``2.0`` passes the tp column's check as a whole number, so the rows at that tp are read
    (not refused as a bad column)."""
    (tmp_path / "int").mkdir()
    (tmp_path / "float").mkdir()
    plain = read_vidur_profile(_vidur(tmp_path / "int"), tp=1)
    as_float = read_vidur_profile(_vidur(tmp_path / "float", edit=lambda f: f.astype({TP: float})))
    assert plain.ops.keys() == as_float.ops.keys()
    for op, arrays in plain.ops.items():
        for a, b in zip(arrays, as_float.ops[op], strict=True):
            np.testing.assert_array_equal(a, b)
