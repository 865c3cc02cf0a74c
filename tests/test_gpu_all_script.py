"""``experiments/gpu_all.sh`` itself: order, limits, dry flags, failure handling, packing.

The script runs against a stub interpreter (``PYTHON``) that logs each call and writes the
files the next part looks for, so this is fast; the parts themselves have their own dry
tests (``test_bench_gpu_dry``, ``test_gpu_engine_dry``, ``test_profile_gpu_dry``,
``test_gpu_env``). A copy of the script in a temporary tree keeps the repository's
``.whl/`` out, except in the test that installs those wheels.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WHEELS = sorted((ROOT / ".whl").glob("*.whl"))
PARTS = ["env", "profile", "kernels", "engine", "calibrate", "validate", "overhead", "sync",
         "host"]  # fmt: skip
DEVICE_BUDGET_S = 9 * 60

STUB = r"""#!/usr/bin/env bash
echo "PYTHONPATH=${PYTHONPATH:-} $* TRITON_INTERPRET=${TRITON_INTERPRET:-}" >>"$STUB_LOG"
if [ "$1 $2" = "-m pip" ]; then exec "$REAL_PYTHON" "$@"; fi
site=${PYTHONPATH%%:*}  # what the wheels' install holds while the script runs
[ -n "$site" ] && [ ! -e "$STUB_LOG.site" ] && ls "$site" >"$STUB_LOG.site"
out="" prev=""
for a in "$@"; do [ "$prev" = --out ] && out=$a; prev=$a; done
[ "$2" = "${STUB_FAIL:-}" ] && { echo "stub: $2 fails"; exit 3; }
[ "$2" = "${STUB_SLEEP:-}" ] && sleep 8
case $2 in
experiments.bench.gpu_env) echo '{"stub": true}' >"$out" ;;
experiments.bench.profile_gpu) mkdir -p "$out" && touch "$out/operator_profile.csv"
    complete=true; [ -n "${STUB_PROFILE_CUT:-}" ] && complete=false
    printf '{\n  "model": "tiny-opt",\n  "complete": %s\n}\n' $complete \
        >"$out/operator_profile.json" ;;
experiments.bench.engine_gpu) ls -a "$PACK_DIR" >"$STUB_LOG.pack"  # what the earlier parts left
    [ -n "${STUB_NO_ONLINE:-}" ] || mkdir -p "$out/tiny-opt_vllm_online"
    mkdir -p "$out/tiny-opt_vllm_offline" && touch "$out/tiny-opt_vllm_offline/steps.csv"
    [ -d "$out/tiny-opt_vllm_online" ] && touch "$out/tiny-opt_vllm_online/steps.csv" ;;
esac
echo "stub: $2 ok"
"""


def run_script(tmp_path: Path, wheels: bool = False, **env: str) -> tuple[int, Path, Path]:
    """Run a copy of gpu_all.sh with DRY=1 and the stub; (exit status, out dir, pack dir)."""
    tree = tmp_path / "tree"
    (tree / "experiments").mkdir(parents=True, exist_ok=True)  # a second call reuses it
    shutil.copy(ROOT / "experiments" / "gpu_all.sh", tree / "experiments")
    if wheels:
        shutil.copytree(ROOT / ".whl", tree / ".whl")
    stub = tmp_path / "python3"
    stub.write_text(STUB)
    stub.chmod(0o755)
    out, pack = tmp_path / "out", tmp_path / "pack"
    variables = {**os.environ, "PYTHON": str(stub), "REAL_PYTHON": sys.executable,
                 "STUB_LOG": str(tmp_path / "calls.log"), "DRY": "1", "PACK_DIR": str(pack),
                 **env}  # fmt: skip
    variables.pop("PYTHONPATH", None)
    variables.pop("TRITON_INTERPRET", None)  # conftest sets it; the script must on its own
    cmd = ["bash", str(tree / "experiments" / "gpu_all.sh"), str(out)]
    done = subprocess.run(cmd, env=variables, capture_output=True, text=True, timeout=300)
    (tmp_path / "stdout.log").write_text(done.stdout)
    (tmp_path / "stderr.log").write_text(done.stderr)
    return done.returncode, out, pack


def parts(out: Path) -> list[dict[str, str]]:
    with (out / "parts.tsv").open() as f:
        return list(csv.DictReader(f, delimiter="\t"))


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls.log").read_text().splitlines()


def test_every_part_runs_dry_in_order_within_the_device_budget(tmp_path: Path) -> None:
    rc, out, pack = run_script(tmp_path, LIMIT_SCALE="1")
    assert rc == 0
    rows = parts(out)
    assert [r["part"] for r in rows] == PARTS
    assert all(r["exit"] == "0" for r in rows)
    assert sum(int(r["limit_s"]) for r in rows) <= DEVICE_BUDGET_S
    modules = [c.split(" -m ")[1].split()[0] for c in calls(tmp_path)]
    assert modules == [
        "experiments.bench.gpu_env", "experiments.bench.profile_gpu",
        "experiments.bench.kernels_gpu", "experiments.bench.engine_gpu",
        "experiments.calibrate", "experiments.validate", "experiments.calibrate_overhead",
        "experiments.bench.sync_check", "experiments.bench.host_time",
    ]  # fmt: skip
    calibrate, validate, overhead = calls(tmp_path)[4:7]
    assert "tiny-opt_vllm_offline --weighting relative --profile" in calibrate
    assert "tiny-opt_vllm_online --calibration" in validate  # another run than the fit's
    assert "tiny-opt_vllm_offline" in overhead and "tiny-opt_vllm_online --out" in overhead
    assert all("--dry" in c for c in calls(tmp_path)[:4] + calls(tmp_path)[7:])
    assert "--max-seconds 175" in calls(tmp_path)[3]  # the engine's 190 s less 15 to end
    for part in PARTS:
        assert (out / f"{part}.log").is_file()
    packed = sorted(p.name for p in pack.iterdir())
    assert packed == sorted(["kvlab-gpu.tar.gz", "env.json", "parts.tsv",
                             "operator_profile.csv", "operator_profile.json"])  # fmt: skip
    assert len(packed) <= 8  # what the device tool returns
    with tarfile.open(pack / "kvlab-gpu.tar.gz") as tar:
        names = tar.getnames()
    assert {"out/env.json", "out/kernels.log", "out/engine/tiny-opt_vllm_online/steps.csv"} <= set(
        names
    )


def test_dry_limits_are_scaled_for_cpu(tmp_path: Path) -> None:
    rc, out, _ = run_script(tmp_path)
    assert rc == 0
    assert [int(r["limit_s"]) for r in parts(out)] == [300, 700, 600, 1900, 200, 400, 100, 400, 600]
    assert "--max-seconds 1750" in calls(tmp_path)[3]


def test_dry_parts_get_the_interpreter_from_the_start_and_gpu_parts_do_not(
    tmp_path: Path,
) -> None:
    """Triton 3.6 (the device image's) builds its library's jit functions as interpreted
    only if TRITON_INTERPRET is set when triton is imported, so a dry run sets it before
    Python starts; on the GPU nothing sets it."""
    run_script(tmp_path / "dry")
    assert all(c.endswith(" TRITON_INTERPRET=1") for c in calls(tmp_path / "dry"))
    run_script(tmp_path / "gpu", DRY="0")
    assert calls(tmp_path / "gpu")
    assert all(c.endswith(" TRITON_INTERPRET=") for c in calls(tmp_path / "gpu"))


def test_a_failing_part_does_not_stop_the_others(tmp_path: Path) -> None:
    rc, out, pack = run_script(tmp_path, STUB_FAIL="experiments.bench.kernels_gpu")
    assert rc == 1
    rows = {r["part"]: r["exit"] for r in parts(out)}
    assert rows == {"env": "0", "profile": "0", "kernels": "3", "engine": "0", "calibrate": "0",
                    "validate": "0", "overhead": "0", "sync": "0", "host": "0"}  # fmt: skip
    assert (pack / "kvlab-gpu.tar.gz").is_file()


def test_a_failed_calibration_is_not_validated(tmp_path: Path) -> None:
    """validate would read no calibration of this call (or a stale one from a reused OUT)."""
    rc, out, _ = run_script(tmp_path, STUB_FAIL="experiments.calibrate")
    assert rc == 1
    rows = {r["part"]: r["exit"] for r in parts(out)}
    assert rows["calibrate"] == "3" and "validate" not in rows and rows["overhead"] == "0"


def test_a_failed_environment_check_stops_the_run(tmp_path: Path) -> None:
    rc, out, pack = run_script(tmp_path, STUB_FAIL="experiments.bench.gpu_env")
    assert rc == 1
    assert [r["part"] for r in parts(out)] == ["env"]
    assert (pack / "kvlab-gpu.tar.gz").is_file() and (pack / "parts.tsv").is_file()


def test_no_engine_run_skips_calibration_and_fails(tmp_path: Path) -> None:
    rc, out, _ = run_script(tmp_path, STUB_FAIL="experiments.bench.engine_gpu")
    assert rc == 1
    assert [r["part"] for r in parts(out)] == [
        "env",
        "profile",
        "kernels",
        "engine",
        "sync",
        "host",
    ]


def test_a_rerun_into_the_same_out_dir_takes_nothing_from_the_earlier_call(
    tmp_path: Path,
) -> None:
    """A warm device machine keeps /tmp/kvlab-gpu between calls: when the engine fails in
    the second call, its calibration, validation and overhead fit must not run on the first
    call's engine runs, nor the pack carry them (or the first call's profile) as this call's."""
    rc, out, _ = run_script(tmp_path)
    assert rc == 0 and (out / "engine" / "tiny-opt_vllm_offline" / "steps.csv").is_file()
    (tmp_path / "calls.log").unlink()
    rc, out, pack = run_script(tmp_path, STUB_FAIL="experiments.bench.engine_gpu")
    assert rc == 1
    assert [r["part"] for r in parts(out)] == ["env", "profile", "kernels", "engine", "sync",
                                               "host"]  # fmt: skip
    assert not any(" -m experiments.calibrate" in c for c in calls(tmp_path))
    assert not (out / "engine").exists() and not (out / "calibrate.log").exists()
    with tarfile.open(pack / "kvlab-gpu.tar.gz") as tar:
        assert not [n for n in tar.getnames() if n.startswith("out/engine/")]


def test_without_the_online_run_the_fit_run_is_validated(tmp_path: Path) -> None:
    rc, _, _ = run_script(tmp_path, STUB_NO_ONLINE="1")
    assert rc == 0
    validate, overhead = calls(tmp_path)[5:7]
    assert "tiny-opt_vllm_offline --calibration" in validate
    assert "tiny-opt_vllm_online" not in overhead


@pytest.mark.skipif(not WHEELS, reason="no .whl/: run `bash experiments/gpu_prepare.sh` first")
def test_wheels_are_installed_and_put_on_pythonpath(tmp_path: Path) -> None:
    rc, _, _ = run_script(tmp_path, wheels=True)
    assert rc == 0
    log = calls(tmp_path)
    assert " -m pip install " in log[0] and "--no-index --no-deps" in log[0]
    site = Path(log[1].split()[0].removeprefix("PYTHONPATH="))
    held = (tmp_path / "calls.log.site").read_text().split()
    assert "simpy" in held and "hydra" in held
    assert all(c.startswith(f"PYTHONPATH={site} ") for c in log[1:])
    assert not site.exists()  # removed when the script ended


def test_the_pack_is_brought_up_to_date_after_every_part(tmp_path: Path) -> None:
    """A call killed at its limit returns what is under $OUT: before the engine part starts,
    the pack already holds the earlier parts' files, and never a temporary one at the end."""
    rc, _, pack = run_script(tmp_path)
    assert rc == 0
    before_engine = set((tmp_path / "calls.log.pack").read_text().split()) - {".", ".."}
    assert before_engine == {"kvlab-gpu.tar.gz", "env.json", "parts.tsv",
                             "operator_profile.csv", "operator_profile.json"}  # fmt: skip
    assert sorted(p.name for p in pack.iterdir()) == sorted(before_engine)


def test_a_cut_profile_is_not_given_to_calibrate(tmp_path: Path) -> None:
    """A profile its time limit cut short (``complete`` false) lacks the decode rows the
    calibration needs: calibrate fits without it, says so, and validate runs."""
    rc, out, _ = run_script(tmp_path, STUB_PROFILE_CUT="1")
    assert rc == 0
    calibrate = calls(tmp_path)[4]
    assert "experiments.calibrate " in calibrate and "--profile" not in calibrate
    assert "without it" in (tmp_path / "stdout.log").read_text()
    assert {r["part"]: r["exit"] for r in parts(out)}["validate"] == "0"


def test_a_deadline_caps_each_limit_and_skips_the_parts_that_cannot_fit(tmp_path: Path) -> None:
    """DEADLINE_S=32: 32 s less 15 kept to pack leave 17 s, so every part's limit is at most
    17; the engine (its stub sleeps 8 s) leaves under the 10 s a part needs: the rest are
    skipped, each recorded in parts.tsv, and the call fails (not all was measured). The
    parts before the engine have 7 s to start it (stubs: well under 1 s each)."""
    rc, out, pack = run_script(tmp_path, DEADLINE_S="32", LIMIT_SCALE="1",
                               STUB_SLEEP="experiments.bench.engine_gpu")  # fmt: skip
    assert rc == 1
    rows = parts(out)
    assert [r["part"] for r in rows] == [*PARTS[:4], "calibrate", "overhead", "sync", "host"]
    assert all(r["exit"] == "0" and int(r["limit_s"]) <= 17 for r in rows[:4])
    assert all(r["exit"] == "skipped" and r["seconds"] == "0" for r in rows[4:])
    engine = calls(tmp_path)[3]
    assert int(engine.split("--max-seconds ")[1].split()[0]) < int(rows[3]["limit_s"])
    assert (pack / "parts.tsv").read_text() == (out / "parts.tsv").read_text()


@pytest.mark.parametrize(
    ("setting", "value"),
    [("LIMIT_SCALE", "0"), ("LIMIT_SCALE", "1.5"), ("LIMIT_SCALE", "x"), ("DEADLINE_S", "-5"),
     ("DEADLINE_S", "soon"), ("PACK_DIR", "<out>")],
)  # fmt: skip
def test_a_bad_setting_is_one_line_before_anything_runs(
    setting: str, value: str, tmp_path: Path
) -> None:
    if value == "<out>":  # the pack inside the folder it packs
        value = str(tmp_path / "out" / "pack")
    rc, out, _ = run_script(tmp_path, **{setting: value})
    assert rc == 2
    err = (tmp_path / "stderr.log").read_text().strip()
    assert len(err.splitlines()) == 1 and setting in err, err
    assert repr(value) in err or f"({value})" in err, err
    assert not out.exists() and not (tmp_path / "calls.log").exists()
