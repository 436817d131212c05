"""The co-design search: candidates of a question's chip space evaluated in parallel and cached.

`keys` (what a cached result is keyed by), `resources` (what a process holds to evaluate
candidates), `outcomes` (one candidate evaluated through the caches) and `driver` (the strategies
run over the candidates).
"""

from solver.search.driver import STRATEGIES, Baseline, Objective, Search, evaluate_baseline
from solver.search.keys import ScheduleSettings, SearchContext
from solver.search.outcomes import CandidateOutcome, accelerator_costs, chip_costs, evaluate_accelerator
from solver.search.resources import EXECUTORS, Resources, worker_pool

__all__ = ["EXECUTORS", "STRATEGIES", "Baseline", "CandidateOutcome", "Objective", "Resources", "ScheduleSettings", "Search",
           "SearchContext", "accelerator_costs", "chip_costs", "evaluate_accelerator", "evaluate_baseline",
           "worker_pool"]
