"""Sharding graphs of the layers the tests and benchmarks use: a multi-layer perceptron, a BERT
encoder layer and a mixture-of-experts layer. Biases and layer norms' scale and shift are left out
(their gradients' all-reduces are small next to the weights')."""

from __future__ import annotations

from phaze_common.checks import InputError, positive_integer

from .graph import GraphBuilder, ShardingGraph


def mlp(layers: int, batch: int, hidden: int, *, element_bytes: int = 1, boundary: str = "any") -> ShardingGraph:
    """`layers` products `h[b,k] · w[k,n] -> y[b,n]` with `[hidden, hidden]` weights, a ReLU
    between two (ops `linear1`, `relu1`, `linear2`, ..., `linear<layers>`)."""
    positive_integer("layers", layers)
    graph = GraphBuilder(element_bytes)
    graph.input("h0", {"b": batch, "k": hidden})
    for layer in range(1, layers + 1):
        graph.parameter(f"w{layer}", {"k": hidden, "n": hidden})
        graph.product(f"linear{layer}", f"h{layer - 1}[b,k] w{layer}[k,n] -> y{layer}[b,n]")
        if layer < layers:
            graph.elementwise(f"relu{layer}", f"y{layer}[b,n] -> h{layer}[b,n]")
    return graph.build(boundary, boundary)


def bert_layer(batch: int, seq: int, hidden: int, heads: int, ffn: int, *, element_bytes: int = 1,
               boundary: str = "replicated") -> ShardingGraph:
    """A post-norm BERT encoder layer (Devlin et al. 2019). Dims: b batch, s and r sequence (r:
    the keys'), h hidden, t the three of Q, K and V, a heads, d head dim, f feed-forward.

    qkv: x[b,s,h]·w_qkv[h,t,a,d]; q, k, v: views; scores: q·k over d -> [b,a,s,r]; softmax over r;
    context: p·v over r -> [b,s,a,d]; attn_out: c·w_o[a,d,h] over a, d; add1: + x; ln1 over h;
    up: ·w_up[h,f]; gelu; down: ·w_down[f,h]; add2: + ln1's output; ln2 over h.
    """
    if hidden % heads:
        raise InputError(f"heads: must divide hidden ({hidden}), got {heads}")
    graph = GraphBuilder(element_bytes)
    graph.input("x", {"b": batch, "s": seq, "h": hidden})
    graph.parameter("w_qkv", {"h": hidden, "t": 3, "a": heads, "d": hidden // heads})
    graph.product("qkv", "x[b,s,h] w_qkv[h,t,a,d] -> qkv[b,s,t,a,d]")
    for name in ("q", "k", "v"):
        graph.view(name, f"qkv[b,s,t,a,d] -> {name}[b,s,a,d]")
    graph.product("scores", "q[b,s,a,d] k[b,r,a,d] -> scores[b,a,s,r]")
    graph.normalise("softmax", "scores[b,a,s,r] -> probs[b,a,s,r]", over=("r",))
    graph.product("context", "probs[b,a,s,r] v[b,r,a,d] -> context[b,s,a,d]")
    graph.parameter("w_o", {"a": heads, "d": hidden // heads, "h": hidden})
    graph.product("attn_out", "context[b,s,a,d] w_o[a,d,h] -> attn[b,s,h]")
    graph.elementwise("add1", "attn[b,s,h] x[b,s,h] -> sum1[b,s,h]")
    graph.normalise("ln1", "sum1[b,s,h] -> y1[b,s,h]", over=("h",))
    graph.parameter("w_up", {"h": hidden, "f": ffn})
    graph.product("up", "y1[b,s,h] w_up[h,f] -> u[b,s,f]")
    graph.elementwise("gelu", "u[b,s,f] -> g[b,s,f]")
    graph.parameter("w_down", {"f": ffn, "h": hidden})
    graph.product("down", "g[b,s,f] w_down[f,h] -> m[b,s,h]")
    graph.elementwise("add2", "m[b,s,h] y1[b,s,h] -> sum2[b,s,h]")
    graph.normalise("ln2", "sum2[b,s,h] -> out[b,s,h]", over=("h",))
    return graph.build(boundary, boundary)


def moe_layer(tokens: int, hidden: int, ffn: int, experts: int, top_k: int, *, groups: int | None = None,
              capacity_factor: float = 1.0, element_bytes: int = 1, boundary: str = "any") -> ShardingGraph:
    """A GShard mixture-of-experts layer (Lepikhin et al., ICLR'21, Sec. 3, Algorithm 2). The tokens
    are cut into `groups` groups (default: one per expert) of s = tokens/groups; each expert takes
    c = s·top_k·capacity_factor/experts tokens of each group. Dims: g group, s token, m hidden,
    e expert, c capacity slot, f feed-forward.

    gate: x[g,s,m]·w_gate[m,e]; softmax over e; route (top-k with capacity) -> mask[g,s,e,c];
    dispatch: mask·x over s -> xd[e,g,c,m]; up: xd·w_up[e,m,f]; relu; down: ·w_down[e,f,m];
    combine: y[e,g,c,m]·mask over e, c -> out[g,s,m].
    """
    groups = experts if groups is None else groups
    for field, value in (("tokens", tokens), ("experts", experts), ("top_k", top_k), ("groups", groups)):
        positive_integer(field, value)
    if tokens % groups:
        raise InputError(f"groups: must divide tokens ({tokens}), got {groups}")
    if top_k > experts:
        raise InputError(f"top_k: must be at most experts ({experts}), got {top_k}")
    per_group = tokens // groups
    capacity = per_group * top_k * capacity_factor / experts
    if capacity != int(capacity) or capacity < 1:
        raise InputError(f"capacity_factor: tokens/groups·top_k·capacity_factor/experts must be a positive "
                         f"integer, got {capacity}")
    graph = GraphBuilder(element_bytes)
    graph.input("x", {"g": groups, "s": per_group, "m": hidden})
    graph.parameter("w_gate", {"m": hidden, "e": experts})
    graph.product("gate", "x[g,s,m] w_gate[m,e] -> logits[g,s,e]")
    graph.normalise("gate_softmax", "logits[g,s,e] -> probs[g,s,e]", over=("e",))
    graph.op("route", "route", "probs[g,s,e] -> mask[g,s,e,c]", sizes={"c": int(capacity)}, fixed=("s", "e", "c"))
    graph.product("dispatch", "mask[g,s,e,c] x[g,s,m] -> xd[e,g,c,m]")
    graph.parameter("w_up", {"e": experts, "m": hidden, "f": ffn})
    graph.product("up", "xd[e,g,c,m] w_up[e,m,f] -> hid[e,g,c,f]")
    graph.elementwise("relu", "hid[e,g,c,f] -> act[e,g,c,f]")
    graph.parameter("w_down", {"e": experts, "f": ffn, "m": hidden})
    graph.product("down", "act[e,g,c,f] w_down[e,f,m] -> y[e,g,c,m]")
    graph.product("combine", "y[e,g,c,m] mask[g,s,e,c] -> out[g,s,m]")
    return graph.build(boundary, boundary)
