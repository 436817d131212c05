"""Stage 1 of phaze: the model zoo, meta-device tracing, op graphs, layer graphs and repeats.

The names below load their module on first use: the graphs and their passes (opgraph, layergraph,
kernels, regions, zoo) and `extract` reading a cached graph import no torch, so the command line, the
search's workers and a run from cached graphs start without it (about 1.5 s); tracing or exporting a
model (a graph not in the cache, `verify`, a factory's or a config.json's model) imports torch when
first asked for.
"""

from importlib import import_module

_MODULES = {
    "ExtractedModel": "extraction",
    "extract": "extraction",
    "valid_tensor_parallel_widths": "extraction",
    "KernelOptions": "kernels",
    "Layer": "layergraph",
    "LayerEdge": "layergraph",
    "LayerGraph": "layergraph",
    "GemmDims": "opgraph",
    "OpGraph": "opgraph",
    "OpNode": "opgraph",
    "VerificationResult": "verify",
    "verify_tensor_parallel": "verify",
    "MODELS": "zoo",
    "ModelSpec": "zoo",
    "get_spec": "zoo",
}

__all__ = sorted(_MODULES)


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(f"module 'graph_extract' has no attribute {name!r}")
    value = getattr(import_module(f"graph_extract.{_MODULES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
