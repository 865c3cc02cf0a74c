"""Simulations as Hydra jobs (experiments/lib/jobs.py): launcher presets, the missing-launcher
line, atomic complete runs and resume, on Hydra's in-process launcher and on a local Ray."""

from __future__ import annotations

import contextlib
import importlib.util
import threading
import time
from pathlib import Path

import pytest

from experiments.lib import jobs
from experiments.lib.jobs import (
    Job,
    LaunchQueue,
    exit_if_launcher_missing,
    launch,
    missing_launcher,
    plugin_of,
)

SMALL = ("workload.num_requests=12", "workload.duration_s=null", "model=opt-125m")
GRID = [
    Job(f"{system}_rate{rate}", (*SMALL, f"system={system}", f"workload.rate={rate}"))
    for system in ("vllm", "orca_oracle")
    for rate in (1, 4)
]


def test_presets_name_their_plugin() -> None:
    assert plugin_of("local") == "joblib"
    assert plugin_of("ray_cluster") == "ray"
    assert plugin_of("slurm") == "submitit_slurm"
    assert plugin_of("submitit_local") == "submitit_local"
    assert plugin_of("basic") is None and plugin_of("nonsense") is None


def test_a_missing_launcher_is_one_line_naming_the_extra(monkeypatch, capsys) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    line = missing_launcher(["system=vllm", "hydra/launcher=ray_cluster"])
    assert (
        line == "hydra/launcher=ray_cluster needs hydra-ray-launcher: pip install -e '.[cluster]'"
    )
    assert missing_launcher(["system=vllm"]) is None
    with pytest.raises(SystemExit) as ended:  # as a config error: status 2, one line
        exit_if_launcher_missing(["hydra/launcher=ray_cluster"])
    assert ended.value.code == 2 and line in capsys.readouterr().err
    with pytest.raises(RuntimeError, match=r"\[cluster\]"):
        launch(GRID[:1], "submitit_slurm", Path("unused"))


def test_an_unknown_launcher_lists_the_known_ones(tmp_path: Path) -> None:
    line = missing_launcher(["hydra/launcher=foo"])
    assert line is not None and line.startswith("hydra/launcher=foo: unknown launcher; known:")
    assert "joblib" in line and "slurm" in line and "basic" in line
    # a user's own preset on Hydra's search path is left to Hydra
    (tmp_path / "hydra" / "launcher").mkdir(parents=True)
    (tmp_path / "hydra" / "launcher" / "mine.yaml").write_text("defaults:\n  - basic\n")
    search = f"hydra.searchpath=[file://{tmp_path}]"
    assert missing_launcher([search, "hydra/launcher=mine"]) is None


def test_a_finished_job_is_found_wherever_its_index_row_went(tmp_path: Path) -> None:
    from experiments.lib.results import finished_metrics
    from experiments.reproduce import compose_config
    from experiments.simulate import run

    small = ["workload.num_requests=4", "workload.duration_s=null"]
    run(compose_config([*small, f"index={tmp_path / 'a.csv'}"]), tmp_path / "job")
    again = compose_config([*small, f"index={tmp_path / 'b.csv'}"])
    assert finished_metrics(tmp_path / "job", again) is not None
    other = compose_config(["workload.num_requests=5", "workload.duration_s=null"])
    assert finished_metrics(tmp_path / "job", other) is None


def test_a_finished_run_of_an_input_file_edited_since_is_not_reused(tmp_path: Path) -> None:
    """config.yaml names the trace, not what it held: the run's inputs.json stamps it, and
    a trace rewritten since makes the run be done again."""
    import os

    from core.request import Request, SamplingParams
    from core.workload.trace_io import write_trace
    from experiments.lib.results import finished_metrics
    from experiments.reproduce import compose_config
    from experiments.simulate import run

    trace = tmp_path / "trace.csv"
    write_trace(trace, [Request(i, 0.1 * i, 100, 50, SamplingParams()) for i in range(4)])
    cfg = compose_config(["workload=trace", f"workload.path={trace}", "index=null"])
    run(cfg, tmp_path / "job")
    assert finished_metrics(tmp_path / "job", cfg) is not None
    write_trace(trace, [Request(i, 0.1 * i, 400, 300, SamplingParams()) for i in range(4)])
    os.utime(trace, ns=(1, 1))  # a new stamp even on a file system with coarse times
    assert finished_metrics(tmp_path / "job", cfg) is None


def test_a_finished_run_made_by_other_code_is_not_reused(tmp_path: Path, monkeypatch) -> None:
    # only the config and the input files were compared: a run made before an edit of the
    # cost model was reused by a resumed sweep or reproduce --launcher
    from experiments.lib import input_stamps
    from experiments.lib.results import finished_metrics
    from experiments.reproduce import compose_config
    from experiments.simulate import run

    cfg = compose_config(["workload.num_requests=3", "workload.duration_s=null", "index=null"])
    run(cfg, tmp_path / "job")
    assert finished_metrics(tmp_path / "job", cfg) is not None
    monkeypatch.setattr(input_stamps, "code_digest", lambda: "another version")
    assert finished_metrics(tmp_path / "job", cfg) is None


def test_a_finished_run_of_an_edited_plugin_is_not_reused(tmp_path: Path, monkeypatch) -> None:
    # the plugin's module is outside the stamped code: a resumed sweep reused results made
    # by the policy before its edit
    import sys

    from experiments.lib.results import finished_metrics
    from experiments.reproduce import compose_config
    from experiments.simulate import run

    source = Path(__file__).with_name("policy_plugin.py").read_text()
    (tmp_path / "edited_policy.py").write_text(source.replace("vllm_spf", "vllm_spf_edit"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "edited_policy", raising=False)
    cfg = compose_config(["workload.num_requests=3", "workload.duration_s=null", "index=null",
                          "system.plugin=edited_policy", "system.name=vllm_spf_edit"])  # fmt: skip
    run(cfg, tmp_path / "job")
    assert finished_metrics(tmp_path / "job", cfg) is not None
    plugin = tmp_path / "edited_policy.py"
    plugin.write_text(plugin.read_text() + "# edited\n")
    assert finished_metrics(tmp_path / "job", cfg) is None


def test_a_plugin_in_a_package_is_stamped_with_the_whole_package(tmp_path: Path) -> None:
    # only the module's own file was hashed: an edited helper it imports reused old runs
    from experiments.lib.input_stamps import plugin_digest

    pkg = tmp_path / "kvlab_stamp_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "policy.py").write_text("from kvlab_stamp_pkg.util import CAP\n")
    (pkg / "util.py").write_text("CAP = 2\n")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        before = plugin_digest("kvlab_stamp_pkg.policy")
        (pkg / "util.py").write_text("CAP = 1\n")
        assert before is not None and plugin_digest("kvlab_stamp_pkg.policy") != before
        assert plugin_digest("kvlab_no_such_plugin.policy") is None
    finally:
        sys.path.remove(str(tmp_path))


def test_the_code_digest_follows_every_source_of_a_run(tmp_path: Path, monkeypatch) -> None:
    from experiments.lib import input_stamps

    for entry in input_stamps.CODE:
        (tmp_path / entry).parent.mkdir(parents=True, exist_ok=True)
        if entry.endswith(".py"):
            (tmp_path / entry).write_text("x = 1\n")
        else:
            (tmp_path / entry).mkdir(exist_ok=True)
            (tmp_path / entry / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(input_stamps, "REPO", tmp_path)
    digests = {input_stamps.code_digest.__wrapped__()}
    for entry in input_stamps.CODE:
        source = tmp_path / entry if entry.endswith(".py") else tmp_path / entry / "a.py"
        source.write_text(source.read_text() + "# edited\n")
        digests.add(input_stamps.code_digest.__wrapped__())
    (tmp_path / "experiments" / "report.py").write_text("# not a run's source\n")
    digests.add(input_stamps.code_digest.__wrapped__())
    assert len(digests) == len(input_stamps.CODE) + 1


def test_a_finished_job_giving_num_requests_alone_is_found_before_launching(
    tmp_path: Path,
) -> None:
    """``workload.num_requests=4`` alone nulls duration_s in the run's saved config; the
    launcher's check before it submits must compose the same, or it resubmits the job."""
    from experiments.lib.results import finished_metrics

    job = Job("a", ("workload.num_requests=4", "model=opt-125m"))
    launch([job], "basic", tmp_path)
    assert finished_metrics(tmp_path / "a", jobs._job_config(job.overrides)) is not None


def _mtimes(root: Path) -> dict[str, float]:
    return {p.parent.name: p.stat().st_mtime_ns for p in root.glob("*/metrics.json")}


def _check_sweep(launcher: str, root: Path) -> None:
    first = launch(GRID, launcher, root)
    assert [(m["system"], m["num_requests"]) for m in first] == [
        ("vllm", 12), ("vllm", 12), ("orca_oracle", 12), ("orca_oracle", 12)
    ]  # fmt: skip
    for job in GRID:
        files = {p.name for p in (root / job.label).iterdir()}
        assert {"config.yaml", "metrics.json", "steps.csv", "requests.csv"} <= files
        assert not [f for f in files if f.endswith(".tmp")]
    stamps = _mtimes(root)
    assert len(stamps) == 4
    # Resume: nothing finished runs again; a job whose config changed does.
    changed = Job(GRID[0].label, (*GRID[0].overrides, "seed=1"))
    again = launch([changed, *GRID[1:]], launcher, root)
    assert again[1:] == first[1:]
    after = _mtimes(root)
    assert after[GRID[0].label] != stamps[GRID[0].label]
    assert {k: v for k, v in after.items() if k != GRID[0].label} == {
        k: v for k, v in stamps.items() if k != GRID[0].label
    }


def test_sweep_in_process_resumes(tmp_path: Path) -> None:
    _check_sweep("basic", tmp_path)


def test_launch_queue_batches_requests_from_threads(tmp_path: Path, monkeypatch) -> None:
    batches: list[int] = []
    real = jobs.launch

    def counting(js, *args, **kwargs):
        batches.append(len(js))
        return real(js, *args, **kwargs)

    monkeypatch.setattr(jobs, "launch", counting)
    queue = LaunchQueue("basic", tmp_path, gather_s=0.3)
    out: dict[str, dict] = {}
    threads = [
        threading.Thread(
            target=lambda j=j: out.setdefault(j.label, queue.run(j.label, j.overrides))
        )
        for j in GRID
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert set(out) == {j.label for j in GRID}
    assert sum(batches) == 4 and len(batches) < 4  # some requests shared a launch
    # a failed job reaches its caller
    with pytest.raises(Exception, match=r"workload\.rate: not a positive rate"):
        queue.run("bad", ("workload.rate=-1", *SMALL))


@pytest.mark.ray
def test_two_by_two_sweep_on_a_local_ray(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 << 20)
    try:
        _check_sweep("ray", tmp_path)
    finally:
        ray.shutdown()


def test_reproduce_runs_every_simulation_as_a_resumable_job(tmp_path: Path) -> None:
    from experiments import reproduce

    args = [
        "--duration",
        "15",
        "--skip-fig12",
        "--skip-sharing",
        "--skip-blocks",
        "--out",
        str(tmp_path),
    ]
    try:
        reproduce.main([*args, "--launcher", "basic"])
        stamps = _mtimes(tmp_path / "runs")
        # Fig. 2's 4 systems, Fig. 13's 4 Alpaca runs, the appendix on the report's clock
        # and on the bare roofline
        runs = 4 + 4 + len(reproduce.CLOCK_OVERHEADS_S) + len(reproduce.OVERHEADS_S)
        assert len(stamps) == runs and (tmp_path / "runs/fig2_vllm/steps.csv").is_file()
        reproduce.main([*args, "--launcher", "basic"])
        assert _mtimes(tmp_path / "runs") == stamps  # nothing ran again
    finally:
        reproduce._LAUNCH = None
    assert "Fig. 2" in (tmp_path / "report.md").read_text()


def test_a_stopped_launcher_fails_every_later_request_at_once(tmp_path: Path, monkeypatch) -> None:
    from experiments.lib.sweep_stop import LauncherStopped

    calls: list[int] = []

    def dead(js, *args, **kwargs):
        calls.append(len(js))
        raise LauncherStopped("a worker process died")

    monkeypatch.setattr(jobs, "launch", dead)
    queue = LaunchQueue("basic", tmp_path, gather_s=0.05)
    with pytest.raises(LauncherStopped):
        queue.run("a", SMALL)
    with pytest.raises(LauncherStopped):
        queue.run("b", SMALL)  # no second launch: the reproduction ends instead
    assert calls == [1]


def test_an_abandoned_queue_fails_its_jobs_in_flight_and_later_at_once(
    tmp_path: Path, monkeypatch
) -> None:
    """`reproduce --launcher` stopped (Ctrl-C, SIGTERM) must not wait for the launch in
    flight: its callers fail now, and the launch ending later settles nothing twice."""
    started, release = threading.Event(), threading.Event()

    def blocked(js, *args, **kwargs):
        started.set()
        release.wait(60)
        return [{"done": True} for _ in js]

    monkeypatch.setattr(jobs, "launch", blocked)
    queue = LaunchQueue("basic", tmp_path, gather_s=0.01)
    outcome: list[BaseException] = []

    def caller() -> None:
        try:
            queue.run("a", SMALL)
        except KeyboardInterrupt as exc:
            outcome.append(exc)

    thread = threading.Thread(target=caller)
    thread.start()
    assert started.wait(30)
    queue.abandon(KeyboardInterrupt())
    thread.join(5)
    assert not thread.is_alive() and len(outcome) == 1
    with pytest.raises(KeyboardInterrupt):
        queue.run("b", SMALL)
    errors: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    release.set()  # the launch returns into futures already failed
    time.sleep(0.3)
    assert errors == []


def test_an_interrupt_marks_the_launchs_jobs_that_started_and_did_not_mark_themselves(
    tmp_path: Path, monkeypatch
) -> None:
    """A joblib launcher kills its other workers as soon as one job's interrupt comes
    back: the queue marks their runs (error.txt, an index row) as their handlers would."""
    from experiments.lib.signals import Terminated

    started, release = threading.Event(), threading.Event()
    index = tmp_path / "index.csv"

    def blocked(js, *args, **kwargs):
        for job in js[:2]:  # "a" and "b" started, "c" still queued
            saved = tmp_path / job.label / ".hydra"
            saved.mkdir(parents=True)
            (saved / "config.yaml").write_text(f"index: {index}\n")
            (saved / "hydra.yaml").write_text("hydra:\n  job:\n    name: simulate\n")
            (saved / "overrides.yaml").write_text("- seed=0\n")
        (tmp_path / "b" / "metrics.json").write_text("{}")  # "b" finished
        started.set()
        release.wait(60)
        return [{} for _ in js]

    monkeypatch.setattr(jobs, "launch", blocked)
    queue = LaunchQueue("basic", tmp_path, gather_s=0.2)
    callers = [threading.Thread(target=lambda x=x: _ignore_stop(queue, x)) for x in "abc"]
    for thread in callers:
        thread.start()
    assert started.wait(30)
    queue.abandon(Terminated("SIGTERM"))
    release.set()
    assert "interrupted (SIGTERM)" in (tmp_path / "a" / "error.txt").read_text()
    assert not (tmp_path / "b" / "error.txt").exists() and not (tmp_path / "c").exists()
    rows = index.read_text().splitlines()
    assert len(rows) == 2 and rows[1].split(",")[1:4] == [
        "simulate",
        "interrupted",
        str(tmp_path / "a"),
    ]


def _ignore_stop(queue: LaunchQueue, label: str) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        queue.run(label, SMALL)
