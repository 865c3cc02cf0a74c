"""The project's configs composed outside a Hydra app, and a command line's overrides
checked before Hydra composes them.

Hydra's own errors for an unknown group option, a key the config lacks or a malformed
value span several lines; the checks here raise a one-line
:class:`~experiments.lib.checks.ConfigError` instead (:func:`check_group_overrides`,
:func:`check_overrides_compose`), every job of a ``-m`` sweep included (:func:`sweep_jobs`).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from core.mapping_file import yaml_error_place
from experiments.lib.checks import (
    CONFIG_DIR,
    GROUPS,
    ConfigError,
    how_to_add,
    options,
    system_hint,
)
from experiments.lib.sweep_stop import is_sweep


def compose_config(config_name: str, overrides: Sequence[str] = ()) -> DictConfig:
    """The project's ``configs/<config_name>.yaml`` composed with ``overrides``, outside a
    Hydra app (scripts that run several configs in one process)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))


CONFIG_DIR_FLAGS = ("--config-dir", "-cd")


def search_dirs(argv: Sequence[str]) -> list[Path] | None:
    """The folders on Hydra's search path, where a user's own ``<group>/<option>.yaml``
    live: the ``file://`` entries of a ``hydra.searchpath=[...]`` argument, the folders of
    its ``pkg://`` entries' packages (:func:`_package_dirs`) and a ``--config-dir``/``-cd``
    flag's folder (which Hydra adds too); None when an entry's options this check cannot
    list (another scheme, a package inside a zip file)."""
    dirs: list[Path] = []
    for i, arg in enumerate(argv):
        flag, eq, given = arg.partition("=")
        if flag in CONFIG_DIR_FLAGS:
            folder = given if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if folder:
                dirs.append(Path(folder))
            continue
        key, sep, value = arg.partition("=")
        if key.lstrip("+") != "hydra.searchpath" or not sep:
            continue
        for entry in value.strip().strip("[]").split(","):
            entry = entry.strip().strip("'\"")
            if not entry:
                continue
            if entry.startswith("file://"):
                dirs.append(Path(entry.removeprefix("file://")))
                continue
            if not entry.startswith("pkg://"):  # another scheme: left to Hydra, unimported
                return None
            package = _package_dirs(entry.removeprefix("pkg://"))
            if package is None:
                return None
            dirs += package
    return dirs


def _package_dirs(name: str) -> list[Path] | None:
    """The folders of the package a ``pkg://<name>`` search path entry names (``a.b`` or
    ``a/b``, as Hydra reads it); none for a package that cannot be found (Hydra warns that
    it is not available and searches on without it); None for one whose files are not in
    folders (a zip) or a module that is no package."""
    name = name.replace("/", ".").rstrip(".")
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a parent package missing, or an empty name
        return []
    if spec is None:
        return []
    folders = [Path(f) for f in spec.submodule_search_locations or []]
    if not folders or not all(f.is_dir() for f in folders):
        return None
    return folders


def override_args(argv: Sequence[str]) -> list[str]:
    """The overrides among a command line's arguments: Hydra's flags (``-m``, ``-cn NAME``
    ...) and their values left out."""
    return [a for a in argv if not a.startswith("-") and ("=" in a or a.startswith("~"))]


def parse_overrides(argv: Sequence[str]) -> list[Any]:
    """Hydra's parse of the overrides of ``argv`` (:func:`override_args`); raises Hydra's
    ``OverrideParseException`` for a malformed one."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(override_args(argv))


def sweep_values(override: Any, group_options: Sequence[str] = ()) -> list[str]:
    """The values of a parsed override as override text: its one value, each value of a
    choice or range sweep, or the ``group_options`` a ``glob(...)`` matches; an interval
    sweep (for a sweeper plugin) by its start."""
    from hydra.core.override_parser.types import Glob, IntervalSweep

    value = override.value()
    if isinstance(value, Glob):
        return value.filter(list(group_options))
    if isinstance(value, IntervalSweep):
        return [str(value.start)]
    if override.is_sweep_override():
        return list(override.sweep_string_iterator())
    return [override.get_value_element_as_str()]


def check_override_args(argv: Sequence[str]) -> None:
    """A ConfigError for the first argument of an argparse command's overrides that is not
    an override (``key=value``) Hydra would take (:func:`override_args`)."""
    for arg in argv:
        if arg not in override_args([arg]):
            raise ConfigError(arg, "not an override (key=value) or a known flag")


def check_group_overrides(argv: Sequence[str]) -> None:
    """Raise for a ``group=option`` argument naming no option of ``group`` in ``configs/`` or
    a ``hydra.searchpath`` folder (before Hydra, whose own message spans several lines); for
    ``hardware`` and ``model`` the line also says how to add one, or, where a search-path
    folder holds ``<option>.yaml`` outside its ``<group>/`` subfolder, where to move it.
    Each value of a sweep is checked (``system=vllm,orca_max``, ``choice(...)``); a
    ``glob(...)`` must match an option. Overrides Hydra cannot parse are left to
    :func:`check_overrides_compose`."""
    from hydra.errors import HydraException

    extra = search_dirs(argv)
    if extra is None:
        return  # a package on the search path: Hydra says what it lacks
    try:
        parsed = parse_overrides(argv)
    except HydraException:
        return
    for override in parsed:
        key = override.key_or_group
        if key not in GROUPS or (override.is_delete() and override.value() is None):
            continue
        valid = options(key, extra)
        expected = "one of " + ", ".join(valid)
        choices = [v.strip("'\"") for v in sweep_values(override, valid)]
        if not choices:
            got = override.get_value_string()
            raise ConfigError(key, f"the glob matches no {key}", got, expected)
        for choice in choices:
            if choice not in valid:
                if key in OWN_GROUPS:  # a GPU or model of the user's own: say how to add one
                    expected += "; " + how_to_add(key, choice, extra)
                elif key == "system":  # a policy of the user's own: both ways to run one
                    expected += "; " + system_hint(choice, extra)
                raise ConfigError(key, f"unknown {key}", choice, expected)


def check_hardware_name(config_name: str, argv: Sequence[str]) -> None:
    """Raise when ``hardware.name=``, or the ``name`` of a user's hardware YAML that the
    hardware group chooses (``hardware=``, else the app's default), names a shipped GPU
    other than the chosen one: the chosen file's numbers would run under the other GPU's
    label (a copied YAML whose name was left). ``model.name`` and ``system.name`` switch
    what they name; a GPU is switched with ``hardware=``. Overrides Hydra cannot parse are
    left to :func:`check_overrides_compose`."""
    from hydra.errors import HydraException

    from sim.catalog import get_gpu

    try:
        parsed = parse_overrides(argv)
    except HydraException:
        return
    names = [v for o in parsed if o.key_or_group == "hardware.name" for v in sweep_values(o)]
    chosen = [v for o in parsed if o.key_or_group == "hardware" for v in sweep_values(o)]
    chosen = chosen or [default_option(config_name, "hardware")]
    for name in (n.strip("'\"") for n in names):
        try:
            named = get_gpu(name).name
        except KeyError:  # a GPU of the user's own
            continue
        for choice in chosen:
            try:
                if get_gpu(choice).name == named:
                    continue
            except KeyError:
                pass
            raise ConfigError(
                "hardware.name",
                f"names a shipped GPU, but the hardware group holds hardware={choice}'s numbers, "
                f"which would run under {name}'s label; choose the GPU with hardware={name}",
                name,
            )
    if not names:
        for choice in chosen:
            _check_user_gpu_name(choice.strip("'\""), search_dirs(argv) or [])


def _check_user_gpu_name(choice: str, extra_dirs: Sequence[Path]) -> None:
    """Raise when ``hardware=<choice>``, a user's YAML in one of ``extra_dirs`` (none
    shipped by that name), carries the ``name`` of a shipped GPU. A file that cannot be
    read is left to the run, whose error names it."""
    import yaml

    from sim.catalog import get_gpu

    if (CONFIG_DIR / "hardware" / f"{choice}.yaml").is_file():
        return
    for folder in extra_dirs:
        path = Path(folder) / "hardware" / f"{choice}.yaml"
        if not path.is_file():
            continue
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return
        name = doc.get("name") if isinstance(doc, dict) else None
        try:
            named = get_gpu(str(name)).name if name else None
        except KeyError:  # a GPU of the user's own
            return
        if named is not None and named != choice:
            raise ConfigError(
                "hardware.name",
                f"{path} names a shipped GPU, so hardware={choice}'s numbers would run under "
                f"{named}'s label; a GPU of your own names itself (name: {choice})",
                name,
            )
        return


# The groups a user adds options to with YAMLs of their own (README: GPUs and models are
# data); an unknown option of them says how (:func:`~experiments.lib.checks.how_to_add`).
OWN_GROUPS = ("hardware", "model")


def check_own_names(config_name: str, argv: Sequence[str]) -> None:
    """Raise when a chosen option of :data:`OWN_GROUPS` (``group=``, else the app's
    default) is a user's YAML on ``hydra.searchpath`` whose ``name`` is not its file's name:
    results, the runs index and the calibration checks (``check_calibration_fits``, which
    compare GPU and model names) know it by that name alone, so a copy whose name was left
    would pass for the original. A model YAML without numbers of its own (no ``shape`` or
    ``hf_config``) is the catalog model it names, under any file name. A missing name, and
    a file that cannot be read, are left to the run, whose error names them. Overrides
    Hydra cannot parse are left to :func:`check_overrides_compose`."""
    import yaml

    for group, choice, extra in chosen_options(config_name, argv, OWN_GROUPS):
        if (CONFIG_DIR / group / f"{choice}.yaml").is_file():
            continue  # shipped (a user's file of its name: check_shadowed_choices)
        path = next((p for d in extra if (p := Path(d) / group / f"{choice}.yaml").is_file()),
                    None)  # fmt: skip
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8")) if path else None
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if not isinstance(doc, dict) or doc.get("name") in (None, ""):
            continue
        if group == "model" and not (doc.get("shape") or doc.get("hf_config")):
            continue  # names a catalog model, which it is
        if str(doc["name"]) != choice:
            raise ConfigError(
                f"{group}.name",
                f"{path} calls itself {doc['name']!r}, but {group}={choice} chose it: "
                f"results and calibration checks go by that name, so a copy whose name "
                f"was left passes for the original; write name: {choice} in it",
            )


def chosen_options(
    config_name: str, argv: Sequence[str], groups: Sequence[str]
) -> Iterator[tuple[str, str, list[Path]]]:
    """``(group, option, search-path folders)`` for each option of ``groups`` that ``argv``
    chooses (``group=``, each value of a sweep), else the app's default; nothing without a
    ``hydra.searchpath`` folder, or when Hydra cannot parse ``argv``
    (:func:`check_overrides_compose` says why)."""
    from hydra.errors import HydraException

    extra = search_dirs(argv)
    if not extra:
        return
    try:
        parsed = parse_overrides(argv)
    except HydraException:
        return
    for group in groups:
        valid = options(group, extra)
        chosen = [v for o in parsed if o.key_or_group == group for v in sweep_values(o, valid)]
        for choice in chosen or [default_option(config_name, group)]:
            yield group, choice.strip("'\""), extra


def check_shadowed_choices(config_name: str, argv: Sequence[str]) -> None:
    """Raise when a chosen option (``group=``, else the app's default) is a user's YAML on
    ``hydra.searchpath`` with the name of a shipped option and other contents: Hydra reads
    the shipped ``configs/<group>/<option>.yaml`` first, so the user's file would be ignored
    without a word. Overrides Hydra cannot parse are left to :func:`check_overrides_compose`."""
    for group, choice, extra in chosen_options(config_name, argv, GROUPS):
        shipped = CONFIG_DIR / group / f"{choice}.yaml"
        if not shipped.is_file():
            continue
        for folder in extra:
            mine = Path(folder) / group / f"{choice}.yaml"
            if mine.is_file() and mine.read_bytes() != shipped.read_bytes():
                raise ConfigError(
                    group,
                    f"{mine} has the name of the shipped configs/{group}/{choice}.yaml, "
                    f"which Hydra reads instead; give your file a name of its own",
                    choice,
                )


def check_own_yamls(config_name: str, argv: Sequence[str]) -> None:
    """Raise for a chosen YAML of the user's own that a run would misread: a copied GPU
    still carrying a shipped GPU's name (:func:`check_hardware_name`), a GPU or model whose
    ``name`` is not its file's (:func:`check_own_names`), a file named as a shipped option
    but edited, which Hydra would ignore (:func:`check_shadowed_choices`). Every command
    that takes ``simulate``'s overrides runs it (``simulate``, ``serve``, ``capacity``,
    ``kv_capacity``)."""
    check_hardware_name(config_name, argv)
    check_own_names(config_name, argv)
    check_shadowed_choices(config_name, argv)


def default_option(config_name: str, group: str) -> str:
    """The option of ``group`` that ``configs/<config_name>.yaml``'s defaults list names."""
    import yaml

    doc = yaml.safe_load((CONFIG_DIR / f"{config_name}.yaml").read_text()) or {}
    for entry in doc.get("defaults") or ():
        if isinstance(entry, dict) and group in entry:
            return str(entry[group])
    return ""


# The groups whose keys a ``+group.key=...`` may add: only keys an option of the group holds.
KEYED_GROUPS = ("model", "hardware", "system")


def group_keys(group: str, extra_dirs: Sequence[Path] = ()) -> set[str]:
    """The keys the options of ``group`` hold: the top-level keys of every
    ``<group>/*.yaml`` in ``configs/`` and ``extra_dirs`` (its defaults list aside), and for
    ``hardware`` every key :func:`sim.catalog.gpu_from_config` reads."""
    import yaml

    from sim.catalog import HARDWARE_FIELDS

    keys = set(HARDWARE_FIELDS) if group == "hardware" else set()
    for folder in (CONFIG_DIR, *extra_dirs):
        for path in (Path(folder) / group).glob("*.yaml"):
            try:
                doc = yaml.safe_load(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                continue  # the run that chooses it reports it
            if isinstance(doc, dict):
                keys |= {str(k) for k in doc if k != "defaults"}
    return keys


# Hydra's flags that make a command a sweep; the other flags (--cfg, -cp, ...) change what
# the command does, so a command with one is left to Hydra.
MULTIRUN_FLAGS = frozenset({"-m", "--multirun"})


# Hydra's flags that change where the config comes from (or replay another run's): with
# them the overrides are left to Hydra; the others (-m, --cfg job, --help, --info ...)
# leave the config as composed here
SOURCE_FLAGS = frozenset({
    "-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir",
    "--experimental-rerun", "-sc", "--shell-completion",
})  # fmt: skip


def check_overrides_compose(
    config_name: str,
    argv: Sequence[str],
    several: str = "several values without -m: add -m to run one job per value",
) -> None:
    """Raise for overrides Hydra cannot compose into ``configs/<config_name>.yaml`` (a key
    the config lacks, a malformed value, a key added under a name nothing reads), in one
    line where Hydra's spans several. A sweep is checked as its jobs (:func:`sweep_jobs`);
    several values without ``-m`` are refused with ``several`` as the problem and its cure
    (a command without ``-m``, such as ``capacity``, gives its own).
    Left to Hydra: the overrides of a command with a flag of :data:`SOURCE_FLAGS`, and a
    ``hydra.searchpath`` with a ``pkg://`` entry. A config file that is not YAML is
    named with its line and column."""
    import yaml
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    flags = {a for a in argv if a.startswith("-")}
    if any(f.split("=")[0] in SOURCE_FLAGS for f in flags) or search_dirs(argv) is None:
        return
    overrides = override_args(argv)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        sweep = next((o for o in parsed if o.is_sweep_override()), None)
        if sweep is not None and not is_sweep(argv):
            raise ConfigError(
                sweep.key_or_group,
                f"{several}, or write [a,b] for a list, 'a,b' for a string",
                (sweep.input_line or "").partition("=")[2],
            )
        jobs = sweep_jobs(parsed, search_dirs(argv) or [])
        failed: list[tuple[list[str], HydraException]] = []
        for job in jobs:
            added = [o.key_or_group for o in parse_overrides(job) if o.is_add() or o.is_force_add()]
            check_added_keys(config_name, added, job)
            try:
                compose_config(config_name, job)
            except HydraException as exc:
                failed.append((job, exc))
        if failed and len(failed) < len(jobs):  # a key only some swept values have
            job, exc = failed[0]
            swept = {o.get_key_element() for o in parsed if o.is_sweep_override()}
            raise _in_job(_compose_error(config_name, exc), job, swept)
        if failed:
            raise failed[0][1]
    except HydraException as exc:
        raise _compose_error(config_name, exc) from None
    except yaml.MarkedYAMLError as exc:
        place = yaml_error_place(exc)
        where = f"{exc.problem_mark.name}, {place}: " if place else ""
        raise ConfigError("config", f"{where}not YAML ({exc.problem})") from None


def _in_job(error: ConfigError, job: Sequence[str], swept: set[str]) -> ConfigError:
    """``error``, met in some of a sweep's jobs only, naming the first one's swept values."""
    values = [o for o in job if o.partition("=")[0] in swept]
    where = (
        f"under {' '.join(values)} (a job of the sweep; other swept values have it): sweep "
        "such values separately"
    )
    return ConfigError(error.key, f"{error.problem} {where}", error.got, error.expected)


def _compose_error(config_name: str, exc: Exception) -> ConfigError:
    """Hydra's error composing a config, as one line naming the key where it names one."""
    text = str(exc).strip()
    unknown = re.match(r"Could not override '([^']+)'", text)
    if unknown:
        key = unknown.group(1)
        expected = (
            f"a key of configs/{config_name}.yaml or of its groups' options; +{key}=... "
            "adds one under a name the app reads, where the config takes new keys"
        )
        if key == "workload.rate":  # the workload chosen replays a trace's own arrivals
            expected = (
                "none: a workload that replays recorded arrivals has no rate; a trace file's "
                "(azure_*, mooncake, vidur) workload.time_scale sets its rate (0.5 replays it "
                "twice as fast)"
            )
        if key == "workload.duration_s":  # multi_turn and vllm_bench size their traces
            expected = (
                "none: this workload is not cut by time; multi_turn's size is "
                "workload.num_conversations, a vllm_bench file's its requests, and "
                "workload.num_requests keeps the first that many of either"
            )
        return ConfigError(key, "no such key in this config", expected=expected)
    lines = [text.splitlines()[0] if text else type(exc).__name__]
    if exc.__cause__ is not None and str(exc.__cause__).strip():
        lines.append(str(exc.__cause__).strip().splitlines()[0])
    return ConfigError("overrides", ": ".join(lines))


def sweep_jobs(parsed: Sequence[Any], extra_dirs: Sequence[Path]) -> list[list[str]]:
    """Override lists that stand for a command's jobs, for checking each swept value's key
    as a single run's: every sweep at its first value, then, for each further value of a
    swept config group, that value with the others at their first (a group's value brings
    its own keys; another key's values share their key). ``hydra.mode`` and sweeps of
    ``hydra.*`` keys are left out. A command without sweeps is its one job."""
    base: list[str] = []
    alternatives: list[tuple[int, list[str]]] = []
    for override in parsed:
        if override.key_or_group == "hydra.mode" or (
            override.is_hydra_override() and override.is_sweep_override()
        ):
            continue  # Hydra's own (a sweeper's search space): not a job's key
        if not override.is_sweep_override():
            base.append(override.input_line)
            continue
        group = override.key_or_group
        values = sweep_values(override, options(group, extra_dirs) if group in GROUPS else ())
        if not values:
            continue  # a glob that matches nothing: check_group_overrides says so
        key = override.get_key_element()
        base.append(f"{key}={values[0]}")
        if group in GROUPS:
            alternatives.append((len(base) - 1, [f"{key}={v}" for v in values[1:]]))
    jobs = [base]
    for position, others in alternatives:
        jobs += [[*base[:position], other, *base[position + 1 :]] for other in others]
    return jobs


def check_added_keys(config_name: str, keys: Sequence[str], overrides: Sequence[str] = ()) -> None:
    """Raise for a key or group added with ``+`` or ``++`` that the app never reads, so a
    mistyped ``+warmpu=true`` is not dropped in silence: a top-level name that the composed
    ``configs/<config_name>.yaml`` does not have, or a key under ``model``, ``hardware`` or
    ``system`` that no option of the group holds (:func:`group_keys`,
    with the user's ``hydra.searchpath`` folders) nor the config composed with the other
    ``overrides``. Deeper keys (``+model.shape.x``), other groups' keys (their own checks)
    and ``hydra`` keys are left alone."""
    if not keys:
        return
    composed = compose_config(config_name, [o for o in overrides if not o.startswith("+")])
    known = set(composed)
    for key in keys:
        top = re.split(r"[./@]", key)[0]
        if top not in known and top != "hydra":
            expected = f"a key of configs/{config_name}.yaml: " + ", ".join(sorted(known))
            raise ConfigError(key, "added, but no part of this app reads it", expected=expected)
        group, _, rest = key.partition(".")
        if group in KEYED_GROUPS and rest and "@" not in key:
            held = group_keys(group, search_dirs(overrides) or []) | set(composed.get(group) or {})
            if rest.split(".")[0] not in held:
                raise ConfigError(
                    key, f"added, but the {group} group has no such key",
                    expected=f"a key of {group}: " + ", ".join(sorted(held)),
                )  # fmt: skip
