"""Stage 1 of phaze: the model zoo, meta-device tracing, op graphs, layer graphs and repeats."""

from graph_extract.extraction import ExtractedModel, extract, valid_tensor_parallel_widths
from graph_extract.kernels import KernelOptions
from graph_extract.layergraph import Layer, LayerEdge, LayerGraph
from graph_extract.opgraph import GemmDims, OpGraph, OpNode
from graph_extract.verify import VerificationResult, verify_tensor_parallel
from graph_extract.zoo import MODELS, ModelSpec, get_spec

__all__ = [
    "MODELS",
    "ExtractedModel",
    "GemmDims",
    "KernelOptions",
    "Layer",
    "LayerEdge",
    "LayerGraph",
    "ModelSpec",
    "OpGraph",
    "OpNode",
    "VerificationResult",
    "extract",
    "get_spec",
    "valid_tensor_parallel_widths",
    "verify_tensor_parallel",
]
