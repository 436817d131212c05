"""The system architecture space (`architecture_space=system`): each compute candidate of the original
space with each HBM (generation × stacks) and each set of scale-up links (generation × links per
chip) of arch_configs/system_space.yaml, under budgets of die area, peak power and cost, for one of
three objectives.

A *system option* is one HBM and one set of links. It sets the chip's HBM bandwidth (the estimator's
GLB ← HBM boundary and the optimizer step), its HBM capacity (the memory a placement may fill: an
outcome, not a swept setting) and its cluster (the system's scale-up tier scaled by the option's link
bandwidth over the system's own chip's), and it takes die area (PHYs and controllers), power and
cost (phaze_hardware/offchip.py, power.py, cost.py). The compute candidates of an option are those whose
die (compute + interfaces) fits the area budget and whose chip fits the power and cost budgets.

The search is exact: a best-first search over the options (`strategies.bounded`) on two bounds that
hold in every new dimension, then, within an option, phaze's bounded search with the best value
found so far as its floor. A chip with less HBM bandwidth, less HBM capacity or slower links is
never faster (every operator's latency and the step model's lower bound are monotone in each), so an
option's first bound comes from one throughput bound of the space at the options' most HBM
bandwidth, capacity and link bandwidth; its second, at its own. An option dominated by an earlier
one (as much bandwidth, capacity and link bandwidth in no more die area, and no more offchip power
or HBM cost where a budget or the objective counts them) is left out: the same compute with the
dominating option is as fast and within the same budgets. This takes the evaluation itself, not
only its bound, to be monotone (the layer schedules solved to optimality, as CP-SAT does on these
layers). The options are listed in the order that breaks ties (the smaller die, then the dominating
one first: `system_design`), in both strategies. `exhaustive` evaluates every candidate of every
option.

Objectives (each bounded by a weight × the throughput bound, `solver.search.Objective`):
  throughput         samples/s
  tokens_per_dollar  tokens/s per dollar of chips (chip cost × devices): exact weight
  tokens_per_joule   tokens per joule of the step: the layers' energy (the estimator's MACs and
                     accesses at the node's and the HBM's energies) plus the chips' idle power over
                     the step; the bound takes the dynamic energy as zero.
Simplifications: the links' energy per step is not counted (their traffic is not summed yet), only
their peak power; the scale-up domain is the system's (its node or slice), not searched; a chip's
objective is its best-throughput placement's.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType

import numpy as np
from omegaconf import OmegaConf

from phaze_common.checks import InputError, choice, integer, positive_integer, unknown_fields
from estimator import CandidateSpace
from phaze_hardware import AcceleratorConfig, Network
from phaze_hardware.cost import cost_model
from phaze_hardware.data import arch_config
from phaze_hardware.offchip import MOST_STACKS, Memory, ScaleUp, hbm_generations, link_generations
from phaze_hardware.power import power_model
from phaze_hardware.torus import Torus
from solver import strategies
from solver.search import Baseline, CandidateOutcome, Objective, Resources, Search, SearchContext
from solver.search.driver import baseline_missing, prepare_item
from solver.search.resources import bounds_path
from solver.evaluate import Evaluation
from solver.workers import WorkerPool

SYSTEM_SPACE = arch_config("system_space.yaml")
ARCHITECTURE_SPACES = ("original", "system")
OBJECTIVES = ("throughput", "tokens_per_joule", "tokens_per_dollar")
#: The strategies the system space runs (the original's area sweep has no meaning across memories).
SYSTEM_STRATEGIES = ("bounded", "exhaustive")
SPACE_FIELDS = ("hbm_generations", "hbm_stacks", "link_generations", "links", "technology_node", "references")


@dataclass(frozen=True)
class Budgets:
    """What a chip may take: µm² of die (compute and the HBM's and links' interfaces), W at its peak,
    $ to make; None: no bound."""

    area: float
    power: float | None = None
    cost: float | None = None


@dataclass(frozen=True)
class SystemOption:
    """One HBM and one set of scale-up links, with the cluster its links give."""

    memory: Memory
    links: ScaleUp
    cluster: Network = field(compare=False, repr=False)

    @property
    def area(self) -> float:
        """µm² of die its interfaces take."""
        return self.memory.area + self.links.area

    def record(self) -> dict:
        return {**self.memory.record(), **self.links.record()}

    def name(self) -> str:
        return (f"{self.memory.stacks} x {self.memory.generation.name}, "
                f"{self.links.links} x {self.links.generation.name}")


@dataclass(frozen=True)
class SystemDesign:
    """The system space of a run: its options (in the order that breaks ties), budgets, objective and
    process node."""

    options: tuple[SystemOption, ...]
    budgets: Budgets
    objective: str
    node: str
    reference: SystemOption  # the system's own chip's memory and links

    @property
    def compute_budget(self) -> float:
        """µm² the compute candidates may take: the die budget less the smallest interfaces."""
        return self.budgets.area - min(option.area for option in self.options)

    def dominates(self, first: SystemOption, second: SystemOption) -> bool:
        """Is every chip with `second` matched by the same compute with `first`: at least as fast (as
        much HBM bandwidth and capacity and link bandwidth), within every budget it meets (no more die
        area, offchip power or HBM cost where a budget counts them), and at least as good in the
        objective? Never decided for tokens per joule (the best-throughput placement's energy is not
        monotone in these)."""
        if self.objective == "tokens_per_joule":
            return False
        power = power_model()
        checks = [first.memory.bandwidth >= second.memory.bandwidth, first.memory.capacity >= second.memory.capacity,
                  first.links.bandwidth >= second.links.bandwidth, first.area <= second.area]
        if self.budgets.power is not None:
            checks.append(power.offchip_power(self.node, first.memory, first.links)
                          <= power.offchip_power(self.node, second.memory, second.links))
        if self.budgets.cost is not None or self.objective == "tokens_per_dollar":
            checks.append(first.memory.cost <= second.memory.cost)
        return all(checks)

    def undominated(self) -> list[int]:
        """Positions of the options no earlier option dominates (a dominated option's best is at most
        the dominating one's, which comes first in the tie order: it can never be the answer)."""
        return [position for position, option in enumerate(self.options)
                if not any(self.dominates(earlier, option) for earlier in self.options[:position])]


@cache
def _space_file() -> dict:
    data = OmegaConf.to_container(OmegaConf.load(SYSTEM_SPACE))
    unknown_fields("system_space.yaml", data, SPACE_FIELDS)
    return data


def reference_option(system_name: str, cluster: Network) -> SystemOption:
    """The memory and links of a system's own chip (system_space.yaml's `references`)."""
    references = _space_file()["references"]
    entry = references.get(system_name)
    if entry is None:
        raise InputError(f"architecture_space: system {system_name!r} has no reference memory and links in "
                         f"arch_configs/system_space.yaml; allowed systems: {', '.join(references)}")
    domain = cluster.link.devices if isinstance(cluster, Torus) else cluster.tiers[0].devices  # a slice, or a node
    return SystemOption(Memory.of(entry["hbm_generation"], entry["hbm_stacks"]),
                        ScaleUp.of(entry["link_generation"], entry["links"], domain), cluster)


#: The lists of system_space.yaml a run may replace (`system_space.<name>=[...]`).
SWEPT = ("hbm_generations", "hbm_stacks", "link_generations", "links")


def _swept(data: dict, overrides: Mapping) -> dict:
    """The space's lists with the run's `overrides` (None: the file's), checked: one line naming the
    key and the allowed values."""
    unknown_fields("system_space", overrides, SWEPT)
    lists = {}
    for name in SWEPT:
        value = overrides.get(name)
        where = "system_space.yaml: " if value is None else "system_space."
        value = data[name] if value is None else value
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        if not items:
            raise InputError(f"{where}{name}: must list at least one value")
        for item in items:
            if name == "hbm_generations":
                choice(f"{where}{name}", item, tuple(hbm_generations()))
            elif name == "link_generations":
                choice(f"{where}{name}", item, tuple(link_generations()))
            elif name == "hbm_stacks":
                integer(f"{where}{name}", item, 1, MOST_STACKS)
            else:
                positive_integer(f"{where}{name}", item, 64)
        lists[name] = list(dict.fromkeys(items))
    return lists


def system_design(system_name: str, cluster_at: Callable[[float], Network], template: AcceleratorConfig,
                  objective: str, area_budget: float | None, power_budget: float | None,
                  cost_budget: float | None, overrides: Mapping = MappingProxyType({})) -> SystemDesign:
    """The system space on a system: `cluster_at(scale)` is its cluster with the scale-up tier's
    bandwidth × scale; `overrides` replace system_space.yaml's lists. The default die budget is the
    template's compute area and the system's own chip's interfaces."""
    data = {**_space_file(), **_swept(_space_file(), overrides)}
    objective = choice("objective", objective, OBJECTIVES)
    node = choice("system_space.yaml: technology_node", data["technology_node"], tuple(power_model().nodes))
    reference = reference_option(system_name, cluster_at(1.0))
    options = []
    for generation in data["hbm_generations"]:
        for stacks in data["hbm_stacks"]:
            memory = Memory.of(generation, stacks)
            for link_generation in data["link_generations"]:
                for count in data["links"]:
                    links = ScaleUp.of(link_generation, count, reference.links.domain)
                    options.append(SystemOption(memory, links, cluster_at(links.bandwidth / reference.links.bandwidth)))
    budgets = Budgets(template.area + reference.area if area_budget is None else area_budget, power_budget, cost_budget)
    power = power_model()
    options.sort(key=lambda option: (option.area, -option.memory.bandwidth, -option.memory.capacity,
                                     -option.links.bandwidth, power.offchip_power(node, option.memory, option.links),
                                     option.memory.cost))  # the tie order: a dominating option first (stable)
    design = SystemDesign(tuple(options), budgets, objective, node, reference)
    if design.compute_budget <= 0:
        raise InputError(f"area_budget: {budgets.area:,.0f} µm² leaves no room for compute beside the smallest "
                         f"memory and links ({budgets.area - design.compute_budget:,.0f} µm²)")
    return design


@dataclass(frozen=True)
class ChipFigures:
    """Per compute candidate of the space, with one option: die area [µm²], peak and idle power [W],
    cost [$], and whether the budgets admit it."""

    die_area: np.ndarray
    peak_power: np.ndarray
    idle_power: np.ndarray
    cost: np.ndarray
    admitted: np.ndarray


def chip_figures(space: CandidateSpace, design: SystemDesign, option: SystemOption) -> ChipFigures:
    """`ChipFigures` of every candidate of `space` with `option` (phaze_hardware.power and phaze_hardware.cost,
    vectorised: the compute part's and the option's parts add up)."""
    power, template, node = power_model(), space.template, design.node
    busy = power.busy_cores(template, node, space.num_tc, space.width, space.depth, space.num_vc, space.width)
    die_area = space.area + option.area
    idle = power.die_idle_power(die_area, node, option.memory)
    peak = idle + sum(busy.values()) + sum(power.traffic_power(option.memory, option.links).values())
    cost = cost_model().chip_cost(die_area, node, option.memory)
    budgets = design.budgets
    admitted = die_area <= budgets.area
    if budgets.power is not None:
        admitted &= peak <= budgets.power
    if budgets.cost is not None:
        admitted &= cost <= budgets.cost
    return ChipFigures(die_area, peak, idle, cost, admitted)


def objective_of(design: SystemDesign, figures: ChipFigures, question) -> Objective | None:
    """The search's objective for one option's candidates (None: the throughput itself)."""
    tokens, devices = question.sequence_length, question.cluster.num_devices
    if design.objective == "throughput":
        return None
    if design.objective == "tokens_per_dollar":
        weights = tokens / (devices * figures.cost)
        return Objective(weights, lambda index, evaluation: evaluation.throughput * weights[index])
    weights = tokens / (devices * figures.idle_power)

    def per_joule(index: int, evaluation: Evaluation) -> float:
        return tokens_per_joule(evaluation, question, float(figures.idle_power[index]))

    return Objective(weights, per_joule)


def tokens_per_joule(evaluation: Evaluation, question, idle_power: float) -> float:
    """Tokens a joule: a batch's tokens over its layers' energy and the chips' idle power over its time."""
    if not evaluation.feasible:
        return 0.0
    tokens = question.global_batch_size * question.sequence_length
    energy = evaluation.energy_per_batch + question.cluster.num_devices * idle_power * evaluation.placement.time_per_batch
    return tokens / energy


@dataclass
class OptionOutcome:
    """An option's search: its best candidate (None: none reached the floor) and its value."""

    option: SystemOption
    resources: Resources
    figures: ChipFigures
    candidates: np.ndarray  # the compute candidates the budgets admit
    best: CandidateOutcome | None = None
    value: float = 0.0
    evaluated: int = 0
    optimistic: np.ndarray | None = None  # the candidates' throughput bounds with this option


class SystemSearch:
    """The search over the system options of one micro-batch size (module docstring).

    `on_outcome(option, figures, outcome)` sees every candidate evaluation as it arrives."""

    def __init__(self, context: SearchContext, design: SystemDesign, pool=None,
                 on_outcome: Callable[[SystemOption, ChipFigures, CandidateOutcome], None] = lambda *_: None,
                 candidates: Sequence[int] | None = None) -> None:
        self.context, self.design, self.pool, self.on_outcome = context, design, pool, on_outcome
        self.sample = None if candidates is None else np.asarray(candidates)
        self.outcomes: dict[int, OptionOutcome] = {}
        self.best_value = 0.0
        self._base: dict[float, Resources] = {}  # one per HBM bandwidth: the graphs, table and group bounds
        self._memos: dict[str, dict] = {}  # placement memos by cluster
        self._bandwidths: set[float] = set()  # the HBM bandwidths whose group bounds are computed or asked for

    def template(self, memory: Memory) -> AcceleratorConfig:
        """The template with this HBM: its bandwidth, and the node's and the HBM's energies."""
        template = self.context.template
        energy = power_model().energy_costs(template, self.design.node, memory)
        return dataclasses.replace(template, hbm_bandwidth=memory.bandwidth, energy=energy)

    def _context(self, memory: Memory, capacity: float, cluster: Network) -> SearchContext:
        """The search context at this HBM, capacity and cluster."""
        question = dataclasses.replace(self.context.question, cluster=cluster)
        return dataclasses.replace(self.context, question=question, template=self.template(memory),
                                   area_budget=self.design.compute_budget,
                                   axes=self.context.axes.at(memory_capacity=int(capacity)))

    @staticmethod
    def _first(options: Sequence[SystemOption]) -> tuple[Memory, float, Network]:
        """The HBM, capacity and cluster of the options' first bound: the most HBM bandwidth, capacity
        and link bandwidth of any of them."""
        fastest = max(options, key=lambda option: option.memory.bandwidth).memory
        most = max(option.memory.capacity for option in options)
        return fastest, most, max(options, key=lambda option: option.links.bandwidth).cluster

    def prepare(self, baselines: Sequence[Baseline] = ()) -> None:
        """Compute on the local workers, side by side, into the cache folder: the group bounds of the
        first bound's HBM bandwidth and the evaluations of `baselines` (those not cached; the run's
        record reads them). Ray's workers keep no cache folder: there, each is computed in the driver
        when needed."""
        if not isinstance(self.pool, WorkerPool):
            return
        memory, capacity, cluster = self._first([self.design.options[p] for p in self.design.undominated()])
        self._bandwidths.add(memory.bandwidth)
        self._bounds_on_workers([self._context(memory, capacity, cluster)],
                                [baseline for baseline in baselines if baseline_missing(baseline)])

    def _prepare_bounds(self, positions: list[int]) -> None:
        """Compute on the local workers, one task per width, the group bounds of the HBM bandwidths of
        these options that no one computed yet."""
        if not isinstance(self.pool, WorkerPool):
            return
        contexts: dict[float, SearchContext] = {}
        for position in positions:
            option = self.design.options[position]
            if option.memory.bandwidth not in self._bandwidths:
                self._bandwidths.add(option.memory.bandwidth)
                contexts[option.memory.bandwidth] = self._context(option.memory, option.memory.capacity, option.cluster)
        self._bounds_on_workers(list(contexts.values()))

    def _bounds_on_workers(self, contexts: list[SearchContext], baselines: Sequence[Baseline] = ()) -> None:
        """The group bounds of these contexts not in the cache folder, one task per width, and the
        evaluations of `baselines`, computed on the workers side by side; the bounds are kept (in
        the cache folder and the driver's resources of each HBM bandwidth)."""
        missing = [self._base_resources(context) for context in contexts if not bounds_path(context).exists()]
        widths = [(resources.context, width) for resources in missing for width in resources.graphs]
        if not widths and not baselines:
            return
        # the baselines first: a whole chip's evaluations take longer than one width's bounds
        found = self.pool.call(prepare_item, [(item,) for item in (*baselines, *widths)])[len(baselines):]
        computed = dict(zip(((id(context), width) for context, width in widths), found))
        for resources in missing:
            resources.group_bounds(lambda chosen, key=id(resources.context): [computed[key, w] for w in chosen])

    def _base_resources(self, context: SearchContext) -> Resources:
        """The resources shared by the options of the context's HBM bandwidth (built on first use)."""
        bandwidth = context.template.hbm_bandwidth
        if bandwidth not in self._base:
            self._base[bandwidth] = Resources.build(context)
        return self._base[bandwidth]

    def _resources(self, memory: Memory, capacity: float, cluster: Network) -> Resources:
        """Resources at this HBM, capacity and cluster, sharing the group bounds of its HBM bandwidth."""
        context = self._context(memory, capacity, cluster)
        base = self._base_resources(context)
        # the placement memo is one question's: one per cluster (its key holds the HBM and the capacity)
        memo = self._memos.setdefault(json.dumps(cluster.to_dict(), sort_keys=True), {})
        return dataclasses.replace(base, context=context, memo=memo)

    def candidates(self, figures: ChipFigures) -> np.ndarray:
        """The compute candidates the budgets admit with an option (of the sample, if any)."""
        admitted = np.flatnonzero(figures.admitted)
        return admitted if self.sample is None else np.intersect1d(admitted, self.sample)

    def option_outcome(self, position: int) -> OptionOutcome:
        if position not in self.outcomes:
            option = self.design.options[position]
            resources = self._resources(option.memory, option.memory.capacity, option.cluster)
            figures = chip_figures(resources.space, self.design, option)
            self.outcomes[position] = OptionOutcome(option, resources, figures, self.candidates(figures))
        return self.outcomes[position]

    def _bound(self, optimistic: np.ndarray, candidates: np.ndarray, figures: ChipFigures, question) -> float:
        """The most any of `candidates` could reach, from their throughput bounds `optimistic`."""
        if not len(candidates):
            return 0.0
        objective = objective_of(self.design, figures, question)
        return float(np.max(optimistic if objective is None else optimistic * objective.weights[candidates]))

    def first_bounds(self, positions: list[int]) -> list[float]:
        """Each option's bound from one throughput bound of the space: at the most HBM bandwidth (the
        group bounds of its faster layers), capacity and link bandwidth of any option."""
        options = [self.design.options[position] for position in positions]
        resources = self._resources(*self._first(options))
        optimistic = Search(resources).optimistic()
        bounds = []
        for option in options:
            figures = chip_figures(resources.space, self.design, option)
            candidates = self.candidates(figures)
            bounds.append(self._bound(optimistic[candidates], candidates, figures, resources.question))
        return bounds

    def optimistic(self, found: OptionOutcome) -> np.ndarray:
        """The option's candidates' throughput bounds at its own HBM, capacity and links."""
        if found.optimistic is None:
            found.optimistic = Search(found.resources, candidates=found.candidates).optimistic()
        return found.optimistic

    def _refine(self, positions: list[int]) -> list[float]:
        self._prepare_bounds(positions)
        values = []
        for position in positions:
            found = self.option_outcome(position)
            values.append(self._bound(self.optimistic(found), found.candidates, found.figures,
                                      found.resources.question))
        return values

    def _evaluate(self, strategy: str, positions: list[int]) -> list[float]:
        """Each option's best value: its candidates searched (bounded: with the best so far as the
        floor; its best is then None when none reaches it)."""
        values = []
        for position in positions:
            found = self.option_outcome(position)
            if not len(found.candidates):
                values.append(0.0)
                continue
            bounded = strategy == "bounded"
            objective = objective_of(self.design, found.figures, found.resources.question)
            search = Search(found.resources, self.pool,
                            lambda outcome, found=found: self.on_outcome(found.option, found.figures, outcome),
                            found.candidates.tolist(), objective, self.best_value if bounded else 0.0,
                            self.optimistic(found) if bounded else None)
            result = search.run(strategy, int(found.option.memory.capacity))
            found.evaluated = len(result.evaluated)
            if result.best is not None:
                found.best = search.outcomes[search.candidates[result.best]]
                found.value = result.best_throughput
                self.best_value = max(self.best_value, found.value)
            values.append(found.value)
        return values

    def run(self, strategy: str) -> tuple[OptionOutcome | None, int]:
        """The best option's outcome (None when nothing fits) and the architectures evaluated. Ties go
        to the earlier option (`SystemDesign.options`' order); `bounded` leaves out the dominated."""
        if strategy not in SYSTEM_STRATEGIES:
            raise InputError(f"search: architecture_space=system searches with {' or '.join(SYSTEM_STRATEGIES)}; "
                             f"got {strategy}")
        if strategy == "exhaustive":
            positions = list(range(len(self.design.options)))
            found = strategies.exhaustive(len(positions), lambda chosen: self._evaluate(strategy, chosen), 1,
                                          positions)
            best = found.best
        else:
            positions = self.design.undominated()
            first = np.array(self.first_bounds(positions))
            found = strategies.bounded(first,
                                       [lambda chosen: self._refine([positions[i] for i in chosen])],
                                       lambda chosen: self._evaluate(strategy, [positions[i] for i in chosen]), 1,
                                       positions)
            best = None if found.best is None else positions[found.best]
        evaluated = sum(outcome.evaluated for outcome in self.outcomes.values())
        return (None if best is None else self.outcomes[best]), evaluated
