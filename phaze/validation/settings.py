"""What a published run states of the settings phaze's training options model: its number format
(BF16, FP8 with current or delayed scaling, MXFP8), FP8 parameters gathered in FP8, CUDA graphs,
host offload of activations; and which attention of its model and which variant of its chip phaze
does not model (the run is then left out with the reason).

A run states them in `training.precision` and `training.other_settings` in the calibration set's
words: "FP8-CS" (Megatron-Bridge's current scaling), "MXFP8" or "FP8-MX", "fp8 recipe: current
scaling" / "delayed scaling", "FP8 parameter all-gather: yes", "CUDA graphs: <scope>" (or "none"),
"host offload of activations: yes"."""

from __future__ import annotations

import re
from dataclasses import dataclass

def stated_precision(precision: str) -> str:
    """The number format of a run's `training.precision`: "mxfp8" (MXFP8, FP8-MX: FP8 with a scale per
    block of 32 elements), "fp8", "fp16", else "bf16"."""
    words = precision.upper()
    if "MXFP8" in words or "FP8-MX" in words:
        return "mxfp8"
    if "FP8" in words:
        return "fp8"
    return "fp16" if "FP16" in words else "bf16"


def stated_fp8_recipe(precision: str, other_settings: str) -> str | None:
    """How an FP8 run scales: "current" (Megatron-Bridge's FP8-CS; torchao's tensorwise dynamic
    scaling, stated "current scaling"), "delayed" (stated "delayed scaling"), or None (not FP8, MXFP8,
    or not stated)."""
    if stated_precision(precision) != "fp8":
        return None
    if "FP8-CS" in precision.upper() or "current scaling" in other_settings.lower():
        return "current"
    return "delayed" if "delayed scaling" in other_settings.lower() else None


def stated_fp8_parameters(other_settings: str) -> bool:
    """Whether the run gathers its sharded weights in FP8 ("FP8 parameter all-gather: yes"; torchtitan's
    enable_fsdp_float8_all_gather)."""
    return re.search(r"fp8 parameter all-gather: yes", other_settings, re.IGNORECASE) is not None


def stated_cuda_graphs(other_settings: str) -> str | None:
    """The scope of the run's CUDA graphs as stated after "CUDA graphs:" (up to the next ";"), or None
    when it states none."""
    found = re.search(r"CUDA graphs:\s*([^;]*)", other_settings, re.IGNORECASE)
    scope = found.group(1).strip() if found else ""
    return None if scope.lower() in ("", "none") else scope


def stated_dispatcher(other_settings: str) -> str:
    """The clauses of a run's other settings that name its token dispatcher, lower case, without
    their remarks in parentheses (a base configuration's backend a script leaves unused)."""
    plain = re.sub(r"\([^)]*\)", "", other_settings)
    return " ".join(clause for clause in plain.lower().split(";") if "dispatcher" in clause)


def stated_host_offload(other_settings: str) -> bool:
    """Whether the run moves activations to host memory between the forward and backward passes
    ("host offload of activations: yes"; MaxText's remat_policy custom with "offload", Megatron's
    cpu_offloading)."""
    return re.search(r"host offload of activations: yes", other_settings, re.IGNORECASE) is not None


def stated_weight_dtype(precision: str, other_settings: str) -> str | None:
    """What the run keeps its weights in between steps, when it says (`TrainingOptions.weight_dtype`):
    "bfloat16" ("weight_dtype bfloat16", "bfloat16 weights"), "float32" ("float32 weights", MaxText's
    base.yml default as the run states it), or None (not stated: the recipe's)."""
    words = f"{precision} {other_settings}".lower()
    if re.search(r"weight_dtype[ =:]*bfloat16|bfloat16 weights", words):
        return "bfloat16"
    return "float32" if "float32 weights" in words else None


@dataclass(frozen=True, kw_only=True)
class StatedSettings:
    """A run's number format, FP8 scaling, FP8 weight gathers, CUDA graph scope and host offload, as it
    states them (`of`)."""

    precision: str
    fp8_recipe: str | None
    fp8_parameters: bool
    cuda_graphs: str | None
    host_offload: bool
    weight_dtype: str | None

    @classmethod
    def of(cls, training: dict) -> StatedSettings:
        """The settings a run's `training` section states (a missing text states nothing)."""
        precision, other = training.get("precision") or "", training.get("other_settings") or ""
        return cls(precision=stated_precision(precision), fp8_recipe=stated_fp8_recipe(precision, other),
                   fp8_parameters=stated_fp8_parameters(other), cuda_graphs=stated_cuda_graphs(other),
                   host_offload=stated_host_offload(other), weight_dtype=stated_weight_dtype(precision, other))


#: The words of a CUDA-graph scope that captures every kernel of the step (Megatron-Core's
#: --cuda-graph-scope full_iteration; "local": Megatron's per-layer graphs of the whole layer).
WHOLE_STEP_SCOPES = ("full_iteration", "full-iteration", "full iteration", "local")


def whole_step_graphs(scope: str | None) -> bool:
    """Whether a stated CUDA-graph scope replays every kernel of the step (`WHOLE_STEP_SCOPES`). A
    partial scope (Transformer Engine's graphs of the attention, the MoE router and preprocessing
    only) is priced as eager: the kernels outside it, the experts' among them, still wait on the
    host (a simplification: the graphed part's own launches are not taken off)."""
    return scope is not None and any(words in scope.lower() for words in WHOLE_STEP_SCOPES)


def unmodelled_attention(architecture: str) -> str | None:
    """Why phaze cannot predict a model of this stated architecture, or None: sliding-window attention
    is not modelled; multi-head latent attention is (`graph_extract.ModelSpec.kv_lora_rank`) but a
    run's row has no field for its ranks."""
    words = architecture.lower()
    if re.search(r"sliding[- ]window", words):
        return "sliding-window attention: not modelled"
    if "latent attention" in words or re.search(r"\bmla\b", words):
        return "multi-head latent attention: a run's row does not give its ranks (q_lora_rank, kv_lora_rank)"
    return None


#: How far a run's stated memory may be from the known chip's capacity, in GB or in GiB, and still name
#: that chip: vendors round ("141 GB" for the H200's 140.4 GiB the GPU reports); another variant
#: differs by more (the 96 GB H100 beside the 80 GiB one: 12 %).
VARIANT_TOLERANCE = 0.02


def unknown_variant(device_type: str, hbm_capacity: float) -> str | None:
    """Why a run's chip is another variant than the chip phaze knows by its name, or None: its device
    type states a memory size ("96GB") farther than `VARIANT_TOLERANCE` from the known chip's capacity
    both in GB and in GiB (vendors state 80 GiB as "80 GB")."""
    stated = re.search(r"(\d+)\s*GB", device_type)
    if stated is None:
        return None
    gigabytes = int(stated.group(1))
    if any(abs(gigabytes - capacity) <= VARIANT_TOLERANCE * gigabytes for capacity in (hbm_capacity / 1e9,
                                                                                      hbm_capacity / 2**30)):
        return None
    return (f"hardware {device_type}: {gigabytes} GB, another variant than the "
            f"{hbm_capacity / 2**30:.0f} GiB chip phaze knows by that name")
