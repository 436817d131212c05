"""How the model is trained, besides its layout: one hashable value the step model, the placement
search and every cache key read.

* `optimizer`: `adam` (mixed precision: 16-bit weights, fp32 gradients, fp32 master weights and two
  moments) or `sgd` (16-bit weights and gradients, the original program's);
* `data_parallel_sharding`: what the data-parallel replicas split among them (ZeRO stages 0-3):
  `none` (each holds everything), `optimizer` (the optimizer state: ZeRO-1, Megatron's distributed
  optimizer), `gradients` (also the gradients, reduce-scattered every micro-batch: ZeRO-2), `full`
  (also the weights, all-gathered before each layer runs and freed after: ZeRO-3, PyTorch FSDP's
  FULL_SHARD, MaxText's fsdp axis; its gathers and reduce-scatters are prefetched behind the compute
  as FSDP does);
* `data_parallel_shard_width`: the ranks one shard group holds (None: every data-parallel rank, c·d
  with context parallelism); smaller, the model state is sharded within groups of that many and
  replicated across them, the gradients all-reduced across the groups once a step (hybrid sharding:
  FSDP's HYBRID_SHARD / HSDP, Megatron's --num-distributed-optimizer-instances = c·d / width);
* `sharded_collectives`: how `full` sharding issues its gathers and reduce-scatters:
  `prefetched_layers` (a layer's at a time, prefetched behind the compute: PyTorch FSDP wrapping
  each transformer block; priced as one collective a pass, its latency once: a simplification),
  `scanned_layers` (XLA's SPMD partitioner gathering each weight at its use in the body of a scan
  over the layers, MaxText's scan_layers, without the collective pipeliner's all-gather prefetch
  across iterations, --xla_tpu_enable_ag_backward_pipelining, which a run turns on by flag,
  maxtext benchmarks/xla_flags_library.py: the latency-hiding scheduler overlaps each gather with
  the iteration's own products and one layer's weights are gathered at a time; priced in time as
  `prefetched_layers`, the first gather of each iteration hidden too: a simplification) or
  `blocking_tensors` (DeepSpeed's ZeRO-3 before release 0.5, 2021: one collective a weight tensor
  of at least `PERSISTENCE_THRESHOLD` elements, smaller ones kept whole; each on the compute's
  critical path, as every gather synchronised the device, DeepSpeed PR #1188; a recomputed forward
  pass gathers the weights again, and its backward keeps only the tensors used again within
  `REUSE_DISTANCE` elements, gathering the others a third time; each collective also pays that
  release's host work and copies: `GATHER_HOST_TIME`, `LIST_MEMBER_HOST_TIME`, `GATHER_COPY_PASSES`,
  `REDUCE_COPY_PASSES`);
* `reshard_after_forward`: with `full`, the gathered weights are freed after each forward and
  gathered again for the backward pass (FSDP's default); false, they are kept from the first
  forward of the step to its end: one gather a step instead of two a micro-batch, the stage's
  weights unsharded in memory (FSDP's reshard_after_forward=False, Llama 3's training);
* `overlap_grad_reduce`: each stage's gradient reduction hides behind its last micro-batch's backward
  pass (PyTorch DDP's buckets, Megatron's --overlap-grad-reduce; default false as in Megatron-LM);
* `overlap_param_gather`: the distributed optimizer's all-gather of the updated weights hides behind
  the next step's first forward pass (Megatron's --overlap-param-gather; default false; needs
  `data_parallel_sharding=optimizer` and `overlap_grad_reduce`, as Megatron asserts);
* `tensor_parallel_overlap`: each layer's tensor-parallel collectives hide behind the weight products
  they feed or follow, never more than those products' time (Transformer Engine's userbuffers,
  Megatron's --tp-comm-overlap; default false; needs sequence parallelism, as Megatron asserts);
* `master_weight_remainders`: the optimizer keeps each fp32 master weight as its 16-bit weight plus
  a 16-bit remainder: 2 bytes of state fewer per parameter (Apex's DistributedFusedAdam as NeMo runs
  it, store_param_remainders; default false, as Megatron-Core's optimizer);
* `framework_reserve`: bytes per device the framework holds besides tensors: the CUDA context,
  about 0.3-0.4 GB with lazy loading (pytorch/pytorch #107667, #109888), and NCCL's buffers, about
  0.5-0.7 GB per process group (NVIDIA/nccl #964), communicators sharing them when split from one:
  1 GB by default (a GPU's figure: a TPU has neither, its runtime keeps some HBM from every program
  instead, what XLA's compile-time check does not allow: a TPU run sets that here);
* `overlap_pipeline_transfers`: with interleaving (v > 1) the pipeline's sends and receives hide
  behind the device's compute of its other chunks (Megatron's overlap_p2p_comm: on by default in
  Megatron-LM's command line, and only ever for the interleaved schedule);
* `grad_reduce_in_bf16`: the gradients are kept and reduced in 16-bit instead of fp32 main gradients
  (Megatron's --grad-reduce-in-bf16);
* `fp8_parameters` (precision fp8 only, `solver.question.Question` checks it): the weights of the
  8-bit products are held in FP8 only, with no 16-bit copy (TE's fp8_model_init, Megatron's
  --fp8-param-gather, NeMo's fp8_params; the fp32 master weights stay in the optimizer state), and
  the sharded optimizer's or FSDP's all-gather of them moves `FP8_PARAMETER_GATHER_BYTES` a
  parameter instead of the 16-bit weight's 2; the gradients are reduced in their own dtype;
* `weight_dtype`: what the weights are kept in between steps (`memory.WEIGHT_DTYPES`): `mixed`
  (16-bit weights, fp32 master weights in the optimizer state: Megatron-LM, NeMo, DeepSpeed),
  `float32` or `bfloat16` (every kind of state in that dtype, no master copy: MaxText's
  weight_dtype, whose default is float32; PyTorch FSDP2 keeps fp32 parameters); `grad_reduce_in_bf16`
  and `master_weight_remainders` apply to `mixed` only;
* `expert_dispatch`: how a mixture's tokens reach their experts: `all_to_all` (each of a token's k
  copies sent to its expert's device: Megatron's alltoall dispatcher) or `deduplicated` (one copy a
  destination node over the scale-out links, forwarded inside the node: DeepEP, Megatron's flex
  dispatcher; `phaze_hardware.Cluster.dispatch`);
* `overlap_expert_dispatch`: each layer's dispatch and combine hide behind another micro-batch's
  compute of that layer, never more than it (Megatron's --overlap-moe-expert-parallel-comm, the
  1F1B all-to-all overlap; DeepSeek-V3's DualPipe does the same across its two directions);
* `expert_dispatch_compute_share`: the share of a device's compute the overlapped dispatch's
  kernels hold while they run (their streaming multiprocessors over the chip's: Megatron's
  --moe-deepep-num-sms, default 20, and DeepSeek-V3's 20 of an H800's 132, DeepSeek-AI 2024 §3.2.2);
  the other micro-batch's compute runs that much slower meanwhile (0: a chip without such a split);
* `activation_offload`: `none`, or `layers`: every transformer block's activations that the
  recomputation mode keeps (`memory.held_activations`) are copied to host memory after the block's
  forward pass and back before its backward pass, on DMA engines of their own beside the compute
  (Megatron-Core's --cpu-offloading on a side stream, Transformer Engine's CPU offloading; XLA's
  asynchronous host offload, MaxText's remat_policy `custom` with tensors marked `offload`). HBM
  then holds, of the blocks' kept activations, only those of the blocks in transfer: the running
  block's and the one prefetched (`OFFLOAD_BUFFERS` of the device's largest block, whatever the
  micro-batches in flight: a simplification, the copies' own staging is not charged); the
  embedding and the head keep theirs. Each pass's transfers at the chip's host link bandwidth
  (`Device.host_link_bandwidth`) are exposed beyond that pass's compute (`offload.offload_seconds`).
  Every block of every stage is offloaded: Megatron's cpu_offloading_num_layers = n offloads n of
  a stage's blocks, MaxText offloads in every layer of its scan; the published runs offload all of
  a stage's blocks or state no count, so a count is not a field (a simplification for n below the
  stage's blocks).
A new training option is a field here and the formula in the step model that reads it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

from phaze_common.checks import InputError, boolean, choice, non_negative_number, positive_integer
from solver.training_step.memory import OPTIMIZERS, SHARDINGS, WEIGHT_DTYPES, ModelState


#: Streaming multiprocessors an overlapped expert dispatch holds unless told (Megatron's
#: --moe-deepep-num-sms default; what DeepSeek-V3 gives its dispatch, DeepSeek-AI 2024 §3.2.2).
DISPATCH_SMS = 20
#: How `full` sharding issues its collectives (`TrainingOptions.sharded_collectives`).
SHARDED_COLLECTIVES = ("prefetched_layers", "scanned_layers", "blocking_tensors")
#: Weight tensors smaller than this many elements DeepSpeed's ZeRO-3 keeps whole on every device
#: (stage3_param_persistence_threshold's default, deepspeed/runtime/zero/constants.py, 2021).
PERSISTENCE_THRESHOLD = 100_000
#: DeepSpeed's ZeRO-3 frees a gathered tensor unless the elements of the tensors used before its next
#: use are fewer than this (stage3_max_reuse_distance's default, deepspeed/runtime/zero/constants.py, 2021).
REUSE_DISTANCE = 1_000_000_000
#: Host seconds DeepSpeed's ZeRO-3 of 2021 spent per member of the group in each of its list
#: collectives: a Python view per member, a copy per member in PyTorch 1.8 (`model.list_collective_overhead`).
#: Fitted, the one number here that is: the least-squares fit, over collectives x members, of what
#: SC'21 Table 2's three GPT-3 175B ZeRO-3 rows (384, 768, 1,536 GPUs, one micro-batch each)
#: measure beyond the rest of the step as priced, through the origin as the cost has no constant
#: part: 10.8 us. The three 530B rows, left out of the fit, read 14-19 % fast with it. An eager view
#: op issued from Python takes 3.3 us in PyTorch's own operator benchmark (`split` on CUDA,
#: pytorch/pytorch #32194); the copy's launch comes on top.
LIST_MEMBER_HOST_TIME = 10.8e-6
#: Host seconds DeepSpeed's ZeRO-3 of 2021 spent fetching each tensor it gathered (hooks, the trace
#: of modules, allocating and zeroing the output, the device synchronise), from a measurement of
#: DeepSpeed 0.3.16 with PyTorch 1.8 on 8 A100 (deepspeedai/DeepSpeed #1174, the model in PR
#: #1188): a 5.1B BERT's forward took 480 ms with ZeRO-3 and 60 ms with ZeRO-2; the 420 ms less the
#: 388 gathers' transfer, list and copies as priced here (0.11 s) leaves 0.81 ms a gather.
GATHER_HOST_TIME = 0.81e-3
#: HBM passes over a tensor DeepSpeed's ZeRO-3 of 2021 gathered, besides the transfer: zeroing the
#: output (`torch.zeros` in `_allgather_param`), then PyTorch 1.8 reading and writing it once more to
#: copy each rank's piece out of the flat buffer NCCL gathered into (ProcessGroupNCCL::allgather; the
#: copy `_all_gather_base` removed later, pytorch/pytorch #56315).
GATHER_COPY_PASSES = 3
#: HBM passes over a gradient it reduce-scattered: dividing it by the group's size in place
#: (`average_tensor`), and PyTorch 1.8 copying each rank's piece into a flat buffer for NCCL
#: (ProcessGroupNCCL::reduce_scatter).
REDUCE_COPY_PASSES = 4
#: Bytes per parameter the weight all-gather moves for a weight held in FP8 (`fp8_parameters`): its
#: E4M3 byte (Megatron-Core's --fp8-param-gather gathers the FP8 data; its per-tensor scales are
#: a few numbers).
FP8_PARAMETER_GATHER_BYTES = 1.0
#: How a mixture's tokens reach their experts (`TrainingOptions.expert_dispatch`).
EXPERT_DISPATCHES = ("all_to_all", "deduplicated")
#: Which activations leave HBM for host memory (`TrainingOptions.activation_offload`).
ACTIVATION_OFFLOADS = ("none", "layers")


#: Which frameworks run weights or gradients sharded over the data-parallel ranks in a pipeline of p > 1
#: stages (ZeRO-2 and ZeRO-3 with pipeline parallelism), by sharding: layouts phaze prices that not
#: every framework runs. DeepSpeed's PipelineEngine asserts zero_optimization_stage() < 2 ("ZeRO-2 and
#: ZeRO-3 are incompatible with pipeline parallelism", deepspeed/runtime/pipe/engine.py; DeepSpeed issue
#: #1110); torchtitan applies PyTorch FSDP2 to each pipeline stage and by default keeps the gathered
#: weights through the step when pipelining (reshard_after_forward = not pp_enabled,
#: torchtitan/models/llama3/infra/parallelize.py, apply_fsdp); MaxText runs its fsdp axis with pipeline
#: parallelism (pipeline_fsdp_ag_once: gather the weights once before the pipeline's loop).
PIPELINE_SHARDING_NOTES = {
    "gradients": ("ZeRO-2 with pipeline parallelism: DeepSpeed's pipeline engine refuses it (PipelineEngine asserts "
                  "ZeRO stage < 2, deepspeed/runtime/pipe/engine.py)"),
    "full": ("ZeRO-3 with pipeline parallelism: PyTorch FSDP2 on each stage composes them (torchtitan, which by "
             "default keeps the gathered weights through the step when pipelining: reshard_after_forward=false) and "
             "so does MaxText (its fsdp axis with pipeline stages; pipeline_fsdp_ag_once); DeepSpeed's pipeline "
             "engine refuses ZeRO-2 and ZeRO-3 (PipelineEngine asserts ZeRO stage < 2, "
             "deepspeed/runtime/pipe/engine.py)"),
}


def pipeline_sharding_note(sharding: str, stages: int) -> str | None:
    """Which frameworks run `sharding` with a pipeline of `stages` stages (`PIPELINE_SHARDING_NOTES`),
    or None where every framework does (one stage, or the optimizer state alone sharded)."""
    return PIPELINE_SHARDING_NOTES.get(sharding) if stages > 1 else None


@dataclass(frozen=True)
class TrainingOptions:
    """Optimizer, data-parallel sharding and overlaps (module docstring)."""

    optimizer: str = "adam"
    data_parallel_sharding: str = "optimizer"
    overlap_grad_reduce: bool = False
    grad_reduce_in_bf16: bool = False
    overlap_param_gather: bool = False
    tensor_parallel_overlap: bool = False
    overlap_pipeline_transfers: bool = True
    master_weight_remainders: bool = False
    framework_reserve: float = 1.0e9
    data_parallel_shard_width: int | None = None
    reshard_after_forward: bool = True
    expert_dispatch: str = "all_to_all"
    overlap_expert_dispatch: bool = False
    expert_dispatch_compute_share: float = 0.0
    sharded_collectives: str = "prefetched_layers"
    fp8_parameters: bool = False
    activation_offload: str = "none"
    weight_dtype: str = "mixed"

    def __post_init__(self) -> None:
        choice("optimizer", self.optimizer, OPTIMIZERS)
        choice("data_parallel_sharding", self.data_parallel_sharding, SHARDINGS)
        boolean("overlap_grad_reduce", self.overlap_grad_reduce)
        boolean("grad_reduce_in_bf16", self.grad_reduce_in_bf16)
        boolean("overlap_param_gather", self.overlap_param_gather)
        boolean("tensor_parallel_overlap", self.tensor_parallel_overlap)
        boolean("overlap_pipeline_transfers", self.overlap_pipeline_transfers)
        boolean("master_weight_remainders", self.master_weight_remainders)
        non_negative_number("framework_reserve", self.framework_reserve)
        if self.data_parallel_shard_width is not None:
            positive_integer("data_parallel_shard_width", self.data_parallel_shard_width)
        boolean("reshard_after_forward", self.reshard_after_forward)
        choice("sharded_collectives", self.sharded_collectives, SHARDED_COLLECTIVES)
        choice("expert_dispatch", self.expert_dispatch, EXPERT_DISPATCHES)
        boolean("overlap_expert_dispatch", self.overlap_expert_dispatch)
        boolean("fp8_parameters", self.fp8_parameters)
        choice("activation_offload", self.activation_offload, ACTIVATION_OFFLOADS)
        choice("weight_dtype", self.weight_dtype, WEIGHT_DTYPES)
        for name in ("grad_reduce_in_bf16", "master_weight_remainders", "fp8_parameters"):
            if getattr(self, name) and self.weight_dtype != "mixed":
                raise InputError(f"{name}: applies to weight_dtype=mixed (a master copy beside 16-bit weights), not "
                                 f"{self.weight_dtype}; allowed here: false")
        share = self.expert_dispatch_compute_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share < 1:
            raise InputError(f"expert_dispatch_compute_share: {share!r}; allowed: a number in [0, 1)")
        if self.overlap_param_gather and not (self.gathers_updated_weights and self.overlap_grad_reduce):
            raise InputError("overlap_param_gather: needs data_parallel_sharding=optimizer or gradients and "
                             "overlap_grad_reduce=true (as Megatron-LM); allowed here: false")

    def shard_problem(self, ranks: int) -> str | None:
        """Why `data_parallel_shard_width` cannot split `ranks` ranks holding the same weights, or None."""
        width = self.data_parallel_shard_width
        if width is not None and width < ranks and ranks % width:
            return (f"data_parallel_shard_width: {width} does not divide the {ranks} ranks holding the same weights "
                    "(context x data parallel)")
        return None

    @property
    def gathers_updated_weights(self) -> bool:
        """Whether the step ends with an all-gather of the updated weights (the optimizer's shards
        updated, the weights whole): `optimizer` and `gradients`."""
        return self.data_parallel_sharding in ("optimizer", "gradients")

    def with_sharding(self, sharding: str) -> TrainingOptions:
        """These options with `sharding` (the weight-gather overlap kept only where it applies)."""
        gathered = sharding in ("optimizer", "gradients")
        return dataclasses.replace(self, data_parallel_sharding=sharding,
                                   overlap_param_gather=self.overlap_param_gather and gathered)

    @cached_property
    def model_state(self) -> ModelState:
        return ModelState.of(self.optimizer, self.data_parallel_sharding, self.grad_reduce_in_bf16,
                             self.master_weight_remainders, self.weight_dtype)

    @property
    def offloads_activations(self) -> bool:
        """Whether the blocks' kept activations go to host memory (`activation_offload`)."""
        return self.activation_offload != "none"

    def record(self) -> dict:
        """The options as plain data (results, cache keys): `activation_offload` and `weight_dtype`
        only when not their defaults (the keys of the options before they were fields)."""
        fields = dataclasses.asdict(self)
        if not self.offloads_activations:
            del fields["activation_offload"]
        if self.weight_dtype == "mixed":
            del fields["weight_dtype"]
        return fields
