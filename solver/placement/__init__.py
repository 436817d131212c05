"""Placement DP: pipeline stages × tensor-parallel width × data-parallel degree for a layer graph.

Call `solve(graphs, settings)` with one `PlacementGraph` per tensor-parallel width; or run
`python -m solver.placement INPUT.json OUTPUT.json` on the original program's JSON files.
See README.md in this folder for the cost model and what differs from the original.
"""

from .inputs import FixedStrategy, PlacementEdge, PlacementGraph, PlacementLayer, PlacementSettings
from .result import PlacedStage, PlacementResult
from .solve import solve

__all__ = [
    "FixedStrategy",
    "PlacedStage",
    "PlacementEdge",
    "PlacementGraph",
    "PlacementLayer",
    "PlacementResult",
    "PlacementSettings",
    "solve",
]
