"""Solve time and gap of the per-layer scheduling backends on transformer blocks.

For each sampled accelerator, the forward and backward graphs of one bertlarge block (micro-batch 1,
no tensor parallelism) and one megatrongpt3 block (micro-batch 1, tensor-parallel width 8) are
scheduled by every backend; the table gives the median and max solve time and gap per (model,
direction, backend), and how far each backend's makespan is above the best any backend found.
Target (DESIGN.md): cpsat median < 0.5 s with gap <= 1 %.

--graphs real (default): the blocks from graph_extract and the estimator, priced for accelerators
drawn from the candidate space. --graphs synthetic: hand-built graphs of the same blocks with
separate weight-gradient GEMMs (31 and 26 operators backward), priced by a roofline on sampled
cores: a harder test of the solver than the real graphs, whose backward operators carry both
gradients of a GEMM.

    python benchmarks/schedule.py [--graphs real|synthetic] [--configs 20] [--time-limit 10]
                                  [--relative-gap 0.01] [--backends cpsat,milp,milp-highs,heuristic]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from estimator import candidate_space, layer_workload  # noqa: E402
from graph_extract import ExtractedModel, extract  # noqa: E402
from phaze_hardware import AcceleratorConfig, Cluster  # noqa: E402
from solver.schedule import Op, ScheduleProblem, ScheduleResult, solve  # noqa: E402


@dataclass(frozen=True)
class SyntheticChip:
    """One sampled accelerator: core counts, per-core peak and bandwidth, intra-op efficiency."""

    num_tc: int
    num_vc: int
    tc_flops: float  # FLOP/s of one tensor core
    vc_bandwidth: float  # B/s of one vector core
    efficiency: float  # speed-up of an intra-op-parallel run over one core, per core
    link_bandwidth: float  # B/s of the tensor-parallel all-reduce


@dataclass(frozen=True)
class BlockShape:
    """A transformer block's sizes on one tensor-parallel shard."""

    hidden: int
    heads: int
    sequence: int
    batch: int
    tensor_parallel: int
    separate_qkv: bool  # HF BERT has three q/k/v GEMMs, Megatron one fused QKV GEMM


MODELS = ("bertlarge", "megatrongpt3")
REAL_MODELS = {"bertlarge": {"micro_batch_size": 1, "tensor_parallel_width": 1},
               "megatrongpt3": {"micro_batch_size": 1, "tensor_parallel_width": 8}}
SYNTHETIC_MODELS = {
    "bertlarge": BlockShape(hidden=1024, heads=16, sequence=512, batch=4, tensor_parallel=1, separate_qkv=True),
    "megatrongpt3": BlockShape(hidden=12288, heads=96, sequence=2048, batch=1, tensor_parallel=8, separate_qkv=False),
}


def sample_chip(rng: random.Random) -> SyntheticChip:
    return SyntheticChip(
        num_tc=rng.randint(4, 8),
        num_vc=2,
        tc_flops=rng.uniform(10e12, 100e12),
        vc_bandwidth=rng.uniform(50e9, 400e9),
        efficiency=rng.uniform(0.55, 0.95),
        link_bandwidth=rng.uniform(50e9, 200e9),
    )


class _GraphBuilder:
    """Adds roofline-costed operators and their dependences."""

    def __init__(self, config: SyntheticChip):
        self.config, self.ops, self.edges = config, [], []

    def _add(self, op: Op, after: tuple[int, ...]) -> int:
        self.ops.append(op)
        self.edges += [(a, len(self.ops) - 1) for a in after]
        return len(self.ops) - 1

    def _split(self, latency: float, cores: int) -> float:
        return latency / (cores * self.config.efficiency) + 2e-7  # plus a fixed start-up cost

    def gemm(self, name: str, flops: float, epilogue_bytes: float, after: tuple[int, ...]) -> int:
        c = self.config
        tc = flops / c.tc_flops + 1e-7
        if not epilogue_bytes:
            return self._add(Op("TC", tc, self._split(tc, c.num_tc), name=name), after)
        latency = tc + epilogue_bytes / c.vc_bandwidth
        return self._add(Op("TCandVC", latency, self._split(latency, min(c.num_tc, c.num_vc)), name=name), after)

    def vector(self, name: str, nbytes: float, after: tuple[int, ...]) -> int:
        latency = nbytes / self.config.vc_bandwidth + 5e-8
        return self._add(Op("VC", latency, self._split(latency, self.config.num_vc), name=name), after)

    def allreduce(self, name: str, nbytes: float, width: int, after: tuple[int, ...]) -> int:
        if width == 1:
            return after[0]
        link = Cluster.build("link", width, width, [dict(bandwidth=self.config.link_bandwidth, latency=1e-6)])
        latency = link.all_reduce(width, 1).scalar(nbytes)
        return self._add(Op("collective", latency, latency, name=name), after)

    def problem(self) -> ScheduleProblem:
        return ScheduleProblem(self.ops, self.edges, self.config.num_tc, self.config.num_vc)


def _forward(shape: BlockShape, g: _GraphBuilder) -> None:
    tokens, h, t = shape.batch * shape.sequence, shape.hidden, shape.tensor_parallel
    act = tokens * h * 2  # bytes of one fp16 activation
    scores = shape.batch * shape.heads // t * shape.sequence**2 * 2
    ln1 = g.vector("ln1", 2 * act, ())
    if shape.separate_qkv:
        qkv = tuple(g.gemm(n, 2 * tokens * h * h / t, act / t, (ln1,)) for n in ("q", "k", "v"))
    else:
        qkv = (g.gemm("qkv", 2 * tokens * h * 3 * h / t, 3 * act / t, (ln1,)),) * 3
    qk = g.gemm("qk", 2 * tokens * shape.sequence * h / t, 0, qkv[:2])
    softmax = g.vector("softmax", 2 * scores, (qk,))
    drop = g.vector("attn_dropout", 2 * scores, (softmax,))
    av = g.gemm("av", 2 * tokens * shape.sequence * h / t, 0, (drop, qkv[2]))
    proj = g.gemm("proj", 2 * tokens * h * h / t, act, (av,))
    ar1 = g.allreduce("allreduce1", act, t, (proj,))
    res1 = g.vector("dropout_add1", 3 * act, (ar1, ln1))
    ln2 = g.vector("ln2", 2 * act, (res1,))
    fc1 = g.gemm("fc1_gelu", 2 * tokens * h * 4 * h / t, 4 * act / t, (ln2,))
    fc2 = g.gemm("fc2", 2 * tokens * 4 * h * h / t, act, (fc1,))
    ar2 = g.allreduce("allreduce2", act, t, (fc2,))
    g.vector("dropout_add2", 3 * act, (ar2, res1))


def _backward(shape: BlockShape, g: _GraphBuilder) -> None:
    tokens, h, t = shape.batch * shape.sequence, shape.hidden, shape.tensor_parallel
    act = tokens * h * 2
    scores = shape.batch * shape.heads // t * shape.sequence**2 * 2
    d_res2 = g.vector("d_dropout_add2", 3 * act, ())
    d_fc2 = g.gemm("d_fc2_data", 2 * tokens * 4 * h * h / t, 0, (d_res2,))
    g.gemm("d_fc2_weight", 2 * tokens * 4 * h * h / t, 0, (d_res2,))
    g.vector("d_fc2_bias", act, (d_res2,))
    d_gelu = g.vector("d_gelu", 3 * 4 * act / t, (d_fc2,))
    d_fc1 = g.gemm("d_fc1_data", 2 * tokens * h * 4 * h / t, 0, (d_gelu,))
    g.gemm("d_fc1_weight", 2 * tokens * h * 4 * h / t, 0, (d_gelu,))
    g.vector("d_fc1_bias", 4 * act / t, (d_gelu,))
    ar2 = g.allreduce("d_allreduce2", act, t, (d_fc1,))
    d_ln2 = g.vector("d_ln2", 3 * act, (ar2,))
    d_res1 = g.vector("d_dropout_add1", 3 * act, (d_ln2, d_res2))
    d_proj = g.gemm("d_proj_data", 2 * tokens * h * h / t, 0, (d_res1,))
    g.gemm("d_proj_weight", 2 * tokens * h * h / t, 0, (d_res1,))
    g.vector("d_proj_bias", act, (d_res1,))
    d_attn = g.gemm("d_av_attn", 2 * tokens * shape.sequence * h / t, 0, (d_proj,))
    d_v = g.gemm("d_av_v", 2 * tokens * shape.sequence * h / t, 0, (d_proj,))
    d_drop = g.vector("d_attn_dropout", 3 * scores, (d_attn,))
    d_softmax = g.vector("d_softmax", 3 * scores, (d_drop,))
    d_q = g.gemm("d_qk_q", 2 * tokens * shape.sequence * h / t, 0, (d_softmax,))
    d_k = g.gemm("d_qk_k", 2 * tokens * shape.sequence * h / t, 0, (d_softmax,))
    names = ("q", "k", "v") if shape.separate_qkv else ("qkv",)
    grads = (d_q, d_k, d_v) if shape.separate_qkv else ((d_q, d_k, d_v),)
    width = 1 if shape.separate_qkv else 3
    data = []
    for name, grad in zip(names, grads):
        after = grad if isinstance(grad, tuple) else (grad,)
        data.append(g.gemm(f"d_{name}_data", 2 * tokens * h * width * h / t, 0, after))
        g.gemm(f"d_{name}_weight", 2 * tokens * h * width * h / t, 0, after)
        g.vector(f"d_{name}_bias", width * act / t, after)
    d_sum = g.vector("d_qkv_sum", len(data) * act, tuple(data)) if len(data) > 1 else data[0]
    ar1 = g.allreduce("d_allreduce1", act, t, (d_sum,))
    d_ln1 = g.vector("d_ln1", 3 * act, (ar1,))
    g.vector("d_residual", 2 * act, (d_ln1, d_res1))


def synthetic_block_problems(model: str, chip: SyntheticChip) -> dict[str, ScheduleProblem]:
    """The forward and backward scheduling problems of one synthetic block of `model` on `chip`."""
    problems = {}
    for direction, build in (("forward", _forward), ("backward", _backward)):
        builder = _GraphBuilder(chip)
        build(SYNTHETIC_MODELS[model], builder)
        problems[direction] = builder.problem()
    return problems


@cache
def _extracted(model: str) -> ExtractedModel:
    return extract(model, **REAL_MODELS[model])


def sample_accelerator(rng: random.Random) -> AcceleratorConfig:
    space = candidate_space()
    return space[rng.randrange(len(space))]


def real_block_problems(model: str, accelerator: AcceleratorConfig) -> dict[str, ScheduleProblem]:
    """The forward and backward problems of the first transformer block of `model`, extracted and
    priced by the estimator for `accelerator`."""
    extracted = _extracted(model)
    block = extracted.repeat_groups[1][0]
    return {
        direction: ScheduleProblem.from_workload(
            layer_workload(extracted.op_graph, block, direction, accelerator), accelerator.num_tc, accelerator.num_vc
        )
        for direction in ("forward", "backward")
    }


GRAPHS = {"real": (sample_accelerator, real_block_problems), "synthetic": (sample_chip, synthetic_block_problems)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", choices=sorted(GRAPHS), default="real")
    parser.add_argument("--configs", type=int, default=20)
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--backends", default="cpsat,milp,heuristic", help="comma list; milp-highs: HiGHS")
    parser.add_argument("--relative-gap", type=float, default=0.01, help="exact backends stop within this gap")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    sample, block_problems = GRAPHS[args.graphs]
    configs = [sample(rng) for _ in range(args.configs)]
    rows: dict[tuple, list[tuple[ScheduleResult, float]]] = {}
    for model in MODELS:
        for config in configs:
            for direction, problem in block_problems(model, config).items():
                results = {}
                for backend in args.backends.split(","):
                    name, _, milp_solver = backend.partition("-")
                    results[backend] = solve(
                        problem, name, args.time_limit, milp_solver=milp_solver or "cbc", relative_gap=args.relative_gap
                    )
                best = min(r.makespan for r in results.values())
                for backend, result in results.items():
                    rows.setdefault((model, direction, len(problem.ops), backend), []).append((result, best))
    print(
        "| model | direction | ops | backend | median time [s] | max time [s] | median gap | max gap "
        "| proven optimal | median / max excess over best found |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (model, direction, n, backend), entries in rows.items():
        times = [r.solve_time for r, _ in entries]
        gaps = [r.gap for r, _ in entries]
        excess = [r.makespan / best - 1 for r, best in entries]
        optimal = sum(r.status == "optimal" for r, _ in entries)
        print(
            f"| {model} | {direction} | {n} | {backend} | {statistics.median(times):.3f} | {max(times):.3f} | "
            f"{statistics.median(gaps):.2%} | {max(gaps):.2%} | {optimal}/{len(entries)} | "
            f"{statistics.median(excess):.2%} / {max(excess):.2%} |"
        )


if __name__ == "__main__":
    main()
