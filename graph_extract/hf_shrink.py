"""A Hugging Face config.json shrunk for verification: the same `model_type` and structure (its norms,
biases, fused projections, grouped-query ratio, experts, attention kinds per block), two blocks and
small sizes, so that `graph_extract.verify` runs the model with real weights on the CPU.

The rule, over the size keys transformers reads (`shrunk`; a family's own names for the standard
keys, its `attribute_map`, are read as them: GPT-2's `n_embd` is `hidden_size`):

* blocks: the first `BLOCKS` (`num_hidden_layers`), and every top-level per-block list (a list as long
  as the blocks, `layer_types`) cut to its first entries; keys that name block indices
  (`max_window_layers`) are kept, so that the blocks are the full model's first ones;
* `hidden_size` `HIDDEN`, `num_attention_heads` `HEADS`; `num_key_value_heads` max(HEADS·K / N, 1)
  rounded down (the query heads per key/value head kept where HEADS allows, at least one key/value
  head: Megatron's rule holds each on width / heads ranks when the width is larger);
* `head_dim`, where the file gives it: HIDDEN / HEADS, times 2 (or 1/2) where the full model's heads
  together are wider (narrower) than its hidden size, as Gemma-2's and GPT-OSS's are;
* every feed-forward width (`INTERMEDIATE_KEYS`: `*intermediate_size`, ...): HIDDEN times the full
  model's ratio to its hidden size, rounded to a multiple of `MULTIPLE`;
* experts (`num_local_experts`, `num_experts`, `n_routed_experts`): at most `MAX_EXPERTS`; per token
  (`num_experts_per_tok`, `experts_per_token`): all of them if the full model routes to all, else at
  most half of them;
* `vocab_size` `VOCABULARY`, and each `*_token_id` beyond it taken modulo it;
* `max_position_embeddings` twice the sequence, and each `original_max_position_embeddings` (a rotary
  scaling's pre-training context) in the full model's ratio to it; each `sliding_window*` half the
  sequence where the full model's window is shorter than its positions (the window masks keys), else
  the positions;
* a rotary scaling's per-frequency lists (`short_factor`, `long_factor`) cut to the head's frequencies.

Every size the tensor-parallel plan splits (heads, key/value heads up to HEADS, intermediate sizes,
the vocabulary) is then a multiple of every width up to `MULTIPLE`. A key the rule does not know that
still makes a parameter larger than `LARGEST_DIMENSION` is refused (`check_shrunk`), naming it.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from phaze_common.checks import InputError, is_integer

BLOCKS = 2
HIDDEN = 128
HEADS = 8
VOCABULARY = 256
MAX_EXPERTS = 8
#: The widths up to which every split size divides.
MULTIPLE = 8
#: The standard size keys the rule shrinks (besides the feed-forward widths, `INTERMEDIATE_KEYS`).
SHRUNK_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
               "max_position_embeddings", "num_local_experts", "num_experts_per_tok")
#: The largest dimension of a shrunk model's parameter (fused projections of the shrunk sizes).
LARGEST_DIMENSION = 4096
#: Keys (endings) of feed-forward widths: `intermediate_size`, `moe_intermediate_size`,
#: `shared_expert_intermediate_size`, Falcon's `ffn_hidden_size`, OPT's `ffn_dim`, GPT-2's `n_inner`.
INTERMEDIATE_KEYS = ("intermediate_size", "ffn_hidden_size", "ffn_dim", "n_inner")
#: Hugging Face config keys of a mixture's routed experts (Mixtral and GPT-OSS, Qwen-MoE, DeepSeek), and
#: of the experts each token goes to.
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
EXPERTS_PER_TOKEN_KEYS = ("num_experts_per_tok", "experts_per_token")
#: The keys of a rotary scaling's parameters, and its lists of one factor per frequency.
ROTARY_KEYS = ("rope_scaling", "rope_parameters")
ROTARY_LISTS = ("short_factor", "long_factor")
ORIGINAL_POSITIONS = "original_max_position_embeddings"


def _positive(data: Mapping[str, object], key: str) -> int:
    value = data.get(key)
    if not is_integer(value) or value <= 0:
        raise InputError(f"{key}: must be a positive integer to shrink the model for verification, got {value!r}")
    return value


def _kv_heads(heads: int, kv_heads: int) -> int:
    if heads % kv_heads:
        raise InputError(f"num_key_value_heads: {kv_heads} does not divide num_attention_heads={heads}; allowed: a "
                         f"divisor of {heads}")
    return max(HEADS * kv_heads // heads, 1)


def _head_dim(hidden: int, heads: int, head_dim: object) -> int:
    """The shrunk head width: HIDDEN / HEADS, doubled (halved) where the heads are wider (narrower)
    than the hidden size."""
    width = HIDDEN // HEADS
    if not is_integer(head_dim) or head_dim <= 0:
        raise InputError(f"head_dim: must be a positive integer to shrink the model for verification, got "
                         f"{head_dim!r}")
    return width * 2 if heads * head_dim > hidden else width // 2 if heads * head_dim < hidden else width


def _feed_forward(key: str, value: object, hidden: int, blocks: int) -> int | list[int]:
    """A feed-forward width (or one per block) in the full model's ratio to the hidden size, a multiple
    of MULTIPLE."""
    if isinstance(value, list) and len(value) == blocks:
        return [_feed_forward(key, item, hidden, blocks) for item in value[:BLOCKS]]
    if not is_integer(value) or value <= 0:
        raise InputError(f"{key}: must be a positive integer (or one per block) to shrink the model for "
                         f"verification, got {value!r}")
    return max(MULTIPLE, MULTIPLE * round(HIDDEN * value / hidden / MULTIPLE))


def _experts(data: dict, shrunk: dict) -> None:
    counts = [key for key in EXPERT_COUNT_KEYS if is_integer(data.get(key)) and data[key] > 1]
    if not counts:
        return
    experts = data[counts[0]]
    fewer = min(experts, MAX_EXPERTS)
    shrunk.update({key: fewer for key in counts})
    for key in EXPERTS_PER_TOKEN_KEYS:
        if data.get(key) is not None:
            per_token = _positive(data, key)
            shrunk[key] = fewer if per_token >= experts else max(1, min(per_token, fewer // 2))


def _original_positions(value: object, positions: int, shrunk: int) -> object:
    """A rotary scaling's pre-training context in the full model's ratio to its positions."""
    return max(1, round(value * shrunk / positions)) if is_integer(value) and value > 0 else value


def _rotary(data: dict, shrunk: dict, positions: int, shrunk_positions: int, head_dim: int, fewer: int) -> None:
    """Per-frequency lists of a rotary scaling cut to the shrunk head's frequencies (of `head_dim` and
    `fewer` dimensions), its pre-training context scaled with the positions."""
    if ORIGINAL_POSITIONS in data:
        shrunk[ORIGINAL_POSITIONS] = _original_positions(data[ORIGINAL_POSITIONS], positions, shrunk_positions)
    for key in ROTARY_KEYS:
        scaling = data.get(key)
        if not isinstance(scaling, dict):
            continue
        if ORIGINAL_POSITIONS in scaling:
            scaling = {**scaling, ORIGINAL_POSITIONS: _original_positions(scaling[ORIGINAL_POSITIONS], positions,
                                                                          shrunk_positions)}
        fraction = scaling.get("partial_rotary_factor", data.get("partial_rotary_factor", 1.0))
        frequencies, kept = int(head_dim * fraction) // 2, int(fewer * fraction) // 2
        for name in ROTARY_LISTS:
            values = scaling.get(name)
            if isinstance(values, list):
                if len(values) != frequencies:
                    raise InputError(f"{key}.{name}: {len(values)} factors for {frequencies} rotary frequencies; "
                                     "cannot shrink it for verification")
                scaling = {**scaling, name: values[:kept]}
        shrunk[key] = scaling


def shrunk(data: Mapping[str, object], sequence_length: int, aliases: Mapping[str, str] | None = None) -> dict:
    """The JSON object of a config.json shrunk by the module's rule, for `sequence_length` tokens;
    `aliases` maps the standard key names to the family's own (transformers' `attribute_map`, GPT-2's
    `n_embd` for `hidden_size`). InputError naming a size key it cannot shrink."""
    data, aliases = dict(data), dict(aliases or {})

    def key(name: str) -> str:
        return aliases.get(name, name)

    blocks = _positive(data, key("num_hidden_layers"))
    hidden = _positive(data, key("hidden_size"))
    heads = _positive(data, key("num_attention_heads"))
    kv_heads = heads if data.get(key("num_key_value_heads")) is None else _positive(data, key("num_key_value_heads"))
    positions = _positive(data, key("max_position_embeddings"))
    _positive(data, key("vocab_size"))
    small = dict(data)
    small.update({key("num_hidden_layers"): min(blocks, BLOCKS), key("hidden_size"): HIDDEN,
                  key("num_attention_heads"): HEADS, key("vocab_size"): VOCABULARY,
                  key("max_position_embeddings"): 2 * sequence_length})
    if key("num_key_value_heads") in data:
        small[key("num_key_value_heads")] = _kv_heads(heads, kv_heads)
    for name in ("torch_dtype", "dtype"):
        small.pop(name, None)  # built in float32
    full_head_dim = data.get(key("head_dim"))
    head_dim = hidden // heads if full_head_dim is None else full_head_dim
    fewer_head_dim = HIDDEN // HEADS if full_head_dim is None else _head_dim(hidden, heads, full_head_dim)
    if full_head_dim is not None:
        small[key("head_dim")] = fewer_head_dim
    for name, value in data.items():
        if name.endswith(INTERMEDIATE_KEYS) and value not in (None, 0):
            small[name] = _feed_forward(name, value, hidden, blocks)
        elif name.startswith("sliding_window") and is_integer(value) and value > 0:
            small[name] = sequence_length // 2 if value < positions else 2 * sequence_length
        elif name.endswith(("_token_id", "_token_ids")):
            small[name] = _token_ids(name, value)
        elif isinstance(value, list) and len(value) == blocks and blocks > BLOCKS:
            small[name] = value[:BLOCKS]
    _experts(data, small)
    _rotary(data, small, positions, 2 * sequence_length, head_dim, fewer_head_dim)
    return small


def _token_ids(key: str, value: object) -> object:
    if isinstance(value, list):
        return [_token_ids(key, item) for item in value]
    if value is None:
        return None
    if not is_integer(value) or value < 0:
        raise InputError(f"{key}: must be a token index (an integer >= 0) or null, got {value!r}")
    return value % VOCABULARY


def check_shrunk(model: nn.Module, data: Mapping[str, object]) -> None:
    """InputError naming the key of the full config `data` that left a parameter of the shrunk
    `model` (on the meta device) larger than LARGEST_DIMENSION: a size the rule does not know."""
    for name, parameter in model.named_parameters():
        for size in parameter.shape:
            if size > LARGEST_DIMENSION:
                keys = [key for key, value in data.items() if is_integer(value) and value == size]
                raise InputError(f"{keys[0] if keys else name}: a size of {size} the verification's shrink rule "
                                 f"does not know (parameter {name} of shape {tuple(parameter.shape)}); it shrinks "
                                 f"{', '.join(SHRUNK_KEYS)} and the feed-forward widths")
