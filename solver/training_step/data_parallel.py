"""Data parallelism of one shard: where the model state of a device lives (each class of parameters
split over its shard group), its bytes, and the collectives that move it: the sync once a step, the
sharded traffic every micro-batch, and the optimizer step.

* Data-parallel sync: after the last backward every stage reduces its gradients over its
  replicas (all-reduce; reduce-scatter of the gradients + all-gather of the weights with a sharded
  optimizer), all stages at once on the tier their group spans; the exposed time is the largest.
  Each class of parameters syncs over its own group: the dense ones over the c·d ranks holding
  them, a mixture of experts' over the c·d/e holding the same experts; classes whose groups are the
  same sync as one. With `overlap_grad_reduce` a stage's gradient reduction hides behind its last
  micro-batch's backward pass; with `overlap_param_gather` the sharded optimizer's weight
  all-gather hides behind the next step's first forward pass (exposed = the excess, never < 0).
* Optimizer step: each device reads and writes its optimizer state once at HBM bandwidth.
* Sharded data parallelism (`TrainingOptions.data_parallel_sharding`, ZeRO stages 1-3 / FSDP):
  the ranks holding the same weights (c·d, or groups of `data_parallel_shard_width` of them) split
  the optimizer state, the gradients and the weights.
* FP8 weights (`TrainingOptions.fp8_parameters`): the weight all-gathers move the weights of the
  8-bit products in `FP8_PARAMETER_GATHER_BYTES` a parameter; the gradients are reduced as without.
  Each class of parameters (dense, experts) holds the stage's share of those weights in proportion
  to its parameters: a simplification where a mixture's experts sync over other ranks than the
  rest (exact where they sync together, e = 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from graph_extract.kernels import KernelOptions
from phaze_hardware import Collective, Group, Network
from solver.layout import Layout
from solver.training_step.memory import Recompute, narrow_weight_bytes
from solver.training_step.options import (FP8_PARAMETER_GATHER_BYTES, GATHER_COPY_PASSES, GATHER_HOST_TIME,
                                          LIST_MEMBER_HOST_TIME, REDUCE_COPY_PASSES, TrainingOptions)
from solver.training_step.records import Device, StageTerms

def list_collective_overhead(members: int, collectives, size, copy_passes: int, hbm_bandwidth: float,
                             fetch: float = 0.0):
    """Seconds DeepSpeed's ZeRO-3 of 2021 (`blocking_tensors`) spends on `collectives` collectives of
    `size` bytes over a group of `members`, besides their transfer; 0 for no bytes. Each was a list
    collective: DeepSpeed built one view per member in a Python loop, and PyTorch 1.8's
    ProcessGroupNCCL copied each list entry out of (all-gather) or into (reduce-scatter) its flat
    buffer, one copy each, on the host's critical path as every gather synchronised the device:
    `LIST_MEMBER_HOST_TIME` per member and collective, and `fetch` more per collective (a gather's:
    `GATHER_HOST_TIME`); the device meanwhile makes `copy_passes` passes over the bytes at HBM
    bandwidth (`GATHER_COPY_PASSES`, `REDUCE_COPY_PASSES`)."""
    return np.where(np.asarray(size) > 0,
                    (fetch + LIST_MEMBER_HOST_TIME * members) * collectives + copy_passes * size / hbm_bandwidth,
                    0.0)


@dataclass(frozen=True, kw_only=True)
class DataParallel:
    """The data-parallel concern of a step model: its shard (t, e, c; d given per call), cluster,
    options, device and recomputation mode. Arrays of parameters give arrays."""

    cluster: Network
    training: TrainingOptions
    kernels: KernelOptions
    device: Device
    shard: Layout
    recompute: Recompute
    _collectives: dict = field(default_factory=dict, repr=False, compare=False)
    _data_groups: dict = field(default_factory=dict, repr=False, compare=False)
    _class_groups: dict = field(default_factory=dict, repr=False, compare=False)

    def data_groups(self, degree: int) -> tuple[Group, Group]:
        """(the ranks holding the same dense weights, those holding the same experts) at width d:
        with context parallelism, c·d ranks and c·d/e (`Layout.groups`)."""
        found = self._data_groups.get(degree)
        if found is None:
            groups = self.shard.replace(pipeline_parallel_width=1, data_parallel_width=degree, virtual_stages=1).groups()
            found = self._data_groups[degree] = (groups["weights"], groups["expert_weights"])
        return found

    def shard_groups(self, group: Group) -> tuple[Group, Group]:
        """(shard group, replica group) of the ranks `group` holding the same weights: all of them and
        none (`data_parallel_shard_width` None), or groups of that width and the ranks holding the
        same shard across them (hybrid sharding); a group the width does not divide (a class of
        experts) is sharded over the largest common divisor."""
        width = self.training.data_parallel_shard_width
        if width is None or width >= group.size:
            return group, Group(1, group.stride * group.size)
        width = math.gcd(width, group.size)
        return Group(width, group.stride), Group(group.size // width, group.stride * width)

    def sharding_problem(self, degree: int) -> str | None:
        """Why the shard width cannot split the c·d ranks of width d, or None."""
        return self.training.shard_problem(self.data_groups(degree)[0].size)

    def parameter_classes(self, parameters, degree: int, expert_parameters=0.0) -> list[tuple[Group, Group, object]]:
        """(shard group, replica group, parameters) of each class of parameters per device: the dense
        ones over the c·d ranks holding them, the experts' over the c·d/e holding the same experts
        (`shard_groups` splits each into shard and replica groups); classes of the same groups as one
        (their counts are whole numbers: the sum is exact)."""
        classes = []
        for shard, replicas, dense, experts in self.class_groups(degree):
            if dense:
                count = parameters - expert_parameters
                classes.append((shard, replicas, count + expert_parameters if experts else count))
            else:
                classes.append((shard, replicas, expert_parameters))
        return classes

    def class_groups(self, degree: int) -> tuple[tuple[Group, Group, bool, bool], ...]:
        """(shard group, replica group, holds dense weights, holds experts) of each class at width d."""
        found = self._class_groups.get(degree)
        if found is None:
            data, expert_data = self.data_groups(degree)
            found = (((*self.shard_groups(data), True, True),) if data == expert_data else
                     ((*self.shard_groups(data), True, False), (*self.shard_groups(expert_data), False, True)))
            self._class_groups[degree] = found
        return found

    def state_bytes(self, kind: str, parameters, degree: int, expert_parameters=0.0):
        """Bytes per device of one kind of model state ("weights", "gradients", "optimizer_state") of
        `parameters`, each class sharded over its shard group when the sharding splits that kind."""
        state, total = self.training.model_state, 0.0
        for shard, _, count in self.parameter_classes(parameters, degree, expert_parameters):
            total = total + count * state.share(kind, shard.size)
        return total

    def optimizer_state_bytes(self, parameters, degree: int, expert_parameters=0.0):
        """Optimizer state of `parameters` per device, of which `expert_parameters` are experts'."""
        return self.state_bytes("optimizer_state", parameters, degree, expert_parameters)

    def gathered_weight_bytes(self, terms: StageTerms) -> np.ndarray:
        """The whole weights a device holds besides its shards with `full` sharding: those of the layer
        running and of the one prefetched (twice its largest layer's; once with `scanned_layers`, which
        prefetches no layer, and with `blocking_tensors`, whose gathers block the compute: a
        simplification, DeepSpeed's prefetch bucket of that time is left out), or with
        `reshard_after_forward` false every weight of the stage, kept all step; in 16 bits, with
        `fp8_parameters` too (a simplification: FSDP then gathers the 8-bit products' weights in FP8),
        whatever `weight_dtype` keeps the shards in (`ModelState.gathered`). The running layer's whole
        gradients before their reduce-scatter are left out: a simplification."""
        if not self.training.model_state.splits("weights"):
            return np.zeros_like(terms.parameters)
        layers = 2.0 if self.training.sharded_collectives == "prefetched_layers" else 1.0
        whole = terms.parameters if not self.training.reshard_after_forward else layers * terms.largest_parameters
        return whole * self.training.model_state.gathered

    def weight_bytes(self, terms: StageTerms, degree: int):
        """16-bit weights (their shards and what `full` sharding gathers), and in 8-bit training the
        8-bit copies of the weights 8-bit products read (sharded as the weights), which replace their
        16-bit copies with `fp8_parameters` (`memory.narrow_weight_bytes`)."""
        weights = self.state_bytes("weights", terms.parameters, degree, terms.expert_parameters)
        if self.kernels.fp8:
            share = weights / np.where(terms.parameters > 0, terms.parameters, 1.0) / self.training.model_state.weights
            extra = narrow_weight_bytes(self.kernels, self.training.fp8_parameters)
            weights = weights + extra * terms.matrix_parameters * share
        return weights + self.gathered_weight_bytes(terms)

    @property
    def narrow_gather(self) -> bool:
        """Whether the weight all-gathers move the 8-bit products' weights in FP8 (`fp8_parameters`)."""
        return self.training.fp8_parameters and self.kernels.fp8

    def gathered_bytes(self, count, parameters, matrix_parameters):
        """Bytes an all-gather of `count` parameters' weights moves, of stages holding `parameters` of
        which `matrix_parameters` are read by 8-bit products: 16-bit weights, those in FP8 with
        `fp8_parameters` (each class its proportional share of them: module docstring), whatever
        `weight_dtype` keeps the shards in (`ModelState.gathered`)."""
        gathered = self.training.model_state.gathered
        weights = count * gathered
        if not self.narrow_gather:
            return weights
        share = np.divide(matrix_parameters, parameters, out=np.zeros_like(parameters, dtype=float),
                          where=np.asarray(parameters) > 0) if not np.isscalar(parameters) else (
            matrix_parameters / parameters if parameters > 0 else 0.0)
        return weights - count * share * (gathered - FP8_PARAMETER_GATHER_BYTES)

    def static_bytes(self, terms: StageTerms, degree: int):
        """Weights, gradients and optimizer state per device of each stage, and the framework's
        reserve."""
        return (self.weight_bytes(terms, degree)
                + self.state_bytes("gradients", terms.parameters, degree, terms.expert_parameters)
                + self.optimizer_state_bytes(terms.parameters, degree, terms.expert_parameters)
                + self.training.framework_reserve)

    def collectives(self, shard: Group, replicas: Group) -> dict[str, Collective]:
        """The collectives of a class's shard and replica groups: all-reduce over the whole of them,
        reduce-scatter and all-gather within the shard group, all-reduce across the replicas."""
        found = self._collectives.get((shard, replicas))
        if found is None:
            whole = Group(shard.size * replicas.size, shard.stride)
            found = {"all_reduce": self.cluster.all_reduce(whole), "reduce_scatter": self.cluster.reduce_scatter(shard),
                     "all_gather": self.cluster.all_gather(shard), "across": self.cluster.all_reduce(replicas)}
            self._collectives[(shard, replicas)] = found
        return found

    def sync_times(self, parameters, degree: int, expert_parameters=0.0, matrix_parameters=0.0):
        """(gradient reduction, weight all-gather) once a step, after the last backward, of stages
        holding `parameters` per device (`matrix_parameters` of them read by 8-bit products: what
        `fp8_parameters` gathers in FP8), not overlapped, each class over its own groups:

            none       all-reduce of the gradients over the ranks holding the weights
            optimizer  reduce-scatter within the shard group, all-reduce of the shard across the
                       replicas, all-gather of the updated weights within the shard group
            gradients  (reduce-scattered every micro-batch: `sharded_traffic`) the all-reduce across
                       the replicas and the all-gather of the updated weights
            full       the all-reduce across the replicas; with `reshard_after_forward` false the one
                       all-gather of the weights a step (before the next step's first forward)
        """
        state, sharding, reduction, gather = self.training.model_state, self.training.data_parallel_sharding, 0.0, 0.0
        for shard, replicas, count in self.parameter_classes(parameters, degree, expert_parameters):
            collective = self.collectives(shard, replicas)
            gradients, weights = count * state.gradients, self.gathered_bytes(count, parameters, matrix_parameters)
            if sharding == "none":
                reduction = reduction + collective["all_reduce"].time(gradients)
                continue
            if sharding == "optimizer":
                reduction = reduction + collective["reduce_scatter"].time(gradients)
            reduction = reduction + collective["across"].time(gradients / shard.size)
            if sharding != "full" or not self.training.reshard_after_forward:
                gather = gather + collective["all_gather"].time(weights)
        return reduction, gather

    def sharded_traffic(self, terms: StageTerms, degree: int) -> tuple[np.ndarray, np.ndarray]:
        """Per micro-batch of each stage: (exposed, hidden) seconds of the collectives sharded model
        state runs every micro-batch. `gradients` and `full` reduce-scatter each micro-batch's
        gradients within the shard group (into the device's gradient shard); `full` with
        `reshard_after_forward` also all-gathers the weights before the forward and again before the
        backward, each pass's as one collective of a class's weights (`prefetched_layers`: a
        simplification, FSDP issues one a layer, each paying the group's latency) or one a weight
        tensor (`blocking_tensors`, `blocking_gathers`). With `prefetched_layers`, `full` prefetches
        them behind the compute as FSDP does: the forward's gathers hide behind the forward compute,
        the backward's gathers and reduce-scatters behind the backward and recomputation, exposed =
        the excess (the first layer's gather, which nothing precedes, is not charged apart: a
        simplification); with `blocking_tensors` every one is exposed, a full recomputation
        gathers the stage's weights once more (its embedding too: a simplification) and their freed
        share a third time, and each collective also costs what DeepSpeed's of 2021 did besides the
        transfer (`list_collective_overhead`). `gradients` hides its reduce-scatters behind
        the backward with `overlap_grad_reduce` (DeepSpeed's overlap_comm), else they are exposed."""
        zero = np.zeros_like(terms.parameters)
        sharding = self.training.data_parallel_sharding
        if sharding not in ("gradients", "full"):
            return zero, zero
        state, forward, backward = self.training.model_state, 0.0, 0.0
        regather = sharding == "full" and self.training.reshard_after_forward
        blocking = sharding == "full" and self.training.sharded_collectives == "blocking_tensors"
        collectives = terms.gathers if blocking else 1
        # with `blocking_tensors` and full recomputation the backward's gathers are the recomputed
        # forward's and, for the share of the weights freed before their backward, its own
        third = blocking and self.recompute.full
        regathered = np.divide(terms.regathered, terms.parameters, out=np.zeros_like(terms.parameters),
                               where=terms.parameters > 0) if third else zero
        regathers = terms.regathers if third else zero
        hbm = self.device.hbm_bandwidth
        for shard, replicas, count in self.parameter_classes(terms.parameters, degree, terms.expert_parameters):
            collective = self.collectives(shard, replicas)

            def priced(kind: str, size, number):
                """`number` collectives of `kind` moving `size` bytes, with DeepSpeed's own costs
                when `blocking`."""
                time = collective[kind].repeated(size, number)
                if not blocking:
                    return time
                passes, fetch = ((GATHER_COPY_PASSES, GATHER_HOST_TIME) if kind == "all_gather"
                                 else (REDUCE_COPY_PASSES, 0.0))
                return time + list_collective_overhead(shard.size, number, size, passes, hbm, fetch)

            reduced = count * state.gradients
            weights = self.gathered_bytes(count, terms.parameters, terms.matrix_parameters)
            backward = backward + priced("reduce_scatter", reduced, collectives)
            if regather:
                gathered = priced("all_gather", weights, collectives)
                again = priced("all_gather", weights * regathered, regathers)
                forward, backward = forward + gathered, backward + gathered + again
        forward, backward = forward + zero, backward + zero
        if blocking:
            exposed = forward + backward
        elif sharding == "full":
            exposed = (np.maximum(forward - terms.forward, 0.0)
                       + np.maximum(backward - (terms.backward + terms.recompute), 0.0))
        elif self.training.overlap_grad_reduce:
            exposed = np.maximum(backward - (terms.backward + terms.recompute), 0.0)
        else:
            exposed = forward + backward
        return exposed, forward + backward - exposed

    def sync_time(self, parameters, degree: int, expert_parameters=0.0, matrix_parameters=0.0):
        """Data-parallel sync once a step of stages holding `parameters` per device, not overlapped."""
        reduction, gather = self.sync_times(parameters, degree, expert_parameters, matrix_parameters)
        return reduction + gather

    def optimizer_time(self, parameters, degree: int, expert_parameters=0.0):
        """Reading and writing the values the optimizer updates once at HBM bandwidth: its state, and the
        weights themselves when that state holds no master copy (`weight_dtype` float32 or bfloat16)."""
        updated = self.optimizer_state_bytes(parameters, degree, expert_parameters)
        if not self.training.model_state.master_copy:
            updated = updated + self.state_bytes("weights", parameters, degree, expert_parameters)
        return 2.0 * updated / self.device.hbm_bandwidth

    def tail_time(self, parameters, degree: int, expert_parameters=0.0, matrix_parameters=0.0):
        """Sync and optimizer step of stages holding `parameters` per device, the sync not hidden:
        what such a stage adds after the last backward (it grows with the parameters)."""
        return (self.sync_time(parameters, degree, expert_parameters, matrix_parameters)
                + self.optimizer_time(parameters, degree, expert_parameters))

    def tail(self, terms: StageTerms, degree: int) -> tuple[np.ndarray, np.ndarray]:
        """(exposed sync, optimizer step) of each stage after the last backward: the gradient reduction
        less the last backward pass it hides behind (`overlap_grad_reduce`), the weight all-gather less
        the next step's first forward pass (`overlap_param_gather`, and `full` sharding's one gather a
        step, prefetched), each never below zero."""
        reduction, gather = self.sync_times(terms.parameters, degree, terms.expert_parameters, terms.matrix_parameters)
        if self.training.overlap_grad_reduce:
            reduction = np.maximum(reduction - terms.backward, 0.0)
        if self.training.overlap_param_gather or self.training.data_parallel_sharding == "full":
            gather = np.maximum(gather - terms.forward, 0.0)
        return reduction + gather, self.optimizer_time(terms.parameters, degree, terms.expert_parameters)

    @property
    def sync_overlaps(self) -> bool:
        return (self.training.overlap_grad_reduce or self.training.overlap_param_gather
                or self.training.data_parallel_sharding == "full")

    def tail_keys_are_parameters(self) -> bool:
        """Whether every stage's tail grows with its parameters alone (so a cap on parameters is a
        cap on the tail); not so when the sync overlaps the backward pass, nor when the experts sync
        over other replicas than the rest, nor when FP8 weights are gathered (the gather depends on
        which parameters 8-bit products read)."""
        data, expert_data = self.data_groups(self.shard.expert_parallel_width)
        return not self.sync_overlaps and expert_data == data and not self.narrow_gather
