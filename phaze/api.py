"""phaze from Python (a notebook): `phaze.predict(...)` prices one layout on a chip that exists, and
`phaze.search(...)` runs what `phaze run_solver` runs. Their keywords are the command line's keys
(phaze/conf/config.yaml), with the same defaults and the same checks (phaze.settings), e.g.

    phaze.predict(model="llama3-70b", system="dgx_h100", num_devices=64, tensor_parallel_width=8,
                  pipeline_parallel_width=4, data_parallel_width=2, global_batch_size=128,
                  micro_batch_size=1, recompute="selective")

`model` is a zoo model's name, a path or `module:function` of a custom model (`model.config`), or a
`graph_extract.ModelSpec`; `chip` and `system` are a packaged name or a file's path
(`chip="my/chip.yaml"`, read and checked as the packaged files); a nested key is a mapping (`schedule={"backend": "milp"}`)
or a dotted string (`**{"schedule.backend": "milp"}`). Bad input raises `phaze_common.checks.InputError`
with the command line's one line. The caches are in the per-user cache folder
($XDG_CACHE_HOME/phaze, else ~/.cache/phaze), as the command line's, unless `cache_dir=` says
otherwise: nothing is written in the working directory.

What a prediction needs is kept in this process: the graphs (also cached on disk), the chip's layer
costs and the step model of each shard, so a second prediction of the same model on the same chip
only prices its layout.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pandas as pd

from phaze_common.checks import InputError
from phaze_common.progress import Progress
from graph_extract import ExtractedModel, ModelSpec, extract
from phaze.config_keys import (CUSTOM_MODEL, SYSTEM_FILE, config_key_error, config_schema, model_name_error,
                               system_group, system_name_error)
from phaze.settings import Settings, settings_from_config, unread_key_error
from solver.search import chip_costs
from solver.layer_costs import step_graphs
from solver.layout_step import Prediction, flops_per_micro_batch, megatron_placement, prediction
from solver.step_models import TrainingStepModel
from solver.training_step import StepGraph

#: Settings, graphs, layer costs and step models kept per process (each an LRU of this many entries).
KEPT = 64

log = logging.getLogger(__name__)
#: A value that is another key's: ${model.max_tensor_parallel_width}.
INTERPOLATION = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


@lru_cache(maxsize=KEPT)
def _defaults(model: str, system: str) -> dict:
    """The default configuration of a model and a system group option (hydra's composition), plain."""
    import hydra
    from omegaconf import OmegaConf

    with hydra.initialize_config_module(config_module="phaze.conf", version_base="1.3"):
        composed = hydra.compose(config_name="config", overrides=[f"model={model}", f"system={system}",
                                                                  "mode=run_solver"])
    return OmegaConf.to_container(composed, resolve=False)


@lru_cache(maxsize=KEPT)
def _resolved_defaults(model: str, system: str) -> dict:
    """`_defaults` with its interpolations resolved (read only)."""
    return _resolve(copy.deepcopy(_defaults(model, system)))


def _set(config: dict, key: str, value: object) -> None:
    """Set a dotted key; a mapping value merges into a mapping node."""
    *parents, last = key.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    if isinstance(value, Mapping) and isinstance(node.get(last), dict):
        for inner, item in value.items():
            _set(node[last], f"{inner}", item)
    else:
        node[last] = list(value) if isinstance(value, tuple) else value


def _resolve(config: dict) -> dict:
    """config.yaml's interpolations of another key (`max_tensor_parallel_width:
    ${model.max_tensor_parallel_width}`), read after the keywords are set, as hydra resolves them."""
    for key, value in config.items():
        if isinstance(value, str) and (found := INTERPOLATION.fullmatch(value)):
            node = config
            for part in found.group(1).split("."):
                node = node[part]
            config[key] = node
    return config


def _model_group(model: str | ModelSpec) -> str:
    """The model group option of the `model` keyword: a zoo model's name, or `custom` (a spec, a model
    file or a factory)."""
    if isinstance(model, ModelSpec) or (isinstance(model, str) and (
            ":" in model or "/" in model or model.endswith((".yaml", ".yml", ".json")))):
        return CUSTOM_MODEL
    return model


def configuration(mode: str, model: str | ModelSpec, keys: Mapping) -> tuple[dict, ModelSpec | None, dict]:
    """The configuration a command line with these keys would compose, the model when given as a spec,
    and the configuration without the keys (the defaults of that model and system); InputError for a
    key the configuration does not have."""
    system = keys.get("system", "tpuv4_pod")
    if error := system_name_error(system):
        raise error
    system, system_file = system_group(system)
    group = _model_group(model)
    if error := model_name_error(group):
        raise error
    default = _defaults(group, system)
    config, schema = copy.deepcopy(default), config_schema(default)
    if group == CUSTOM_MODEL:
        config["model"]["config"] = None if isinstance(model, ModelSpec) else model
    if system_file is not None:
        config["system"][SYSTEM_FILE] = system_file
    for key, value in keys.items():
        if key != "system":
            _set(config, key, value)
    config["mode"] = mode
    if error := config_key_error(config, schema):
        raise error
    return _resolve(config), model if isinstance(model, ModelSpec) else None, _resolved_defaults(group, system)


def _frozen(value: object) -> object:
    """A hashable stand-in for a keyword's value (memo keys)."""
    if isinstance(value, Mapping):
        return tuple(sorted((key, _frozen(item)) for key, item in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(item) for item in value)
    return value


@lru_cache(maxsize=KEPT)
def _settings(mode: str, model: str | ModelSpec, keys: tuple) -> Settings:
    config, spec, default = configuration(mode, model, {key: _thawed(value) for key, value in keys})
    checked = settings_from_config(config, spec)
    if error := unread_key_error(checked, config, default):
        raise error
    return checked


def _thawed(value: object) -> object:
    if isinstance(value, tuple) and value and all(isinstance(item, tuple) and len(item) == 2
                                                  and isinstance(item[0], str) for item in value):
        return {key: _thawed(item) for key, item in value}
    return list(value) if isinstance(value, tuple) else value


def settings(mode: str, model: str | ModelSpec = "bertlarge", **keys: object) -> Settings:
    """The checked settings of a run of `mode` with these keys (kept per process)."""
    try:
        return _settings(mode, model, tuple(sorted((key, _frozen(value)) for key, value in keys.items())))
    except TypeError as error:  # an unhashable value
        raise InputError(f"keywords: {error}") from None


@lru_cache(maxsize=KEPT)
def _graphs(spec: ModelSpec, micro_batch_size: int, sequence_length: int, width: int, cache_dir: Path,
            force: bool) -> ExtractedModel:
    with Progress(f"graph extraction of {spec.name}", 1, "graphs", log) as progress:
        extracted = extract(spec, micro_batch_size, sequence_length, width, cache_dir=cache_dir, force=force)
        progress.advance()
    return extracted


def graphs(settings: Settings) -> ExtractedModel:
    """The layer graphs of a prediction's tensor-parallel width (kept per process)."""
    question, axes = settings.question, settings.axes
    return _graphs(question.model, axes.micro_batch_size, question.sequence_length,
                   settings.layout.tensor_parallel_width, settings.cache_dir, settings.force_reextract)


class _Kept:
    """The last KEPT values made, each under the key of what it depends on (an LRU whose key is not
    the whole argument list: a new layout reuses the graph, the costs and the step of its shard)."""

    def __init__(self) -> None:
        self.values: OrderedDict = OrderedDict()

    def get(self, key: tuple, make: Callable[[], object]) -> object:
        if key in self.values:
            self.values.move_to_end(key)
            return self.values[key]
        value = self.values[key] = make()
        if len(self.values) > KEPT:
            self.values.popitem(last=False)
        return value


_STEP_GRAPHS, _STEPS, _FLOPS = _Kept(), _Kept(), _Kept()


def _graph_key(settings: Settings) -> tuple:
    """What a prediction's layer graph and its layer costs depend on."""
    question, axes = settings.question, settings.axes
    return (question.model, axes.micro_batch_size, question.sequence_length, settings.layout.tensor_parallel_width,
            settings.known_chip, question.kernels, settings.cache_dir, settings.schedule, settings.force_reextract)


def step_graph(settings: Settings) -> StepGraph:
    """The prediction's width of the layer graph with the chip's layer costs (kept per process)."""
    def make() -> StepGraph:
        width = settings.layout.tensor_parallel_width
        extracted = {width: graphs(settings)}
        costs = chip_costs(settings.question, settings.axes, extracted, settings.known_chip, settings.cache_dir,
                           settings.schedule)
        return step_graphs(extracted, costs)[width]

    return _STEP_GRAPHS.get(_graph_key(settings), make)


def run_prediction(settings: Settings) -> Prediction:
    """The prediction of checked settings (`phaze predict`'s), with what it needs kept per process:
    the step model of the layout's shard and the FLOPs of the model are shared by its layouts."""
    question, axes, layout = settings.question, settings.axes, settings.layout
    (recompute,) = axes.recompute
    graph = step_graph(settings)
    step = _STEPS.get((_graph_key(settings), question, axes, layout.shard), lambda: TrainingStepModel.step(
        question, axes, graph, settings.known_chip.hbm_bandwidth, layout.shard))
    flops = _FLOPS.get((_graph_key(settings), recompute), lambda: flops_per_micro_batch(graphs(settings), recompute,
                                                                   question.kernels))
    return prediction(question, axes, step, megatron_placement(graph, layout, recompute), settings.known_chip, flops)


def predict(model: str | ModelSpec = "bertlarge", **keys: object) -> Prediction:
    """One training step of a layout on a chip that exists (module docstring): a `Prediction` with
    `time_per_batch_s`, `breakdown_s`, `memory_bytes` (the busiest device's, by kind), `tokens_per_s`,
    `mfu`, `fits`, `reason` and `group_tiers` (the tier each parallel group's slowest link is on)."""
    return run_prediction(settings("predict", model, **keys))


@dataclass(frozen=True)
class SearchResults:
    """What `phaze.search` found: `best` (best.json's record: the best chip and placement of every
    (micro-batch, HBM) setting, with its baselines) and `evaluations` (the results table: one row per
    chip, setting and recomputation mode evaluated)."""

    best: dict
    evaluations: pd.DataFrame

    @property
    def throughput(self) -> float:
        """The best throughput [samples/s] (0 when nothing fits)."""
        return float(self.best.get("throughput", 0.0))

    def to_pandas(self) -> pd.DataFrame:
        """The evaluations as a DataFrame (a copy)."""
        return self.evaluations.copy()


def search(model: str | ModelSpec = "bertlarge", directory: str | Path | None = None, **keys: object
           ) -> SearchResults:
    """What `phaze run_solver` does with these keys: the best chip and placement (or, on a chip that
    exists, the best placement). Its files (best.json, results, plots) go to `directory`, or to a
    temporary folder removed after reading them back."""
    from phaze.search_run import execute
    from phaze.results import read_table

    checked = settings("run_solver", model, **keys)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(directory) if directory is not None else Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        best = execute(checked, folder)
        table = read_table(folder)
        best = json.loads(json.dumps(best))
    return SearchResults(best, table)
