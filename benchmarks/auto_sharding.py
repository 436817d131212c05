"""Solve time of the intra-operator sharding ILP (solver.auto_sharding) on one BERT-large-sized
encoder layer and one mixture-of-experts layer, on a one-axis mesh of 8 devices and a 2 × 4 mesh
(ring collectives; the outer axis of the 2 × 4 mesh 8 times slower per byte, as between nodes).
Target: at most 1 s each on 2 cores. Each row gives the best of `--repeats` runs, the ILP's
variables (shrunk graph; `--no-shrink`: one group per operator), the status and the objective.

    python benchmarks/auto_sharding.py [--repeats 3] [--no-shrink]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from solver.auto_sharding import CostSettings, DeviceMesh, bert_layer, moe_layer, solve  # noqa: E402

#: An H100-like link: 10 µs per step, 25 GB/s per direction within a node, 8 times less across.
ALPHA, BETA = 1e-5, 1 / 25e9
#: 400 TFLOP/s at bf16 (2-byte elements).
SETTINGS = CostSettings(seconds_per_flop=1 / 400e12, state_bytes_per_parameter=14.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-shrink", action="store_true")
    arguments = parser.parse_args()
    meshes = {
        "1-D 8": DeviceMesh.alpha_beta({"x": 8}, ALPHA, BETA),
        "2-D 2x4": DeviceMesh.alpha_beta({"node": 2, "gpu": 4}, ALPHA, {"node": 8 * BETA, "gpu": BETA}),
    }
    layers = {
        "bert-large layer (b 8, s 512)": bert_layer(8, 512, 1024, 16, 4096, element_bytes=2),
        "moe layer (4096 tokens, 8 experts, top 2)": moe_layer(4096, 1024, 4096, 8, 2, element_bytes=2,
                                                               groups=8),
    }
    print(f"{'layer':44} {'mesh':8} {'seconds':>8} {'variables':>9} {'status':8} {'objective [ms]':>14}")
    for layer_name, graph in layers.items():
        for mesh_name, mesh in meshes.items():
            plans = [solve(graph, mesh, SETTINGS, shrink=not arguments.no_shrink) for _ in range(arguments.repeats)]
            plan = min(plans, key=lambda p: p.solve_seconds)
            print(f"{layer_name:44} {mesh_name:8} {plan.solve_seconds:8.3f} {plan.variables:9d} {plan.status:8} "
                  f"{plan.objective * 1e3:14.3f}")


if __name__ == "__main__":
    main()
