"""A scheduler's plan is held to ``BaseScheduler.plan_problem`` when it is a plugin's: a step
no body can run right (a sequence twice, one not running or holding no KV, a decode before
its prefill, too many sequences or tokens, a CPU block swapped in and out at once) stops
the run with one line naming ``system.plugin``, in the simulator and the engine; and the
plugin checks around it."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.loop import PlanError, StepLoop
from core.metrics.recorder import Recorder
from core.plan import PrefillChunk, StepPlan
from core.request import Request, SequenceStatus
from core.sched.base import SchedulerConfig
from core.sched.vllm import VLLMScheduler
from core.systems import build_scheduler
from experiments import serve, simulate
from sim.driver import CostExecutor
from tests.test_config_errors import SERVE_SMALL, SIM_SMALL, run_cli

CONFIG = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=32)


def running_vllm(prompts: list[int]) -> tuple[VLLMScheduler, StepPlan]:
    """A vLLM scheduler whose first plan admitted requests of ``prompts`` tokens."""
    sched = build_scheduler("vllm", 256, CONFIG, block_size=4)
    assert isinstance(sched, VLLMScheduler)
    for i, n in enumerate(prompts):
        sched.add(Request(i, 0.0, n, 4), 0.0)
    return sched, sched.schedule(0.0)


def test_a_shipped_schedulers_plan_has_no_problem() -> None:
    sched, plan = running_vllm([8, 8])
    assert plan.prefill and sched.plan_problem(plan) is None


def test_each_impossible_plan_is_named() -> None:
    sched, plan = running_vllm([8, 8])
    first, second = plan.prefill
    twice = StepPlan(prefill=[first, first])
    assert "scheduled twice" in str(sched.plan_problem(twice))
    late = StepPlan(prefill=[PrefillChunk(first.seq, 2, 6)])
    assert "does not start at its 0 computed" in str(sched.plan_problem(late))
    empty = StepPlan(prefill=[PrefillChunk(first.seq, 0, 0)])
    assert "is empty" in str(sched.plan_problem(empty))
    past = StepPlan(prefill=[PrefillChunk(first.seq, 0, 9)])
    assert "ends past its 8 tokens" in str(sched.plan_problem(past))
    early = StepPlan(decode=[first.seq])
    assert "decoded before its prefill" in str(sched.plan_problem(early))
    second.seq.status = SequenceStatus.WAITING
    assert "with status WAITING" in str(sched.plan_problem(StepPlan(prefill=[second])))


def test_a_sequence_without_kv_or_short_of_slots_is_named() -> None:
    sched, plan = running_vllm([8])
    (chunk,) = plan.prefill
    sched.manager.free(chunk.seq.seq_id)
    assert "holds no KV" in str(sched.plan_problem(plan))
    sched, plan = running_vllm([8])
    (chunk,) = plan.prefill
    chunk.seq.num_computed = chunk.seq.num_tokens  # as if prefilled; its token 9 has no slot
    chunk.seq.num_generated = 1
    decode = StepPlan(decode=[chunk.seq])
    slots = sched.manager.num_slots(chunk.seq.seq_id)
    assert slots == 8 and "writes token 9 into 8 KV slots" in str(sched.plan_problem(decode))


def test_limits_are_checked_with_one_group_over_the_budget_allowed() -> None:
    sched, plan = running_vllm([8, 8, 8, 8])
    assert len(plan.prefill) == 4 and sched.plan_problem(plan) is None
    sched.config = SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=32, max_model_len=32)
    assert "4 sequences, over max_num_seqs 3" in str(sched.plan_problem(plan))
    sched.config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=16)
    assert "32 tokens, over max_num_batched_tokens 16" in str(sched.plan_problem(plan))
    # one group that can never fit the budget (vLLM's recompute of a wide group) goes alone
    assert sched.plan_problem(StepPlan(prefill=plan.prefill[:1])) is None


def test_a_cpu_block_swapped_in_and_out_in_one_step_is_named() -> None:
    sched, plan = running_vllm([8])
    plan.swap_out = [(3, 7), (4, 8)]  # (device, cpu)
    assert sched.plan_problem(plan) is None
    plan.swap_in = [(9, 5), (8, 6)]  # (cpu, device): CPU block 8 is written and read
    assert "CPU block(s) [8] both swapped in and swapped out" in str(sched.plan_problem(plan))


def test_a_code_of_what_holds_the_queue_outside_held_by_is_named() -> None:
    # the metrics split free memory by the code: one outside 0-4 would count in
    # kv_free_at_limit_pct and in none of its parts
    sched, plan = running_vllm([8])
    for code in range(5):
        plan.queue_held_by = code
        assert sched.plan_problem(plan) is None
    plan.queue_held_by = 5
    assert "queue_held_by 5 is not one of core.plan.HELD_BY_* (0 memory, 1 max_num_seqs" in str(
        sched.plan_problem(plan)
    )


class _DecodesTwice(VLLMScheduler):
    name = "t_decodes_twice"

    def schedule(self, now: float) -> StepPlan:
        plan = super().schedule(now)
        plan.decode += plan.decode
        return plan


def test_the_loop_checks_a_plugins_plans_and_not_the_shipped_ones() -> None:
    plugin = _DecodesTwice(build_scheduler("vllm", 64, CONFIG, block_size=4).manager, CONFIG)
    loop = StepLoop(plugin, CostExecutor(lambda shape: 0.01, None), Recorder())
    assert loop.check_plans
    shipped = build_scheduler("vllm", 64, CONFIG, block_size=4)
    assert not StepLoop(shipped, CostExecutor(lambda shape: 0.01, None), Recorder()).check_plans
    loop.add(Request(0, 0.0, 4, 3), 0.0)
    pending = loop.begin(0.0)  # the prefill: one chunk, nothing to list twice
    assert pending is not None
    loop.finish(pending, pending.end)
    with pytest.raises(PlanError, match=r"t_decodes_twice planned a step no body can run: .*twice"):
        loop.begin(pending.end)  # its first decode, listed twice


def test_a_plan_no_body_can_run_names_its_step() -> None:
    # the message named the problem but not the step, unlike the integrity and KV misuse
    # errors beside it ("after step N", "at step N")
    plugin = _DecodesTwice(build_scheduler("vllm", 64, CONFIG, block_size=4).manager, CONFIG)
    loop = StepLoop(plugin, CostExecutor(lambda shape: 0.01, None), Recorder())
    loop.add(Request(0, 0.0, 4, 3), 0.0)
    pending = loop.begin(0.0)
    assert pending is not None
    loop.finish(pending, pending.end)
    with pytest.raises(PlanError, match=r"twice.* \(step 1\)$"):
        loop.begin(pending.end)


PLUGIN_SOURCE = """
from core.sched.vllm import VLLMScheduler
from core.systems import SystemSpec, register_system


class DecodesTwice(VLLMScheduler):
    name = "t_twice_cli"

    def schedule(self, now):
        plan = super().schedule(now)
        plan.decode += plan.decode
        return plan


register_system(SystemSpec("t_twice_cli", DecodesTwice, "paged"))
"""


def run_plugin(app: str, source: str, module: str, system: str, tmp_path: Path, monkeypatch,
               *extra: str) -> list[str]:  # fmt: skip
    """The stderr lines of ``app`` run on a small workload with the plugin ``module`` of
    ``source`` (written to ``tmp_path``) and its ``system``; it must exit with status 2."""
    if app == "serve":
        pytest.importorskip("torch")
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    cli, small = (simulate, SIM_SMALL) if app == "simulate" else (serve, SERVE_SMALL)
    args = [*small, f"system.plugin={module}", f"system.name={system}", *extra]
    status, _, err = run_cli(cli, args, tmp_path)
    assert status == 2, err
    return err.strip().splitlines()


@pytest.mark.parametrize("app", ["simulate", "serve"])
def test_an_impossible_plan_stops_the_run_in_one_line(tmp_path: Path, monkeypatch, app) -> None:
    # it ran to the end: decodes listed twice halved the latency (simulator) or the steps
    # (engine), exit status 0, no word
    lines = run_plugin(app, PLUGIN_SOURCE, "t_twice_plugin", "t_twice_cli", tmp_path, monkeypatch)
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: system.plugin: the policy of plugin 't_twice_plugin'")
    assert "is scheduled twice" in lines[0]


def test_a_plugin_that_registers_nothing_says_so(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "t_registers_none.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    args = [*SIM_SMALL, "system.plugin=t_registers_none", "system.name=forgot"]
    status, _, err = run_cli(simulate, args, tmp_path)
    assert status == 2 and "plugin 't_registers_none' registered none" in err


def test_a_plugin_without_its_system_name_is_refused(tmp_path: Path) -> None:
    # the plugin loaded and the built-in vllm ran in its place, without a word
    status, _, err = run_cli(simulate, [*SIM_SMALL, "system.plugin=tests.policy_plugin"], tmp_path)
    assert status == 2
    assert "error: system.name: plugin 'tests.policy_plugin' registers vllm_spf" in err


TWO_QUEUES_SOURCE = """
from core.sched.vllm import VLLMScheduler
from core.systems import SystemSpec, register_system


class TwoQueues(VLLMScheduler):
    name = "t_two_queues"

    def update(self, plan, outcome, now):
        finished = super().update(plan, outcome, now)
        if self.running and not self.waiting:
            self.waiting.append(self.running[0])  # also left in running
        return finished


register_system(SystemSpec("t_two_queues", TwoQueues, "paged"))
"""


@pytest.mark.parametrize("app", ["simulate", "serve"])
def test_integrity_checks_from_the_command_line(tmp_path: Path, monkeypatch, app) -> None:
    # the invariant checks ran only through the Python API
    lines = run_plugin(app, TWO_QUEUES_SOURCE, "t_two_queues_plugin", "t_two_queues", tmp_path,
                       monkeypatch, "check_integrity_every=1")  # fmt: skip
    assert len(lines) == 1, lines
    assert "scheduler t_two_queues after step 1: Sequence(id=0" in lines[0]
    assert "in waiting has status SequenceStatus.RUNNING" in lines[0]


def test_a_name_taken_by_another_plugin_names_that_plugin(tmp_path: Path, monkeypatch) -> None:
    # two versions of a policy under one name, swept in one process: the second job's line
    # did not say which plugin held the name
    for module in ("t_dup_a", "t_dup_b"):
        (tmp_path / f"{module}.py").write_text(PLUGIN_SOURCE.replace("t_twice_cli", "t_dup"))
    monkeypatch.syspath_prepend(str(tmp_path))
    status, _, err = run_cli(simulate, [*SIM_SMALL, "system.plugin=t_dup_a",
                                        "system.name=t_dup", "check_integrity_every=1",
                                        "workload.num_requests=1"], tmp_path)  # fmt: skip
    assert status == 2 and "is scheduled twice" in err  # its own policy's fault, once loaded
    status, _, err = run_cli(simulate, [*SIM_SMALL, "system.plugin=t_dup_b",
                                        "system.name=t_dup"], tmp_path)  # fmt: skip
    assert status == 2
    assert "is taken by another registered system (from plugin 't_dup_a')" in err


def test_a_policy_that_never_frees_is_named_as_a_leak() -> None:
    # it ended as a stall ("scheduled nothing") that did not point at the leak
    from core.loop import IntegrityError

    class NeverFrees(VLLMScheduler):
        name = "t_never_frees"

        def _finish(self, group, now, step):
            free, self.manager.free = self.manager.free, lambda seq_id: None
            try:
                super()._finish(group, now, step)
            finally:
                self.manager.free = free

    sched = NeverFrees(build_scheduler("vllm", 64, CONFIG, block_size=4).manager, CONFIG)
    loop = StepLoop(sched, CostExecutor(lambda shape: 0.01, None), Recorder(), check_every=1)
    loop.add(Request(0, 0.0, 4, 2), 0.0)
    with pytest.raises(IntegrityError, match=r"KV held by sequences not running or swapped: \[0\]"):
        while (pending := loop.begin(0.0)) is not None:
            loop.finish(pending, pending.end)


def test_a_policy_that_frees_a_held_block_fails_the_integrity_check() -> None:
    # the KV manager's own checks raise KVCacheError, which escaped as a traceback (status
    # "failed", no step, no plugin named) instead of the IntegrityError a failed check is
    from core.loop import IntegrityError

    class FreesAHeldBlock(VLLMScheduler):
        name = "t_frees_a_held_block"

        def _finish(self, group, now, step):
            for g in self.running:
                if g is not group and g.finish_time is None:
                    pool = self.manager.device_pool
                    pool.decref(self.manager.block_table(g.live_seqs()[0].seq_id)[0])
                    break
            super()._finish(group, now, step)

    sched = FreesAHeldBlock(build_scheduler("vllm", 64, CONFIG, block_size=4).manager, CONFIG)
    loop = StepLoop(sched, CostExecutor(lambda shape: 0.01, None), Recorder(), check_every=1)
    loop.add(Request(0, 0.0, 4, 2), 0.0)
    loop.add(Request(1, 0.0, 4, 8), 0.0)
    with pytest.raises(IntegrityError, match=r"t_frees_a_held_block after step \d+: seq 1"):
        while (pending := loop.begin(0.0)) is not None:
            loop.finish(pending, pending.end)


def test_a_scheduler_is_called_by_its_registered_name() -> None:
    # a subclass that set no name of its own said "scheduler vllm" in its errors
    assert build_scheduler("vllm_v1", 64, CONFIG, block_size=4).name == "vllm_v1"
    assert build_scheduler("orca_pow2", 64, CONFIG, block_size=4).name == "orca_pow2"


FREES_TWICE_SOURCE = """
from core.sched.vllm import VLLMScheduler
from core.systems import SystemSpec, register_system


class FreesTwice(VLLMScheduler):
    name = "t_frees_twice"

    def _finish(self, group, now, step):
        table = [self.manager.block_table(s.seq_id) for s in group.live_seqs()]
        super()._finish(group, now, step)
        for blocks in table:
            self.manager.device_pool.decref(blocks[0])  # freed already


register_system(SystemSpec("t_frees_twice", FreesTwice, "paged"))
"""


@pytest.mark.parametrize("app", ["simulate", "serve"])
def test_a_plugin_that_frees_a_block_twice_stops_in_one_line(
    tmp_path: Path, monkeypatch, app
) -> None:
    # the pool's KVCacheError escaped the step loop as a traceback, status "failed"
    lines = run_plugin(app, FREES_TWICE_SOURCE, "t_frees_twice_plugin", "t_frees_twice",
                       tmp_path, monkeypatch)  # fmt: skip
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: system.plugin: the policy of plugin 't_frees_twice_plugin'")
    assert "scheduler t_frees_twice in update at step" in lines[0]
    assert "its KV-cache manager refused a call" in lines[0]


def test_a_policy_that_misuses_its_manager_in_schedule_is_named_with_the_verb() -> None:
    # only update's path was covered: a KVCacheError out of schedule stays a KVMisuseError
    from core.loop import KVMisuseError

    class FreesAStranger(VLLMScheduler):
        name = "t_frees_a_stranger"

        def schedule(self, now):
            self.manager.free(987654)  # no such sequence
            return super().schedule(now)

    sched = FreesAStranger(build_scheduler("vllm", 64, CONFIG, block_size=4).manager, CONFIG)
    loop = StepLoop(sched, CostExecutor(lambda shape: 0.01, None), Recorder())
    loop.add(Request(0, 0.0, 4, 2), 0.0)
    with pytest.raises(KVMisuseError, match=r"t_frees_a_stranger in schedule at step 0"):
        loop.begin(0.0)


class _ReturnsNothing(VLLMScheduler):
    name = "t_returns_nothing"

    def schedule(self, now: float) -> StepPlan:
        super().schedule(now)  # forgot to return it
        return None  # type: ignore[return-value]


def test_a_schedule_that_returns_no_plan_is_named_as_such() -> None:
    # it was an AttributeError deep in the loop ('NoneType' object has no attribute
    # 'is_empty'), a traceback, not the one line naming system.plugin
    plugin = _ReturnsNothing(build_scheduler("vllm", 64, CONFIG, block_size=4).manager, CONFIG)
    loop = StepLoop(plugin, CostExecutor(lambda shape: 0.01, None), Recorder())
    loop.add(Request(0, 0.0, 4, 3), 0.0)
    with pytest.raises(PlanError, match=r"t_returns_nothing's schedule returned NoneType, not"):
        loop.begin(0.0)
