"""The `phaze` command: `phaze <mode> [overrides]`, one hydra application for the three modes.

Every job of the command line (each point of a `-m` sweep) is checked before hydra starts, so a
wrong input prints one line, exits with code 2 and writes nothing. The run's directory is then
claimed for this process (phaze.rundir) and given to hydra as resolved.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import secrets
import sys
from pathlib import Path

import hydra
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from phaze_common.checks import InputError
from phaze_common.files import user_cache_dir
from phaze import interrupt, rundir, sweep
from phaze.config_keys import (config_key_error, config_schema, model_name_error, override_key_error,
                               system_file_overrides, system_name_error)
from phaze.settings import MODES, settings_from_config, unread_key_error
from phaze.sweep import Infeasible

#: This process's token in its run directory's name (`${run_token:}` in hydra.run.dir and
#: hydra.sweep.dir): two runs started in the same second write to different directories. Cached
#: in the config like `${now:}`, so every job of a sweep resolves the same sweep directory.
RUN_TOKEN = secrets.token_hex(4)
OmegaConf.register_new_resolver("run_token", lambda: RUN_TOKEN, use_cache=True, replace=True)

USAGE = (
    f"usage: phaze {{{','.join(MODES)}}} [-m] [key=value ...]   (phaze <mode> --help for the options)\n"
    "       phaze report DIR [--out FOLDER]   (summarise the run_solver runs under DIR)\n"
    "       phaze validate FILE [cache_dir=PATH]   (predict published measured runs and compare; graphs "
    "cached in $XDG_CACHE_HOME/phaze or ~/.cache/phaze)"
)


#: The hydra launchers a sweep (`-m hydra/launcher=NAME`) can run on: the phaze extra that installs
#: each and the modules it needs (the plugin and what it runs jobs with).
LAUNCHERS = {
    "basic": (None, ()),
    "joblib": ("joblib", ("hydra_plugins.hydra_joblib_launcher._core",)),
    "ray": ("ray", ("hydra_plugins.hydra_ray_launcher._core",)),
    "submitit_local": ("slurm", ("hydra_plugins.hydra_submitit_launcher.submitit_launcher", "submitit")),
    "submitit_slurm": ("slurm", ("hydra_plugins.hydra_submitit_launcher.submitit_launcher", "submitit")),
}
#: config.yaml's directories (a relative path, or null: the per-user cache folder), made absolute for the
#: launchers that run jobs elsewhere.
_DEFAULTS = OmegaConf.to_container(OmegaConf.load(Path(__file__).parent / "conf" / "config.yaml"), resolve=False)
DEFAULT_DIRECTORIES = {"hydra.sweep.dir": _DEFAULTS["hydra"]["sweep"]["dir"], "cache_dir": _DEFAULTS["cache_dir"]}


def _fail(message: str) -> None:
    print(f"phaze: error: {message}", file=sys.stderr)
    sys.exit(2)


def _argument_error(message: str) -> None:
    """argparse's error (an unknown flag, a flag's bad value) as a one-line InputError."""
    if message.startswith("unrecognized arguments: "):
        flag = message.removeprefix("unrecognized arguments: ").split()[0]
        raise InputError(f"{flag}: unknown option; phaze <mode> --help lists the options")
    if message.startswith("argument "):
        flags, _, problem = message.removeprefix("argument ").partition(": ")
        raise InputError(f"{flags.split('/')[0]}: {problem}")
    raise InputError(f"arguments: {message}")


def split_command_line(arguments: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """hydra's reading of the arguments (overrides and flags in any order; a system file's path,
    `system=PATH`, as the system group's `file` option and its path) and the flags alone (the
    arguments that are not overrides, in their order)."""
    arguments = [given for argument in arguments for given in system_file_overrides(argument)]
    parser = get_args_parser()
    parser.error = _argument_error
    parsed = parser.parse_intermixed_args(arguments)
    overrides, flags = list(parsed.overrides), []
    for argument in arguments:
        if overrides and argument == overrides[0]:
            overrides.pop(0)
        else:
            flags.append(argument)
    return parsed, flags


def _override_key(override: str) -> str:
    """The dotted key an override sets: `+a.b@pkg=1` -> `a.b`."""
    return override.partition("=")[0].lstrip("+~").partition("@")[0]


def key_shape_error(argument: str) -> InputError | None:
    """The error for an override whose key is missing (`=5`) or has an empty name between its dots
    (`a..b=1`, `.=1`), which hydra's parser reads as the primary config or a lexer error; None for any
    other argument (hydra's parser and the configuration check those)."""
    key, equals, _ = argument.partition("=")
    if not equals:
        return None
    name = key.lstrip("+~").partition("@")[0]
    if not name:
        return InputError(f"{argument!r}: no key before '='; an override is key=value (e.g. "
                          "tensor_parallel_width=8)")
    if "" in re.split(r"[./]", name):
        return InputError(f"{name}: {argument!r} has an empty name between dots; a key is names joined by single "
                          "dots (e.g. model.overrides.num_layers=4)")
    return None


def _composition_error(job: list[str], schema: dict, error: Exception) -> InputError:
    """A hydra composition error as one line naming the key of the override that caused it."""
    for override in job:
        if problem := override_key_error(_override_key(override), schema):
            return problem
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    named = [_override_key(o) for o in job if _override_key(o) in str(error)]  # hydra quotes the key
    return InputError(f"{max(named, key=len, default='config')}: {' '.join(lines[:2])}")


def check_command_line(mode: str, arguments: list[str]) -> tuple[str, Path] | None:
    """Compose the config of every job the arguments describe and validate it (InputError); the
    run's directory key (hydra.run.dir, or hydra.sweep.dir for -m) and path, checked writable, or
    None when no job runs (--help, --cfg, ...)."""
    parsed, _ = split_command_line(arguments)
    parser = OverridesParser.create()
    overrides = []
    for argument in parsed.overrides:
        if error := key_shape_error(argument):
            raise error
        try:
            overrides += parser.parse_overrides([argument])
        except HydraException as error:
            problem = " ".join(line.strip() for line in str(error).splitlines()
                               if line.strip() and not line.startswith(("Error parsing", "See ")))
            raise InputError(f"{_override_key(argument)}: cannot read {argument!r} ({problem}); "
                              "see https://hydra.cc/docs/advanced/override_grammar/basic") from None
    for override in overrides:
        if _override_key(override.input_line) == "mode":
            raise InputError(f"mode: set by the subcommand, not an override, got {override.input_line!r}; "
                              f"give it first: phaze {{{','.join(MODES)}}} [overrides]")
        if override.is_sweep_override() and not parsed.multirun:
            raise InputError(f"{override.key_or_group}: {override.input_line!r} sweeps several values; add -m "
                              "for one job per value, or give a list as [a,b]")
    if parsed.help or parsed.hydra_help:
        return None
    for override in overrides:
        if override.key_or_group == "hydra/launcher" and (error := launcher_error(override.value())):
            raise error
    commands = [flag for flag, given in (("--run", parsed.run), ("--multirun", parsed.multirun), ("--cfg", parsed.cfg),
                                         ("--info", parsed.info), ("--shell-completion", parsed.shell_completion)) if given]
    if len(commands) > 1:
        raise InputError(f"{commands[1]}: cannot go with {commands[0]}; give one of --run, --multirun (-m), --cfg, "
                          "--info, --shell-completion")
    if parsed.resolve and not parsed.cfg:
        raise InputError("--resolve: goes with --cfg or --help only")
    if commands and commands[0] not in ("--run", "--multirun"):
        return None
    user_overrides = [o for o in overrides if not o.key_or_group.startswith("hydra")]
    hydra_overrides = [o.input_line for o in overrides if o.key_or_group.startswith("hydra")]
    jobs = BasicSweeper.split_arguments(user_overrides, None)[0] if user_overrides else [[]]
    schemas: dict[tuple[str, ...], dict] = {}
    defaults: dict[tuple[str, ...], dict] = {}
    directory = None
    with hydra.initialize_config_module(config_module="phaze.conf", version_base="1.3"):
        for job in jobs:
            groups = tuple(o for o in job if _override_key(o) in ("model", "system"))
            for override in groups:
                value = override.partition("=")[2]
                if _override_key(override) == "model" and (error := model_name_error(value)):
                    raise error
                if _override_key(override) == "system" and (error := system_name_error(value)):
                    raise error
            if groups not in schemas:
                default = hydra.compose(config_name="config", overrides=[*groups, f"mode={mode}"])
                schemas[groups] = config_schema(OmegaConf.to_container(default))
                defaults[groups] = OmegaConf.to_container(default, resolve=True)
            try:
                cfg = hydra.compose(config_name="config", overrides=[*job, f"mode={mode}"])
            except (HydraException, OmegaConfBaseException) as error:
                raise _composition_error(job, schemas[groups], error) from None
            if error := config_key_error(OmegaConf.to_container(cfg), schemas[groups]):
                raise error
            if directory is None:  # before the settings: a cache_dir under the same file is named after it
                directory = output_directory(mode, parsed.multirun, [*hydra_overrides, *job])
            try:
                settings = settings_from_config(cfg)
                if error := unread_key_error(settings, OmegaConf.to_container(cfg, resolve=True), defaults[groups]):
                    raise error
            except OmegaConfBaseException as error:
                key = getattr(error, "full_key", None) or "config"
                raise InputError(f"{key}: {str(error).splitlines()[0]}") from None
    return directory


def output_directory(mode: str, multirun: bool, overrides: list[str]) -> tuple[str, Path]:
    """The run's directory as hydra resolves it (hydra.run.dir, or hydra.sweep.dir for -m; inside
    an initialized hydra), checked: it exists or can be created, and can be written in (InputError
    naming the key and the path in the way)."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    try:
        cfg = hydra.compose(config_name="config", overrides=[*overrides, f"mode={mode}"], return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)  # ${hydra:...} in the directory reads it
        value = OmegaConf.select(cfg, key, throw_on_missing=True)
    except (HydraException, OmegaConfBaseException) as error:
        raise InputError(f"{key}: cannot be resolved ({str(error).strip().splitlines()[0]})") from None
    path = Path(str(value))
    if problem := rundir.directory_problem(path):
        raise InputError(f"{key}: {problem}")
    return key, path


def launcher_error(name: object) -> InputError | None:
    """Why `hydra/launcher=name` cannot run here (unknown, or its extra is not installed), or None."""
    if name not in LAUNCHERS:
        return InputError(f"hydra/launcher: {name!r} is not a launcher phaze runs on; "
                           f"one of {', '.join(LAUNCHERS)}")
    extra, modules = LAUNCHERS[name]
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as error:
            return InputError(f"hydra/launcher: {name} needs the phaze[{extra}] extra ({error}); "
                               f"install it with: pip install 'phaze[{extra}]'")
    return None


def _quoted(value: str) -> str:
    """A string as a quoted hydra override value (interpolations kept)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _absolute(directory: str | None, cwd: Path) -> str:
    """A directory as a job elsewhere must be told it: a relative path against `cwd`, null (the
    per-user cache folder) as this user's on this machine."""
    if directory is None:
        return str(user_cache_dir())
    return directory if os.path.isabs(directory) else str(cwd / directory)


def remote_overrides(overrides: list[str], cwd: Path) -> list[str]:
    """The overrides of a sweep whose jobs may run elsewhere (a launcher other than basic): the
    sweep and cache directories made absolute against this directory (a job on a Ray or SLURM node
    starts where its worker did; a null cache_dir is this user's cache folder on this machine), and
    for Ray no object store size, so that joining a running cluster works (ray.init refuses one;
    hydra's Ray launcher sets one unless told)."""
    launcher = next((o.partition("=")[2] for o in overrides if _override_key(o) == "hydra/launcher"), "basic")
    if launcher == "basic":
        return overrides
    result, keys = [], {_override_key(o) for o in overrides}
    for override in overrides:
        key, _, value = override.partition("=")
        if _override_key(override) in DEFAULT_DIRECTORIES and "," not in value:
            value = value.strip("'\"")
            override = f"{key}={_quoted(_absolute(None if value == 'null' else value, cwd))}"
        result.append(override)
    result += [f"{key}={_quoted(_absolute(default, cwd))}" for key, default in DEFAULT_DIRECTORIES.items()
               if key not in keys]
    if launcher == "ray" and "hydra.launcher.ray.init.object_store_memory" not in keys:
        result.append("++hydra.launcher.ray.init.object_store_memory=null")
    return result


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def _run(cfg: DictConfig) -> None:
    try:
        settings = settings_from_config(cfg)
    except InputError as error:
        _fail(str(error))
    with interrupt.held():  # a signal waits until the modules have loaded (phaze/__main__.py)
        if settings.mode == "extract_graph":
            from phaze.modes.extract_graph import run
        elif settings.mode == "prepopulate_estimates":
            from phaze.modes.prepopulate_estimates import run
        elif settings.mode == "predict":
            from phaze.modes.predict import run
        else:
            from phaze.modes.run_solver import run
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    if multirun:  # a rerun of the job in the same directory starts without the last one's failure
        (Path(HydraConfig.get().runtime.output_dir) / sweep.FAILURE).unlink(missing_ok=True)
    try:
        run(settings)
        sweep.SWEEP.jobs += multirun
    except Exception as error:  # a sweep goes on; its summary lists the job
        if interrupt.received():  # the signal a library (torch's export) turned into another error
            raise KeyboardInterrupt from error
        if not multirun:
            if isinstance(error, Infeasible):
                _fail(f"hbm_size: {error}")
            from solver.ray_pool import ClusterUnavailable  # loaded already when Ray was asked for

            if isinstance(error, ClusterUnavailable):
                _fail(str(error))
            raise
        sweep.SWEEP.record(settings.mode, settings.spec.name, Path(HydraConfig.get().runtime.output_dir), error)


def main() -> None:
    arguments = sys.argv[1:]
    if arguments and arguments[0] == "report":
        from phaze.report import main as report

        sys.exit(report(arguments[1:]))
    if arguments and arguments[0] == "validate":
        from phaze.validate import main as validate

        sys.exit(validate(arguments[1:]))
    if not arguments or arguments[0] not in MODES:
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    mode, rest = arguments[0], arguments[1:]
    try:
        directory = check_command_line(mode, rest)
        parsed, flags = split_command_line(rest)
    except InputError as error:
        _fail(str(error))
    overrides = list(parsed.overrides)
    if directory is not None:
        key, path = directory
        directories = ("hydra.run.dir", "hydra.sweep.dir")
        command = [mode, *(["-m"] if parsed.multirun else []),
                   *sorted(o for o in overrides if _override_key(o) not in directories)]
        if problem := rundir.claim(path, command):
            _fail(f"{key}: {problem}")
        # hydra resolves the directory again (`${now:}` a moment later): it gets the one claimed
        overrides = [o for o in overrides if _override_key(o) != key] + [f"{key}={_quoted(str(path))}"]
    # hydra reads its flags and overrides with argparse, which takes the overrides as one run:
    # the overrides (and the mode) first, then the flags (`--help`, `--cfg job`, `-m`) wherever given.
    overrides = remote_overrides(overrides, Path.cwd()) if parsed.multirun else overrides
    sys.argv = [f"phaze-{mode}", *overrides, f"mode={mode}", *flags]
    _run()
    if sweep.SWEEP.failures:
        print("\n".join(sweep.SWEEP.summary()), file=sys.stderr)
        sys.exit(sweep.EXIT_CODE)


if __name__ == "__main__":
    main()
