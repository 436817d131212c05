"""Placement: the exact placement search under the training-step model (best.py: the DP with caps,
capped.py; Megatron's layouts, layouts.py) and the original program's placement DP
(`place_original(graphs, settings)` with one `PlacementGraph` per tensor-parallel width, or
`python -m solver.placement INPUT.json OUTPUT.json` on the original program's JSON files).
See README.md in this folder for the cost model and what differs from the original.
"""

from .inputs import FixedStrategy, PlacementEdge, PlacementGraph, PlacementLayer, PlacementSettings
from .original_dp import place_original
from .result import PlacedStage, PlacementResult

__all__ = [
    "FixedStrategy",
    "PlacedStage",
    "PlacementEdge",
    "PlacementGraph",
    "PlacementLayer",
    "PlacementResult",
    "PlacementSettings",
    "place_original",
]
