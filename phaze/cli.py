"""The `phaze` command: `phaze <mode> [overrides]`, one hydra application for the three modes.

Every job of the command line (each point of a `-m` sweep) is checked before hydra starts, so a
wrong input prints one line, exits with code 2 and writes nothing.
"""

from __future__ import annotations

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

from phaze import sweep
from phaze.settings import MODES, ConfigError, model_name_error, settings_from_config, system_name_error
from phaze.sweep import Infeasible

#: This process's token in its run directory's name (`${run_token:}` in hydra.run.dir and
#: hydra.sweep.dir): two runs started in the same second write to different directories. Cached
#: in the config like `${now:}`, so every job of a sweep resolves the same sweep directory.
RUN_TOKEN = secrets.token_hex(4)
OmegaConf.register_new_resolver("run_token", lambda: RUN_TOKEN, use_cache=True, replace=True)

#: The jobs of this process's `-m` sweep that ended without a result (listed at the end, exit 1).
SWEEP = sweep.Sweep()
USAGE = (
    f"usage: phaze {{{','.join(MODES)}}} [-m] [key=value ...]   (phaze <mode> --help for the options)\n"
    "       phaze report DIR   (summarise the run_solver runs under DIR)\n"
    "       phaze validate FILE   (predict published measured runs and compare)"
)


def _fail(message: str) -> None:
    print(f"phaze: error: {message}", file=sys.stderr)
    sys.exit(2)


def check_command_line(mode: str, arguments: list[str]) -> None:
    """Compose the config of every job the arguments describe and validate it (ConfigError)."""
    parsed = get_args_parser().parse_args(arguments)
    if parsed.help or parsed.hydra_help or parsed.cfg or parsed.info or parsed.shell_completion:
        return
    try:
        overrides = OverridesParser.create().parse_overrides(parsed.overrides)
    except HydraException:
        return  # hydra reports its own syntax errors
    user_overrides = [o for o in overrides if not o.key_or_group.startswith("hydra")]
    jobs = BasicSweeper.split_arguments(user_overrides, None)[0] if user_overrides else [[]]
    with hydra.initialize_config_module(config_module="phaze.conf", version_base="1.3"):
        for job in jobs:
            for override in job:
                key, _, value = override.partition("=")
                if key.lstrip("+~") == "model" and (error := model_name_error(value)):
                    raise error
                if key.lstrip("+~") == "system" and (error := system_name_error(value)):
                    raise error
            try:
                cfg = hydra.compose(config_name="config", overrides=[*job, f"mode={mode}"])
            except (HydraException, OmegaConfBaseException):
                return  # an unknown key or a bad value type: hydra reports it when it runs
            settings_from_config(cfg)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def _run(cfg: DictConfig) -> None:
    try:
        settings = settings_from_config(cfg)
    except ConfigError as error:
        _fail(str(error))
    if settings.mode == "extract_graph":
        from phaze.modes.extract_graph import run
    elif settings.mode == "prepopulate_estimates":
        from phaze.modes.prepopulate_estimates import run
    elif settings.mode == "predict":
        from phaze.modes.predict import run
    else:
        from phaze.modes.run_solver import run
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        run(settings)
        SWEEP.jobs += multirun
    except Exception as error:  # a sweep goes on; its summary lists the job
        if not multirun:
            if isinstance(error, Infeasible):
                _fail(f"hbm_size: {error}")
            raise
        SWEEP.record(settings.mode, settings.spec.name, Path(HydraConfig.get().runtime.output_dir), error)


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
        check_command_line(mode, rest)
    except ConfigError as error:
        _fail(str(error))
    sys.argv = [f"phaze-{mode}", *rest, f"mode={mode}"]
    _run()
    if SWEEP.failures:
        print("\n".join(SWEEP.summary()), file=sys.stderr)
        sys.exit(sweep.EXIT_CODE)


if __name__ == "__main__":
    main()
