"""A KV-cache manager of one's own, as a plugin (``core.systems.SystemSpec.manager``): every
body builds it, it changes the memory breakdown as predicted in the simulator and the engine
alike (their schedules equal), its growth verbs are what both bodies call, a leak is caught
by the invariant checks, and registration refuses a manager of the wrong kind."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest

from core.kv.base import KVCacheError, MemoryBreakdown
from core.kv.contiguous import ContiguousKVCacheManager
from core.kv.paged import PagedKVCacheManager
from core.loop import IntegrityError, KVMisuseError
from core.request import Request, SequenceGroup
from core.sched.base import SchedulerConfig
from core.sched.fastertransformer import FasterTransformerScheduler
from core.sched.orca import OrcaScheduler
from core.sched.vllm import VLLMScheduler
from core.systems import (
    SYSTEMS,
    SystemConfigError,
    SystemSpec,
    build_scheduler,
    load_plugin,
    register_system,
)
from sim.driver import SimulationError
from sim.driver import simulate as simulate_requests
from tests.test_config_errors import run_cli
from tests.test_plan_checks import run_plugin

CONFIG = SchedulerConfig(max_model_len=128, max_num_batched_tokens=512, max_num_seqs=64)
BS = 4
# all at once into 48 blocks of 4 slots: the prompts alone need 60, so some wait for memory
REQUESTS = [Request(i, 0.0, 8 + 4 * (i % 5), 12 + 3 * (i % 4)) for i in range(16)]


class Flat:
    def step_time(self, shape) -> float:
        return 0.01

    def describe(self) -> str:
        return "10 ms a step"


@pytest.fixture
def plugin() -> Iterator[ModuleType]:
    """``tests.kv_plugin`` loaded (its systems registered), and gone again afterwards: other
    test modules list ``SYSTEMS`` (an import at this module's top would add to their lists)."""
    import core.systems as systems

    load_plugin("tests.kv_plugin")
    yield sys.modules["tests.kv_plugin"]
    for name in ("vllm_wm25", "orca_margin"):
        SYSTEMS.pop(name, None)
        systems._PLUGIN_OF.pop(name, None)
    sys.modules.pop("tests.kv_plugin", None)


def steps_of(system: str, blocks: int = 48, fast_forward: bool = True) -> pd.DataFrame:
    """The steps of REQUESTS on ``system`` over ``blocks`` blocks, checked every step."""
    result = simulate_requests(
        REQUESTS,
        lambda: build_scheduler(system, blocks * BS, CONFIG, block_size=BS),
        Flat(),
        check_integrity_every=1,
        fast_forward=fast_forward,
    )
    assert result.recorder.requests_frame()["finish_s"].notna().all()
    return result.recorder.steps_frame()


def test_every_body_builds_the_plugins_manager(plugin: ModuleType) -> None:
    # build_scheduler is what the simulator, validate and capacity (experiments.lib.setup's
    # scheduler_factory) and the engine (LLMEngine.reset) build their managers through
    from core.loop import StepLoop
    from core.metrics.recorder import Recorder
    from experiments.lib.setup import build_setup
    from experiments.reproduce import compose_config

    QuarterWatermark, OracleMargin = plugin.QuarterWatermark, plugin.OracleMargin
    assert type(build_scheduler("vllm_wm25", 64 * BS, block_size=BS).manager) is QuarterWatermark
    setup = build_setup(compose_config(["system.plugin=tests.kv_plugin", "system.name=vllm_wm25",
                                        "workload.num_requests=3", "index=null"]))  # fmt: skip
    assert type(setup.make_scheduler().manager) is QuarterWatermark
    setup = build_setup(compose_config(["system=orca_oracle", "system.plugin=tests.kv_plugin",
                                        "system.name=orca_margin", "workload.num_requests=3",
                                        "index=null"]))  # fmt: skip
    assert type(setup.make_scheduler().manager) is OracleMargin
    # a plugin's manager has the plans it is given checked, as a plugin's scheduler has
    for system, checked in (("vllm_wm25", True), ("vllm", False)):
        loop = StepLoop(build_scheduler(system, 64 * BS, block_size=BS), None, Recorder())  # type: ignore[arg-type]
        assert loop.check_plans is checked
    pytest.importorskip("torch")
    from engine.engine import LLMEngine
    from sim.catalog import get_model

    engine = LLMEngine(get_model("tiny-opt"), system="vllm_wm25", num_blocks=16, block_size=BS)
    assert type(engine.scheduler.manager) is QuarterWatermark


def test_a_larger_watermark_keeps_a_quarter_free_after_every_admission(plugin: ModuleType) -> None:
    # vLLM v0 admits in prompt-only steps, each leaving the watermark free: the plugin's is a
    # quarter of the 48 blocks; vLLM's 1% rounds down to none on a cache under 100 blocks
    quarter = 48 // 4 * BS
    ours, vllm = steps_of("vllm_wm25"), steps_of("vllm")
    admitting = ours[ours["prefill_tokens"] > 0]
    assert len(admitting) > 1 and (admitting["kv_free"] >= quarter).all()
    assert (vllm.loc[vllm["prefill_tokens"] > 0, "kv_free"] < quarter).any()
    # fewer prompts at once: the free memory the queue's head waits for is larger
    waiting = ours["num_waiting"] > 0
    assert ours.loc[waiting, "kv_free"].mean() > vllm.loc[vllm["num_waiting"] > 0, "kv_free"].mean()
    assert ours.equals(steps_of("vllm_wm25", fast_forward=False))


def test_a_reservation_margin_is_internal_fragmentation_of_its_size(plugin: ModuleType) -> None:
    # Orca (Oracle) reserves the true length: no internal fragmentation; the plugin's 16 more
    # slots a sequence are exactly that much of it in every step
    ours, oracle = steps_of("orca_margin", 128), steps_of("orca_oracle", 128)
    assert (oracle["kv_internal_frag"] == 0).all()
    assert (ours["kv_internal_frag"] == plugin.OracleMargin.MARGIN * ours["running_requests"]).all()
    assert ours["running_requests"].max() > 1
    assert ours.equals(steps_of("orca_margin", 128, fast_forward=False))


class _CountsAppends(PagedKVCacheManager):
    """Paged blocks, every append counted (a growth verb of its own)."""

    appends = 0

    def append(self, group: SequenceGroup) -> list[tuple[int, int]]:
        type(self).appends += 1
        return super().append(group)


class _UnfilledIsReserved(PagedKVCacheManager):
    """Counts the unfilled slots of allocated blocks as reserved, not internal
    fragmentation (a breakdown of its own)."""

    def breakdown(self) -> MemoryBreakdown:
        parts = super().breakdown()
        return dataclasses.replace(
            parts, reserved=parts.reserved + parts.internal_frag, internal_frag=0
        )


class _MaxUnfilledIsReserved(ContiguousKVCacheManager):
    """Counts the slots a reservation holds beyond the true length as reserved."""

    def breakdown(self) -> MemoryBreakdown:
        parts = super().breakdown()
        return dataclasses.replace(
            parts, reserved=parts.reserved + parts.internal_frag, internal_frag=0
        )


@pytest.mark.parametrize(
    "spec",
    [
        SystemSpec("t_own_growth", VLLMScheduler, "paged", manager=_CountsAppends),
        SystemSpec("t_own_growth", VLLMScheduler, "paged", manager=_UnfilledIsReserved),
        SystemSpec("t_own_growth", OrcaScheduler, "contiguous", "max",
                   manager=_MaxUnfilledIsReserved),
    ],
    ids=lambda spec: spec.manager.__name__,
)  # fmt: skip
def test_a_managers_own_growth_verbs_are_called_in_every_step(spec: SystemSpec) -> None:
    # the shipped managers grow by try_append, append_all and the simulator's lockstep runs,
    # which did the work inline: a subclass's append was never called, and the steps run at
    # once recorded the shipped breakdown, not its own
    register_system(spec)
    try:
        _CountsAppends.appends = 0
        fast = steps_of("t_own_growth", 128)
        if spec.manager is _CountsAppends:
            assert _CountsAppends.appends >= REQUESTS[0].output_len
        else:
            assert (fast["kv_internal_frag"] == 0).all() and (fast["kv_reserved"] > 0).any()
        assert fast.equals(steps_of("t_own_growth", 128, fast_forward=False))
    finally:
        SYSTEMS.pop("t_own_growth", None)


LEAKY_SOURCE = """
from core.kv.paged import PagedKVCacheManager
from core.sched.vllm import VLLMScheduler
from core.systems import SystemSpec, register_system


class LeaksABlock(PagedKVCacheManager):
    def free(self, seq_id):
        if not self.is_swapped(seq_id):  # keeps its first block referenced: a leak
            self.device_pool.incref(self.block_table(seq_id)[0])
        super().free(seq_id)


register_system(SystemSpec("t_leaky", VLLMScheduler, "paged", manager=LeaksABlock))
"""


def test_a_manager_that_leaks_a_block_is_caught_by_the_checks(tmp_path: Path, monkeypatch) -> None:
    lines = run_plugin("simulate", LEAKY_SOURCE, "t_leaky_plugin", "t_leaky", tmp_path,
                       monkeypatch, "check_integrity_every=1")  # fmt: skip
    assert len(lines) == 1, lines
    assert "error: system.plugin: the policy of plugin 't_leaky_plugin' failed" in lines[0]
    assert "scheduler t_leaky (KV manager LeaksABlock) after step" in lines[0]
    assert "has ref 1 but 0 tables hold it" in lines[0]
    try:  # unchecked, the leak runs to the end unseen
        result = simulate_requests(
            REQUESTS[:2], lambda: build_scheduler("t_leaky", 64 * BS, CONFIG, block_size=BS), Flat()
        )
        assert result.recorder.requests_frame()["finish_s"].notna().all()
        with pytest.raises(SimulationError) as caught:
            simulate_requests(
                REQUESTS[:2],
                lambda: build_scheduler("t_leaky", 64 * BS, CONFIG, block_size=BS),
                Flat(),
                check_integrity_every=1,
            )
        assert isinstance(caught.value.__cause__, IntegrityError)
    finally:
        import core.systems as systems

        SYSTEMS.pop("t_leaky", None)
        systems._PLUGIN_OF.pop("t_leaky", None)
        sys.modules.pop("t_leaky_plugin", None)


class _NotAManager:
    pass


class _TakesOtherArguments(PagedKVCacheManager):
    def __init__(self, blocks: int) -> None:
        super().__init__(blocks)


def test_registration_refuses_a_manager_of_the_wrong_kind(plugin: ModuleType) -> None:
    QuarterWatermark, OracleMargin = plugin.QuarterWatermark, plugin.OracleMargin
    cases = [
        (SystemSpec("t_mgr", VLLMScheduler, "paged", manager=_NotAManager),  # type: ignore[arg-type]
         "system 't_mgr': manager _NotAManager is not a PagedKVCacheManager subclass "
         "(kv='paged')"),
        (SystemSpec("t_mgr", VLLMScheduler, "paged", manager=OracleMargin),
         "manager OracleMargin is not a PagedKVCacheManager subclass"),
        (SystemSpec("t_mgr", OrcaScheduler, "contiguous", "oracle", manager=QuarterWatermark),
         "manager QuarterWatermark is not a ContiguousKVCacheManager subclass "
         "(kv='contiguous')"),
        (SystemSpec("t_mgr", VLLMScheduler, "paged", manager=QuarterWatermark(4)),  # type: ignore[arg-type]
         "manager <tests.kv_plugin.QuarterWatermark object"),
    ]  # fmt: skip
    for spec, says in cases:
        with pytest.raises(SystemConfigError) as caught:
            register_system(spec)
        assert says in str(caught.value) and "\n" not in str(caught.value)
    assert "t_mgr" not in SYSTEMS
    # the shipped class named outright is the shipped class
    register_system(
        SystemSpec("t_mgr", OrcaScheduler, "contiguous", manager=ContiguousKVCacheManager)
    )
    SYSTEMS.pop("t_mgr")
    # one that cannot be built from build_manager's arguments says so, naming itself
    register_system(SystemSpec("t_mgr", VLLMScheduler, "paged", manager=_TakesOtherArguments))
    try:
        with pytest.raises(SystemConfigError, match=r"system 't_mgr': manager _TakesOtherArgu"
                           r"ments cannot be built from build_manager's arguments \(num_device_"
                           r"blocks, .*\): TypeError: "):  # fmt: skip
            build_scheduler("t_mgr", 64)
    finally:
        SYSTEMS.pop("t_mgr", None)


def test_a_plugin_imported_before_it_is_loaded_owns_its_manager_systems(
    plugin: ModuleType, monkeypatch
) -> None:
    # its systems' schedulers are shipped classes: only the manager says whose they are
    import core.systems as systems

    monkeypatch.delitem(systems._PLUGIN_OF, "vllm_wm25")  # as after a plain import
    assert systems.plugin_of("vllm_wm25") is None
    load_plugin("tests.kv_plugin")
    assert systems.plugin_of("vllm_wm25") == "tests.kv_plugin"
    # a plugin imported again replaces its own systems; another manager under the name does not
    with pytest.raises(SystemConfigError, match="taken by another registered system"):
        register_system(SystemSpec("vllm_wm25", VLLMScheduler, "paged", manager=_CountsAppends))


TRACE = [Request(i, 0.0, p, o) for i, (p, o) in
         enumerate([(40, 24), (30, 16), (50, 20), (20, 12), (35, 28), (45, 18)])]  # fmt: skip


@pytest.mark.parametrize(
    "system", [["system.name=vllm_wm25"], ["system=orca_oracle", "system.name=orca_margin"]]
)
def test_the_same_manager_runs_in_the_engine_and_the_replay_agrees(
    plugin: ModuleType, tmp_path: Path, system: list[str]
) -> None:
    pytest.importorskip("torch")
    from core.workload.trace_io import write_trace
    from experiments import serve, validate

    write_trace(tmp_path / "t.csv", TRACE)
    args = [*system, "system.plugin=tests.kv_plugin", "workload=trace", "progress=false",
            f"workload.path={tmp_path / 't.csv'}", "mode=offline",
            "num_gpu_blocks=16", "threads=1", "step_timer=thread_cpu",
            "check_integrity_every=1"]  # fmt: skip
    status, _, err = run_cli(serve, args, tmp_path)
    assert status == 0, err
    steps = pd.read_csv(tmp_path / "run" / "steps.csv")
    if "system.name=vllm_wm25" in system:  # 16 blocks of 16: a quarter is 64 slots
        admitting = steps[steps["prefill_tokens"] > 0]
        assert len(admitting) > 1 and (admitting["kv_free"] >= 64).all()
    else:
        assert (steps["kv_internal_frag"] == 16 * steps["running_requests"]).all()
        assert steps["running_requests"].max() > 1
    out = tmp_path / "replay.json"
    assert validate.main([str(tmp_path / "run"), "--recorded", "--out", str(out)]) == 0
    schedule = json.loads(out.read_text())["schedule"]
    assert schedule["steps"] == len(steps) and "kv_free" in schedule["columns"]
    assert schedule["first_divergence"] is None and schedule["first_request_divergence"] is None


def test_the_readme_example_is_the_plugin_file() -> None:
    # shown in a plain block (a python block would run, registering its systems under a
    # module of no name in the test process): held to tests/kv_plugin.py's text instead
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### A KV-cache manager of your own") :]
    block = section[section.index("```\n") + 4 : section.index("\n```", section.index("```\n"))]
    assert "class QuarterWatermark(PagedKVCacheManager)" in block
    assert block in (root / "tests" / "kv_plugin.py").read_text(encoding="utf-8")


UNBUILDABLE_SOURCE = """
from core.kv.paged import PagedKVCacheManager
from core.sched.vllm import VLLMScheduler
from core.systems import SystemSpec, register_system


class NeedsOne(PagedKVCacheManager):
    def __init__(self, blocks):
        super().__init__(blocks)


register_system(SystemSpec("t_unbuildable", VLLMScheduler, "paged", manager=NeedsOne))
"""


@pytest.mark.parametrize("app", ["simulate", "serve"])
def test_a_manager_that_cannot_be_built_is_one_line(tmp_path: Path, monkeypatch, app) -> None:
    # serve let the engine's SystemConfigError through as a traceback
    import core.systems as systems

    try:
        lines = run_plugin(app, UNBUILDABLE_SOURCE, "t_unbuildable_plugin", "t_unbuildable",
                           tmp_path, monkeypatch)  # fmt: skip
        assert len(lines) == 1, lines
        assert lines[0].startswith("error: system: system 't_unbuildable': manager NeedsOne ")
        assert "TypeError: " in lines[0]
    finally:
        SYSTEMS.pop("t_unbuildable", None)
        systems._PLUGIN_OF.pop("t_unbuildable", None)
        sys.modules.pop("t_unbuildable_plugin", None)


class _HalfOutputReserved(ContiguousKVCacheManager):
    """Reserves the prompt and half the output: shorter than the true length (a plugin's
    mistake), so every sequence outgrows its region halfway through its output."""

    def reservation(self, request: Request) -> int:
        return request.prompt_len + request.output_len // 2


@pytest.mark.parametrize("scheduler", [OrcaScheduler, FasterTransformerScheduler])
def test_a_reservation_short_of_the_true_length_stops_the_simulator_as_step_by_step(
    scheduler: type[OrcaScheduler] | type[FasterTransformerScheduler],
) -> None:
    # the lockstep runs of decode steps held each sequence to its true length alone: run at
    # once, the sequences grew past their reservations to the end (in the engine they would
    # write into the regions beyond), while step by step, as the engine runs, the step that
    # outgrows a reservation stops the run; Orca's stop was a RuntimeError (a traceback),
    # not the manager's misuse named in one line, as FasterTransformer's
    register_system(
        SystemSpec("t_short", scheduler, "contiguous", "oracle", manager=_HalfOutputReserved)
    )
    try:
        said = []
        for fast_forward in (False, True):
            with pytest.raises(SimulationError) as caught:
                steps_of("t_short", 128, fast_forward=fast_forward)
            assert isinstance(caught.value.__cause__, KVMisuseError)
            said.append(str(caught.value))
        assert said[0] == said[1]
        assert "scheduler t_short (KV manager _HalfOutputReserved) in schedule at step" in said[0]
        assert "its reservation" in said[0]
    finally:
        SYSTEMS.pop("t_short", None)


def test_a_request_too_long_for_a_plugins_reservation_names_the_manager(plugin: ModuleType) -> None:
    # the intake's reason named the spec's policy ("the oracle policy reserves 76 slots"),
    # which reserves 60 here: the 76 are OracleMargin's
    request = Request(0, 0.0, 40, 20)
    for system, says in (("orca_oracle", None), ("orca_margin", "OracleMargin.reservation gives")):
        group = build_scheduler(system, 16 * BS, CONFIG, block_size=BS).add(request, 0.0)
        if says is None:
            assert group.reject_reason is None
            continue
        assert group.reject_reason is not None and "policy" not in group.reject_reason
        assert f"; {says} {request.total_len + 16} slots per sequence" in group.reject_reason
        assert group.reject_reason.endswith(", which the buddy allocator rounds up to 128")


class _TenPercentMore(ContiguousKVCacheManager):
    """A reservation 10% over the true length, left a float (a plugin's slip)."""

    def reservation(self, request: Request) -> int:
        return request.total_len * 1.1  # type: ignore[return-value]


def test_a_reservation_that_is_no_whole_number_of_slots_is_named() -> None:
    # the buddy allocator failed inside with "'float' object has no attribute 'bit_length'"
    register_system(SystemSpec("t_float", OrcaScheduler, "contiguous", manager=_TenPercentMore))
    try:
        with pytest.raises(SimulationError) as caught:
            steps_of("t_float", 128)
        assert isinstance(caught.value.__cause__, KVMisuseError)  # raised at intake
        assert isinstance(caught.value.__cause__.__cause__, KVCacheError)
        said = str(caught.value.__cause__.__cause__)
        assert said.startswith("_TenPercentMore.reservation gave 22.") and "(float)" in said
        assert "for request 0: a reservation is a whole number of slots, an int" in said
    finally:
        SYSTEMS.pop("t_float", None)


FLOAT_SOURCE = """
from core.kv.contiguous import ContiguousKVCacheManager
from core.sched.orca import OrcaScheduler
from core.systems import SystemSpec, register_system


class TenPercentMore(ContiguousKVCacheManager):
    def reservation(self, request):
        return request.total_len * 1.1


register_system(SystemSpec("t_float_cli", OrcaScheduler, "contiguous", manager=TenPercentMore))
"""


@pytest.mark.parametrize("app", ["simulate", "serve"])
def test_a_managers_error_at_intake_is_one_line(tmp_path: Path, monkeypatch, app) -> None:
    # raised at a request's intake (the scheduler asks can_allocate), a plugin's KVCacheError
    # left both apps with a traceback; in a step it was one line naming the plugin's manager
    import core.systems as systems

    try:
        lines = run_plugin(app, FLOAT_SOURCE, "t_float_plugin", "t_float_cli", tmp_path,
                           monkeypatch)  # fmt: skip
        assert len(lines) == 1, lines
        assert lines[0].startswith("error: system.plugin: the policy of plugin 't_float_plugin'")
        assert "scheduler t_float_cli (KV manager TenPercentMore) in add at step 0" in lines[0]
        assert "TenPercentMore.reservation gave " in lines[0] and "(float)" in lines[0]
    finally:
        SYSTEMS.pop("t_float_cli", None)
        systems._PLUGIN_OF.pop("t_float_cli", None)
        sys.modules.pop("t_float_plugin", None)
