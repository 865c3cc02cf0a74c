"""A policy of one's own, as a plugin (``core.systems.register_system``, ``system.plugin``):
it runs in the simulator and the engine alike, its registration is checked, and a plugin
that cannot be loaded is one line naming ``system.plugin``."""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import pytest

from core.kv.base import AllocStatus
from core.request import SequenceStatus
from core.sched.base import BaseScheduler
from core.sched.fastertransformer import FasterTransformerScheduler
from core.sched.orca import OrcaScheduler
from core.sched.vllm import VLLMScheduler
from core.systems import SYSTEMS, SystemConfigError, SystemSpec, register_system
from experiments import serve, simulate
from experiments.reproduce import compose_config
from tests.test_config_errors import SERVE_SMALL, SIM_SMALL, run_cli

PLUGIN = ["system.name=vllm_spf", "system.plugin=tests.policy_plugin"]


def test_a_plugin_policy_runs_in_the_simulator_and_changes_the_order() -> None:
    # everyone arrives at once into a cache that holds a fraction of them: shortest prompt
    # first lowers the mean time to first token, as it does on any such queue
    base = ["system=vllm", "workload.arrival=all_at_once", "workload.num_requests=200",
            "kv_cache_gb=2"]  # fmt: skip
    fcfs = simulate.run(compose_config(base))
    spf = simulate.run(compose_config([*base, *PLUGIN]))
    assert fcfs["completed"] == spf["completed"] == 200
    assert spf["mean_ttft_ms"] < fcfs["mean_ttft_ms"]


def test_the_same_plugin_runs_in_the_engine(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    status, out, err = run_cli(serve, [*SERVE_SMALL, *PLUGIN], tmp_path)
    assert status == 0, err
    assert "3/3 done" in out
    from tests.policy_plugin import ShortestPromptFirst

    assert SYSTEMS["vllm_spf"].scheduler is ShortestPromptFirst


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("system.plugin=no_such_module_here", "cannot be imported"),
        # where to put it was left to the README
        ("system.plugin=no_such_module_here", "on PYTHONPATH, or run from that folder"),
        ("system.plugin=1bad.name", "not a module name"),
    ],
)
def test_a_plugin_that_cannot_load_is_one_line(tmp_path: Path, override: str, says: str) -> None:
    status, _, err = run_cli(simulate, [*SIM_SMALL, override], tmp_path)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1, err
    assert lines[0].startswith("error: system.plugin: ") and says in lines[0]


def test_an_unknown_system_lists_the_known_ones(tmp_path: Path) -> None:
    status, _, err = run_cli(simulate, [*SIM_SMALL, "system.name=nope"], tmp_path)
    assert status == 2 and "unknown system" in err and "orca_oracle" in err


class _NoSchedule(BaseScheduler):
    name = "no_schedule"


def test_registration_refuses_what_no_body_could_run() -> None:
    with pytest.raises(SystemConfigError, match="taken by a built-in"):
        register_system(SystemSpec("vllm", OrcaScheduler, "contiguous"))
    with pytest.raises(SystemConfigError, match="not a BaseScheduler subclass"):
        register_system(SystemSpec("t_odd", object, "paged"))  # type: ignore[arg-type]
    with pytest.raises(SystemConfigError, match="not 'paged' or 'contiguous'"):
        register_system(SystemSpec("t_odd", VLLMScheduler, "buddy"))
    with pytest.raises(SystemConfigError, match="takes no reservation"):
        register_system(SystemSpec("t_odd", VLLMScheduler, "paged", "pow2"))
    with pytest.raises(SystemConfigError, match="is not one of"):
        register_system(SystemSpec("t_odd", OrcaScheduler, "contiguous", "half"))
    with pytest.raises(SystemConfigError, match="need paged KV"):
        register_system(SystemSpec("t_odd", OrcaScheduler, "contiguous", allocate_per_chunk=True))
    with pytest.raises(SystemConfigError, match="batch_defaults 'v2' is not one of v0, v1"):
        register_system(SystemSpec("t_odd", VLLMScheduler, "paged", batch_defaults="v2"))
    # pairings that ran and then crashed (AttributeError at once, or a pool exhausted under
    # memory pressure), and a scheduler with no schedule (NotImplementedError at step 1)
    with pytest.raises(SystemConfigError, match=r"runs over paged KV .*not contiguous"):
        register_system(SystemSpec("t_odd", VLLMScheduler, "contiguous", "max"))
    with pytest.raises(SystemConfigError, match="OrcaScheduler runs over contiguous KV"):
        register_system(SystemSpec("t_odd", OrcaScheduler, "paged"))
    with pytest.raises(SystemConfigError, match="FasterTransformerScheduler runs over contig"):
        register_system(SystemSpec("t_odd", FasterTransformerScheduler, "paged"))
    with pytest.raises(SystemConfigError, match="_NoSchedule defines no schedule"):
        register_system(SystemSpec("t_odd", _NoSchedule, "paged"))
    assert "t_odd" not in SYSTEMS
    spec = SystemSpec("t_orca_pow2_again", OrcaScheduler, "contiguous", "pow2")
    try:
        register_system(spec)
        register_system(spec)  # the same spec again: a no-op
        with pytest.raises(SystemConfigError, match="another registered system"):
            register_system(SystemSpec("t_orca_pow2_again", VLLMScheduler, "paged"))
    finally:
        SYSTEMS.pop("t_orca_pow2_again", None)


def test_a_plugin_failing_as_it_imports_is_one_line(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "kvlab_broken_plugin.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    status, _, err = run_cli(simulate, [*SIM_SMALL, "system.plugin=kvlab_broken_plugin"],
                             tmp_path)  # fmt: skip
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1, err
    assert "failed while importing: RuntimeError: boom" in lines[0]


def test_a_plugin_system_needs_its_plugin_in_every_job(tmp_path: Path) -> None:
    # a plugin another job of this process loaded does not stand in for this job's own
    status, _, err = run_cli(simulate, [*SIM_SMALL, *PLUGIN], tmp_path)
    assert status == 0, err
    status, _, err = run_cli(simulate, [*SIM_SMALL, "system.name=vllm_spf"], tmp_path)
    assert status == 2
    assert "error: system.plugin: system 'vllm_spf' comes from a plugin" in err
    assert "tests.policy_plugin" in err


def test_a_plugin_imported_again_replaces_its_own_systems() -> None:
    import importlib

    import tests.policy_plugin as plugin

    importlib.reload(plugin)  # a notebook's edit-and-reload
    assert SYSTEMS["vllm_spf"].scheduler is plugin.ShortestPromptFirst
    with pytest.raises(SystemConfigError, match="use letters, digits"):
        register_system(SystemSpec("a b/c", VLLMScheduler, "paged"))


class _TimeSlice(VLLMScheduler):
    """vLLM's paged policy plus a time slice: once someone waits, a running request that has
    made 4 tokens since it was last scheduled is preempted to the queue's back (a schedule
    of its own, with no decode_run of its own)."""

    name = "vllm_slice_test"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._slice_from: dict[int, int] = {}

    def schedule(self, now: float):
        if self.waiting:
            for group in list(self.running):
                since = self._slice_from.get(group.request_id, 0)
                if group.seqs[0].num_generated - since >= 4:
                    self.running.remove(group)
                    group.num_preemptions += 1
                    self._slice_from[group.request_id] = group.seqs[0].num_generated
                    for seq in group.live_seqs():
                        self.manager.free(seq.seq_id)
                        seq.num_computed = 0
                        seq.status = SequenceStatus.WAITING
                    self.waiting.append(group)
        return super().schedule(now)


class _SkipAhead(VLLMScheduler):
    """vLLM's paged policy whose admission lets a later request that fits pass a head that
    must wait for memory (a helper of ``schedule`` overridden, not ``schedule`` itself)."""

    name = "vllm_skip_test"

    def _next_admissible(self, first_chunk: int | None = None):
        head = super()._next_admissible(first_chunk)
        if head is not None or len(self.waiting) < 2:
            return head
        for i, group in enumerate(self.waiting):
            if self.manager.can_allocate(group, first_chunk) is AllocStatus.OK:
                del self.waiting[i]
                self.waiting.appendleft(group)
                return group
        return None


def test_a_plugin_that_writes_its_own_schedule_is_run_step_by_step() -> None:
    # the simulator's fast path runs stretches of plain decodes without calling schedule or
    # update; the promise is its parent's, so a plugin overriding either runs every step
    from core.request import Request
    from core.sched.base import SchedulerConfig
    from core.systems import build_scheduler
    from sim.driver import simulate as simulate_requests

    class Flat:
        def step_time(self, shape) -> float:
            return 0.01

        def describe(self) -> str:
            return "10 ms a step"

    calls = {"schedule": 0}

    class Counting(OrcaScheduler):
        name = "orca_counting_test"

        def schedule(self, now: float):
            calls["schedule"] += 1
            return super().schedule(now)

    assert VLLMScheduler.decode_run_applies() and OrcaScheduler.decode_run_applies()
    assert not Counting.decode_run_applies() and not _TimeSlice.decode_run_applies()
    assert not _SkipAhead.decode_run_applies()  # a helper of schedule's, overridden
    from tests.policy_plugin import ShortestPromptFirst

    assert ShortestPromptFirst.decode_run_applies()  # it orders the queue in add only
    register_system(SystemSpec("orca_counting_test", Counting, "contiguous", "oracle"))
    register_system(SystemSpec("vllm_slice_test", _TimeSlice, "paged"))
    try:
        config = SchedulerConfig(max_model_len=64, max_num_batched_tokens=64, max_num_seqs=64)
        counted = simulate_requests(
            [Request(0, 0.0, 8, 40)],
            lambda: build_scheduler("orca_counting_test", 256, config),
            Flat(),
        )
        assert counted.num_steps == 40 and calls["schedule"] == 41  # the last finds none

        def fast_and_slow(system: str, blocks: int, reqs: list[Request]) -> list:
            def make():
                return build_scheduler(system, blocks * 4, config, block_size=4, watermark=0.0)

            runs = [simulate_requests(reqs, make, Flat(), fast_forward=ff) for ff in (True, False)]
            assert runs[0].num_steps == runs[1].num_steps
            return [r.recorder.requests_frame() for r in runs]

        fast, slow = fast_and_slow(
            "vllm_slice_test", 26, [Request(i, 0.0, 8, 40) for i in range(3)]
        )
        assert fast.equals(slow)
        assert (slow["num_preemptions"] > 0).all()
        # a helper overridden (admission skips a head that must wait): every step too
        register_system(SystemSpec("vllm_skip_test", _SkipAhead, "paged"))
        reqs = [Request(0, 0.0, 20, 30), Request(1, 0.001, 48, 10), Request(2, 0.002, 4, 10)]
        fast, slow = fast_and_slow("vllm_skip_test", 16, reqs)
        assert fast.equals(slow)
        assert slow.set_index("request_id").loc[2, "first_scheduled_s"] < 0.1  # it skipped
    finally:
        SYSTEMS.pop("orca_counting_test", None)
        SYSTEMS.pop("vllm_slice_test", None)
        SYSTEMS.pop("vllm_skip_test", None)


def test_a_mixin_listed_after_a_shipped_scheduler_turns_the_fast_path_off() -> None:
    # the promise's class was found first in the MRO and only the classes before it were
    # read: a mixin after it that changes update kept the fast path, which skipped its update
    from core.sched.base import BaseScheduler

    class EndsAt64(BaseScheduler):
        def update(self, plan, outcome, now):
            return super().update(plan, outcome, now)

    class MixinLast(VLLMScheduler, EndsAt64):
        pass

    class MixinFirst(EndsAt64, VLLMScheduler):
        pass

    class SetUpOnly(VLLMScheduler, EndsAt64):
        update = VLLMScheduler.update  # the promiser's own, in effect: the promise holds

    assert not MixinLast.decode_run_applies()
    assert not MixinFirst.decode_run_applies()
    assert SetUpOnly.decode_run_applies()


def test_a_plugin_imported_before_it_is_loaded_is_still_its_systems_owner(monkeypatch) -> None:
    # a notebook imported the plugin first: load_plugin saw no new system, and its systems
    # counted as no plugin's, so a job naming them without system.plugin was not refused
    import core.systems as systems
    import tests.policy_plugin  # noqa: F401 (registers vllm_spf, here as no plugin's)

    monkeypatch.delitem(systems._PLUGIN_OF, "vllm_spf", raising=False)
    assert systems.plugin_of("vllm_spf") is None
    systems.load_plugin("tests.policy_plugin")
    assert systems.plugin_of("vllm_spf") == "tests.policy_plugin"
    assert systems.plugin_of("vllm") is None  # a built-in stays no plugin's


def test_the_contract_a_policy_writes_is_a_method() -> None:
    # BaseScheduler.schedule is what a policy overrides and calls as schedule(now); a stray
    # @property once made it an attribute that no call could reach
    from core.kv.paged import PagedKVCacheManager

    assert inspect.isfunction(BaseScheduler.__dict__["schedule"])
    with pytest.raises(NotImplementedError):
        BaseScheduler(PagedKVCacheManager(4)).schedule(0.0)


def test_validate_imports_the_plugin_of_the_run_it_replays(tmp_path: Path, monkeypatch) -> None:
    # validate runs in a fresh process, where the plugin that serve loaded is not imported
    pytest.importorskip("torch")
    import core.systems as systems
    from experiments import validate

    source = Path(__file__).with_name("policy_plugin.py").read_text()
    (tmp_path / "kvlab_replayed_plugin.py").write_text(source.replace("vllm_spf", "spf_replayed"))
    monkeypatch.syspath_prepend(str(tmp_path))
    plugin = ["system.name=spf_replayed", "system.plugin=kvlab_replayed_plugin"]
    try:
        status, _, err = run_cli(serve, [*SERVE_SMALL, *plugin], tmp_path)
        assert status == 0, err
        SYSTEMS.pop("spf_replayed")  # as in a fresh process
        systems._PLUGIN_OF.pop("spf_replayed")
        sys.modules.pop("kvlab_replayed_plugin")
        out = tmp_path / "replay.json"
        assert validate.main([str(tmp_path / "run"), "--recorded", "--out", str(out)]) == 0
        doc = json.loads(out.read_text())
        assert doc["exact_replay_expected"] and doc["recorded_steps_left"] == 0
        assert all(row["rel_err"] in (0.0, None) for row in doc["comparison"])
    finally:
        SYSTEMS.pop("spf_replayed", None)
        systems._PLUGIN_OF.pop("spf_replayed", None)
        sys.modules.pop("kvlab_replayed_plugin", None)


GLOBAL_PLUGIN = """
from core.sched.vllm import VLLMScheduler
from core.systems import SystemSpec, register_system
from tests.policy_plugin import ShortestPromptFirst

SHORTEST_FIRST = False  # a global the policy reads: what no policy should do


class ByGlobal(ShortestPromptFirst):
    def add(self, request, now):
        if SHORTEST_FIRST:
            return super().add(request, now)
        return VLLMScheduler.add(self, request, now)


register_system(SystemSpec("by_global", ByGlobal, "paged"))
"""


@pytest.mark.parametrize("engine_first", [False, True])
def test_validate_names_where_a_replay_departs_from_the_engines_schedule(
    tmp_path: Path, monkeypatch, engine_first: bool
) -> None:
    # a policy deciding otherwise in the simulator than in the engine once passed --recorded
    # with only relative errors (exit status 0), or stopped on a replay out of recorded
    # steps without saying where it had parted from the engine's schedule
    pytest.importorskip("torch")
    import contextlib
    import io

    import core.systems as systems
    from experiments import validate

    (tmp_path / "kvlab_by_global.py").write_text(GLOBAL_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = [*SERVE_SMALL, "system.name=by_global", "system.plugin=kvlab_by_global",
            "workload.num_requests=8", "mode=offline", "num_gpu_blocks=24", "threads=1",
            "step_timer=thread_cpu"]  # fmt: skip
    try:
        import kvlab_by_global  # type: ignore[import-not-found]

        kvlab_by_global.SHORTEST_FIRST = engine_first
        status, _, err = run_cli(serve, args, tmp_path)
        assert status == 0, err
        run = tmp_path / "run"
        same = tmp_path / "same.json"
        assert validate.main([str(run), "--recorded", "--out", str(same)]) == 0
        agreed = json.loads(same.read_text())["schedule"]
        assert agreed["steps"] > 0 and "decode_seqs" in agreed["columns"]
        assert agreed["first_divergence"] is None and agreed["first_request_divergence"] is None

        kvlab_by_global.SHORTEST_FIRST = not engine_first  # the replay decides otherwise
        out, stdout, stderr = tmp_path / "other.json", io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                status = validate.main([str(run), "--recorded", "--out", str(out)])
            except SystemExit as exc:  # plain_cli: a ConfigError is one line, status 2
                status = exc.code
        # offline, all at t=0: the step count follows the order alone, not the step times
        assert status == (2 if engine_first else 1)
        if status == 1:  # the replay took no more steps than recorded
            doc = json.loads(out.read_text())["schedule"]
            assert doc["first_divergence"] or doc["first_request_divergence"]
            assert "by_global decided otherwise in the two bodies" in stderr.getvalue()
            said = stdout.getvalue()
        else:  # it outran the recording: the one line says where it had parted
            assert status == 2
            said = stderr.getvalue()
            assert "ran out of step times" in said
        assert "departs from the engine's at step 0" in said, said
    finally:
        SYSTEMS.pop("by_global", None)
        systems._PLUGIN_OF.pop("by_global", None)
        sys.modules.pop("kvlab_by_global", None)


def test_a_spec_setting_that_the_system_keys_override_is_a_warning(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    # SystemSpec(watermark=0.0) ran with system.watermark=0.01 (the system YAML's), and a
    # spec built on vllm ran with vllm_v1's chunked prefill and prefix caching, silently
    import logging

    import core.systems as systems

    source = (
        "from core.sched.vllm import VLLMScheduler\n"
        "from core.systems import SystemSpec, register_system\n"
        "class NoWatermark(VLLMScheduler):\n    pass\n"
        "register_system(SystemSpec('no_watermark', NoWatermark, 'paged', watermark=0.0))\n"
    )
    (tmp_path / "kvlab_no_watermark.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    small = ["workload.num_requests=3", "index=null"]
    own = ["system.plugin=kvlab_no_watermark", "system.name=no_watermark"]
    try:
        with caplog.at_level(logging.WARNING, logger="experiments.lib.setup"):
            simulate.run(compose_config([*small, *PLUGIN]))
            assert "SystemSpec" not in caplog.text  # the example's spec is vllm's keys
            simulate.run(compose_config([*small, *own]))
        assert "system.watermark=0.01 from its system keys" in caplog.text
        assert "SystemSpec's watermark=0.0" in caplog.text
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="experiments.lib.setup"):
            simulate.run(compose_config([*small, *own, "system.watermark=0"]))
            assert "SystemSpec" not in caplog.text
            simulate.run(compose_config([*small, "system=vllm_v1", *PLUGIN]))
        assert "system.chunked_prefill=True" in caplog.text
        assert "enable_prefix_caching=False" in caplog.text
    finally:
        SYSTEMS.pop("no_watermark", None)
        systems._PLUGIN_OF.pop("no_watermark", None)
        sys.modules.pop("kvlab_no_watermark", None)
