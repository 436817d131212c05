"""Stage 2 of phaze: the candidate space of the template chip (phaze_hardware.AcceleratorConfig), operator
classification and fusion, vectorised latency/energy estimates with a persistent cache, and the
roofline of a known chip."""

from estimator.cache import TC_MODEL_VERSION

#: Version of the cost models (the tensor-core model's, then operator work, fusion, latencies); part
#: of the key of every value computed from them. Bump when an estimate of the same inputs changes.
MODEL_VERSION = (TC_MODEL_VERSION, 2)

from estimator.cache import default_cache_dir
from estimator.fusion import FusedGraph, FusedOp, fuse_layers
from estimator.space import CandidateSpace, candidate_space
from estimator.table import EstimateTable
from estimator.tc_model import GemmCost, MemorySystem, gemm_cost, tc_gemm_cycles
from estimator.work import Gemm, VectorTerm, Work, core_type, op_work
from estimator.workload import (
                                FusedEstimate,
                                FusedLayer,
                                PreparedLayer,
                                default_table,
                                estimate,
                                layer_workload,
                                prepare_layer,
                                prepopulate,
)

__all__ = [
    "MODEL_VERSION",
    "CandidateSpace",
    "EstimateTable",
    "FusedEstimate",
    "FusedGraph",
    "FusedLayer",
    "FusedOp",
    "Gemm",
    "GemmCost",
    "MemorySystem",
    "PreparedLayer",
    "VectorTerm",
    "Work",
    "candidate_space",
    "core_type",
    "default_cache_dir",
    "default_table",
    "estimate",
    "fuse_layers",
    "gemm_cost",
    "layer_workload",
    "op_work",
    "prepare_layer",
    "prepopulate",
    "tc_gemm_cycles",
]
