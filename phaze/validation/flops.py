"""The FLOP accounting of published runs: the model FLOPs per iteration as Megatron and MaxText
count them (what a run's stated MFU or TFLOP/s means), and the measured seconds per iteration."""

from __future__ import annotations



from graph_extract import ModelSpec
from phaze.validation.recipes import FROM_FLOPS, FROM_TOKENS, Recipe



def megatron_model_flops(spec: ModelSpec, batch: int, sequence: int, width: int, attention: float = 1.0) -> float:
    """FLOPs per iteration as Megatron-LM counts them (megatron/training/training.py,
    num_floating_point_operations): 12·B·s·L·h²·((1 + g/a + s/h)·(a·k/h) + MLP/(L·h) + V/(2·L·h)),
    the MLP term Σ over blocks of the dense width f, or a mixture's k routed experts' width plus its
    shared experts', × 3/2 when gated (SwiGLU), and the padded vocabulary V. Release core_r0.8.0
    counts the full s × s attention; 2025's half of it, s/(2h) (`attention`: the share counted). Multi-head latent
    attention is not counted here (no calibration run has it)."""
    h, heads, layers = spec.hidden_size, spec.num_heads, spec.num_layers
    groups, channels = spec.num_kv_heads or heads, spec.kv_channels or h // heads
    gated = 1.5 if spec.activation == "swiglu" else 1.0
    moe_blocks = sum(spec.is_moe_block(index) for index in range(layers))
    routed = spec.expert_ffn_hidden_size * (spec.experts_per_token + spec.shared_experts) if spec.num_experts else 0
    mlp = ((layers - moe_blocks) * spec.ffn_hidden_size + moe_blocks * routed) * gated
    return 12 * batch * sequence * layers * h * h * (
        (1 + groups / heads + attention * sequence / h) * heads * channels / h + mlp / (layers * h)
        + spec.padded_vocab_size(width) / (2 * layers * h))


def maxtext_model_flops(spec: ModelSpec, batch: int, sequence: int, attention: float = 0.5) -> float:
    """FLOPs per iteration as MaxText counts its TFLOP/s (MaxText/train.py calculate_training_tflops at
    76bd53b0f): 6 per parameter per token, every parameter counted (the tied embedding, one norm per
    parallel block, the query, key and value norms), plus `attention` × 12·L·a·d_head·s² per sequence.
    Its READMEs' tables were measured under the formula of their day: the whole s × s (v5e, Nov 2023:
    `attention` 1), half of it (v5p, Dec 2023, after 4e41a72d1: 0.5), none (v4, spring 2023: 0)."""
    h, heads, layers = spec.hidden_size, spec.num_heads, spec.num_layers
    channels = spec.kv_channels or h // heads
    kv_heads = spec.num_kv_heads or heads
    block = h * channels * (2 * heads + 2 * kv_heads) + 2 * h * spec.ffn_hidden_size + h + 3 * channels
    parameters = layers * block + spec.vocab_size * h + h  # the embedding (tied), the final norm
    return 6 * parameters * batch * sequence + attention * 12 * layers * heads * channels * sequence**2 * batch


def measured_seconds(run: dict, flops: float | None = None) -> tuple[float | None, str]:
    """(seconds per iteration, how derived): the stated or derived time; else the global batch's tokens
    (sequences × sequence length) / the measured tokens per second; else, given the FLOPs of an
    iteration as the run's framework counts them (`flops`), those / (the measured model TFLOP/s × the
    devices)."""
    measured = run["measured"]
    seconds = measured["seconds_per_iteration"] or measured["seconds_per_iteration_derived"]
    if seconds is not None:
        return float(seconds), ""
    tokens_per_s = measured["tokens_per_sec_total"] or (
        measured["tokens_per_sec_per_device"] and measured["tokens_per_sec_per_device"] * run["hardware"]["num_devices"])
    if tokens_per_s:
        return run["batch"]["global_batch_size_seqs"] * run["model"]["seq_length_tokens"] / tokens_per_s, FROM_TOKENS
    if flops is not None and measured["tflop_per_s_per_device"]:
        return flops / (measured["tflop_per_s_per_device"] * 1e12 * run["hardware"]["num_devices"]), FROM_FLOPS
    return None, ""


def framework_flops(recipe: Recipe, spec: ModelSpec, batch: int, sequence: int, width: int) -> float:
    """FLOPs of an iteration of `batch` sequences as the recipe's framework counts its model TFLOP/s."""
    if recipe.flop_count == "maxtext":
        return maxtext_model_flops(spec, batch, sequence, recipe.flops_attention)
    return megatron_model_flops(spec, batch, sequence, width, recipe.flops_attention)
