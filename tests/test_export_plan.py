"""Any model exported once and split by a plan: Hugging Face config.json files of families phaze has no
code for (built by transformers), a plain PyTorch module with a torchtitan-style plan, the plan derived
by structure, and each plan's ranks run on real tensors against the unsharded model."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.distributed.tensor.placement_types import Shard

import phaze.api
from graph_extract import MODELS, extract, get_spec, valid_tensor_parallel_widths, verify_tensor_parallel
from graph_extract.factory import factory_spec
from graph_extract.plan import COLWISE, ROWWISE, Plan, read_plan
from graph_extract.regions import OP_LEVEL
from graph_extract.serialize import layer_graph_to_dict
from phaze_common.checks import InputError
from test_model_factory import assert_same_layers, llama_parameters

DATA = Path(__file__).resolve().parent / "data"
CONFIGS = DATA / "hf_configs"
LLAMA, LLAMA_PLAN = DATA / "hf_llama.py", DATA / "hf_llama_plan.yaml"
#: The models' published sizes (their model cards: 7.61 B, 9.24 B, 3.8 B, 7.3 B, 21 B).
FAMILIES = {
    "Qwen2.5-7B": 7_615_616_512,
    "gemma-2-9b": 9_241_705_984,
    "Phi-3-mini-4k-instruct": 3_821_079_552,
    "OLMo-2-1124-7B": 7_298_617_344,
    "gpt-oss-20b": 20_914_757_184,
}


def transformers_parameters(path: Path) -> int:
    """What transformers builds from the file: every parameter of the whole model, once."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = json.loads(path.read_text())
    config.pop("quantization_config", None)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    return sum(parameter.numel() for parameter in model.parameters())


# 0. the zoo, exported once and split by its derived plan ------------------------------------------

ZOO_GRAPHS = json.loads((DATA / "zoo_layer_graphs.json").read_text())


#: The layer fields the golden file predates (`layer_record`).
PRODUCT_OUTPUT_FIELDS = ("product_output_bytes", "replicated_product_output_bytes")


def layer_record(extracted) -> dict:
    """The extraction as tests/data/zoo_layer_graphs.json records it: runs of equal layers, edges,
    tied weights, parameter counts and repeat groups. The file predates torchtitan's operator-level
    recompute module (`OP_LEVEL`), which the same module pass adds to every block, and the product
    outputs JAX's checkpoint_dots_with_no_batch_dims keeps (`product_output_bytes` and its replicated
    part): they are left out here (tests/test_recompute_modules.py and tests/test_product_outputs.py
    check them by hand)."""
    layers = json.loads(json.dumps(layer_graph_to_dict(extracted.layer_graph)))
    for layer in layers["layers"]:
        for name in PRODUCT_OUTPUT_FIELDS:
            layer.pop(name, None)
        if "recompute_modules" in layer:
            layer["recompute_modules"] = [module for module in layer["recompute_modules"] if module["name"] != OP_LEVEL]
    runs: list[dict] = []
    for layer in layers["layers"]:
        body = {key: value for key, value in layer.items() if key not in ("id", "name")}
        if runs and runs[-1]["layer"] == body:
            runs[-1]["ids"][1] = layer["id"]
        else:
            runs.append({"ids": [layer["id"], layer["id"]], "names": layer["name"], "layer": body})
    return {"parameter_count": extracted.parameter_count, "parameters_per_device": extracted.parameters_per_device,
            "active_parameter_count": extracted.active_parameter_count,
            "repeat_groups": [list(group) for group in extracted.repeat_groups],
            "sequence_length": extracted.sequence_length, "layers": runs, "edges": layers["edges"],
            "tied": layers["tied"]}


@pytest.mark.parametrize("name", MODELS)
def test_the_zoo_model_split_by_its_plan_has_the_megatron_shards_layer_graphs(name, tmp_path):
    """At every width up to 8 (the mixtures' experts split in their own group, so every e and τ
    reads the same graph), micro-batch 1 and the model's sequence: every layer (FLOPs, parameters,
    activations kept by kind and their replicated shares, collectives and their bytes, recompute
    modules), the edges, the parameter counts and the repeat groups equal those of the zoo's
    Megatron shards traced by torch.fx (tests/data/zoo_layer_graphs.json)."""
    widths = valid_tensor_parallel_widths(name, 8)
    assert [key for key in ZOO_GRAPHS if key.startswith(f"{name}/")] == [f"{name}/t{width}" for width in widths]
    for width in widths:
        assert layer_record(extract(name, 1, None, width)) == ZOO_GRAPHS[f"{name}/t{width}"], width


# 1. config.json files of families phaze has no code for ----------------------------------------

@pytest.mark.parametrize("name", FAMILIES)
def test_a_config_json_transformers_builds_is_predicted_at_t1_and_t4(name, tmp_path):
    """Predicted at t = 1 and t = 4 (64 H100s, p = 4); prediction.json's parameters are transformers'
    count of the same file, the published size; t = 4 holds a quarter of each block's split weights."""
    from phaze.modes.predict import prediction_record

    path = CONFIGS / name / "config.json"
    keys = dict(model=str(path), chip="h100_sxm", system="dgx_h100", num_devices=64, global_batch_size=64,
                sequence_length=4096, pipeline_parallel_width=4, micro_batch_size=1, cache_dir=str(tmp_path))
    records = {}
    for width in (1, 4):
        checked = phaze.api.settings("predict", tensor_parallel_width=width, data_parallel_width=16 // width, **keys)
        prediction = phaze.api.run_prediction(checked)
        assert prediction.step.infeasible_reason is None and prediction.tokens_per_s > 0
        records[width] = prediction_record(checked, prediction, phaze.api.graphs(checked))
    assert records[1]["parameters"]["total"] == records[4]["parameters"]["total"] == transformers_parameters(path) \
        == FAMILIES[name]
    one, four = (extract(get_spec(phaze.api.settings("predict", tensor_parallel_width=1, data_parallel_width=16,
                                                     **keys).spec), 1, 4096, width) for width in (1, 4))
    block_one, block_four = one.layer_graph.layers[1], four.layer_graph.layers[1]
    assert block_four.forward_flops * 4 == pytest.approx(block_one.forward_flops, rel=0.02)  # the products split


def test_phaze_predict_writes_a_config_jsons_parameters(tmp_path):
    """From the command line at t = 4: prediction.json's parameters are transformers' count."""
    path = CONFIGS / "Qwen2.5-7B" / "config.json"
    run = subprocess.run([sys.executable, "-m", "phaze", "predict", "model=custom", f"model.config={path}",
                          "chip=h100_sxm", "system=dgx_h100", "num_devices=64", "global_batch_size=64",
                          "sequence_length=4096", "tensor_parallel_width=4", "pipeline_parallel_width=4",
                          "data_parallel_width=4", f"cache_dir={tmp_path / 'cache'}",
                          f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(DATA.parents[1])})
    assert run.returncode == 0, run.stderr
    record = json.loads((tmp_path / "run" / "prediction.json").read_text())
    assert record["parameters"]["total"] == transformers_parameters(path) == FAMILIES["Qwen2.5-7B"]
    assert "Qwen2.5-7B (7.62B parameters)" in run.stdout.splitlines()[0]


def test_the_published_config_names_the_model_and_reads_its_sequence_cap(tmp_path):
    """GPT-OSS-20B's facts; its active parameters skip 28 of each block's 32 experts' weights
    (gate_up 2880 x 5760, down 2880 x 2880), and it is predicted with its experts over 4 ranks."""
    spec = factory_spec(str(CONFIGS / "gpt-oss-20b" / "config.json"))
    assert (spec.name, spec.num_layers, spec.num_heads, spec.kv_heads, spec.kv_channels) == ("gpt-oss-20b", 24, 64, 8, 64)
    assert (spec.num_experts, spec.experts_per_token) == (32, 4)
    assert extract(spec, 1, 256, 1).active_parameter_count == FAMILIES["gpt-oss-20b"] - 24 * 28 * (
        2880 * 5760 + 2880 * 2880)
    keys = dict(model=str(CONFIGS / "gpt-oss-20b" / "config.json"), chip="h100_sxm", system="dgx_h100",
                num_devices=64, global_batch_size=64, sequence_length=4096, pipeline_parallel_width=4,
                tensor_parallel_width=1, data_parallel_width=16, cache_dir=str(tmp_path))
    experts = phaze.api.run_prediction(phaze.api.settings("predict", expert_parallel_width=4, **keys)).step
    assert experts.infeasible_reason is None and experts.breakdown["expert_parallel"] > 0
    assert spec.default_sequence_length == 8192  # min(131,072 positions, 8192): not the 128-token window
    assert valid_tensor_parallel_widths(spec, 128) == (1, 2, 4, 8, 16, 32, 64)  # above 8: a key/value head on 2+


def test_the_blocks_form_a_chain_without_the_masks_every_stage_builds():
    """The causal mask and rotary tables the embedding layer builds from the batch are not sent between
    stages: each edge carries the hidden state, b·s·h·2 bytes."""
    extracted = extract(factory_spec(str(CONFIGS / "Qwen2.5-7B" / "config.json")), 1, 256, 4)
    assert [(edge.source, edge.dest, edge.bytes) for edge in extracted.layer_graph.edges] == [
        (k, k + 1, 256 * 3584 * 2) for k in range(29)]


# 2. a plain module and a torchtitan-style plan ----------------------------------------------------

@pytest.mark.parametrize("width", [2, 4, 8])
def test_a_plain_llama_with_a_torchtitan_plan_is_the_zoo_llama3_8b(width):
    """The plan file's split of an unsharded Hugging Face-style Llama gives the zoo's Megatron shard:
    every layer (FLOPs, parameters, activations kept by kind, replicated shares, collective bytes),
    the edges and the published 8,030,261,248 parameters."""
    spec = factory_spec(f"{LLAMA}:llama3_8b").with_overrides(plan=str(LLAMA_PLAN))
    mine = extract(spec, 1, sequence_length=16, tensor_parallel_width=width)
    theirs = extract(get_spec("llama3-8b"), 1, sequence_length=16, tensor_parallel_width=width)
    assert_same_layers(mine, theirs, replicated=True)
    assert mine.parameters_per_device == theirs.parameters_per_device
    assert mine.parameter_count == llama_parameters(32, 4096, 32, 8, 14336, 128256)


def test_the_plan_derived_by_structure_is_the_torchtitan_plan():
    spec = factory_spec(f"{LLAMA}:llama3_8b")
    derived = extract(spec, 1, sequence_length=16, tensor_parallel_width=4)
    written = extract(spec.with_overrides(plan=str(LLAMA_PLAN)), 1, sequence_length=16, tensor_parallel_width=4)
    assert derived.layer_graph == written.layer_graph


@pytest.mark.parametrize("width", [1, 2])
def test_verify_tensor_parallel_passes_on_the_plan(width):
    """The plan's ranks, run in lockstep on random weights, compute the unsharded module's losses."""
    spec = factory_spec(f"{LLAMA}:tiny").with_overrides(plan=str(LLAMA_PLAN), default_sequence_length=16)
    result = verify_tensor_parallel(spec, width)
    assert result.passed, result


def test_a_plan_that_does_not_compose_is_refused_at_the_operator():
    """o_proj colwise takes the heads' split output (Shard on the features) where it needs it whole."""
    from graph_extract.export import export
    from graph_extract.factory import model_inputs
    from graph_extract.plan_pass import apply_plan
    from tests.data.hf_llama import tiny

    plan = Plan(styles=(("model.layers.*.self_attn.o_proj", COLWISE), *read_plan(LLAMA_PLAN).styles))
    with torch.device("meta"):
        model = tiny(16)
    with pytest.raises(InputError) as raised:
        apply_plan(export(model, model_inputs(model, 1, 16)), plan, 2)
    assert str(raised.value) == ("plan: aten.linear.default at model.layers.0.self_attn.o_proj: a colwise product of "
                                 "a S(2) input; the plan cannot split it at width 2")


# 3. families of transformers, tiny, on real tensors ---------------------------------------------

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8, vocab_size=256,
            max_position_embeddings=64, head_dim=8, pad_token_id=0, bos_token_id=1, eos_token_id=2)


@pytest.mark.parametrize("name", FAMILIES)
def test_the_derived_plan_of_each_family_computes_the_model(name, tmp_path):
    """Each family cut to a tiny configuration (its own modules: Gemma's soft-capping and scaled
    embedding, OLMo's QK-norm over the split heads, Phi-3's fused projections, GPT-OSS's grouped
    experts and attention sinks) gives the model's losses on 4 ranks."""
    config = json.loads((CONFIGS / name / "config.json").read_text())
    config.update(TINY, num_key_value_heads=4)
    if "layer_types" in config:
        config["layer_types"] = config["layer_types"][:2]
    if "num_local_experts" in config:
        config.update(num_local_experts=4, num_experts_per_tok=2)
    for key in ("sliding_window", "query_pre_attn_scalar"):
        if config.get(key):
            config[key] = 8
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    result = verify_tensor_parallel(factory_spec(str(path)).with_overrides(default_sequence_length=16), 4)
    assert result.passed, result


# 4. plans in PyTorch's vocabulary ----------------------------------------------------------------

def test_a_plan_takes_pytorch_styles_and_names():
    plan = Plan.of({"a.*.q": ColwiseParallel(), "a.*.o": RowwiseParallel(), "head": "colwise", "emb": "RowwiseParallel"})
    assert plan.styles == (("a.*.q", COLWISE), ("a.*.o", ROWWISE), ("head", COLWISE), ("emb", ROWWISE))
    assert plan.style("a.3.q") == COLWISE and plan.style("a.3.k") is None
    assert plan.parameter_style("a.3.o.weight") == ROWWISE


@pytest.mark.parametrize("styles, message", [
    ({"q": "diagonal"}, "plan: q: unknown style 'diagonal'; allowed: ColwiseParallel, RowwiseParallel"),
    ({"o": RowwiseParallel(output_layouts=Shard(1))},
     "plan: o: RowwiseParallel with other layouts than its defaults; allowed: the defaults"),
])
def test_a_bad_plan_is_one_line(styles, message):
    with pytest.raises(InputError) as raised:
        Plan.of(styles)
    assert str(raised.value).startswith(message)


def test_a_plan_file_is_read_or_refused_in_one_line(tmp_path):
    assert read_plan(LLAMA_PLAN).style("model.layers.7.mlp.down_proj") == ROWWISE
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(InputError, match=r"^model.plan: .*list.yaml: must map module patterns to ColwiseParallel or "
                                         r"RowwiseParallel, got list$"):
        read_plan(tmp_path / "list.yaml")


def test_model_plan_on_the_command_line(tmp_path):
    """`model.plan=PATH` is read for an exported model and refused for the zoo's."""
    keys = dict(chip="h100_sxm", system="dgx_h100", num_devices=8, global_batch_size=8, tensor_parallel_width=2,
                pipeline_parallel_width=1, data_parallel_width=4, cache_dir=str(tmp_path))
    checked = phaze.api.settings("predict", model=f"{LLAMA}:tiny", **{"model.plan": str(LLAMA_PLAN)}, **keys)
    assert checked.spec.plan == str(LLAMA_PLAN)
    with pytest.raises(InputError, match=r"^model.plan: only for a model phaze splits by a plan"):
        phaze.api.settings("predict", model=f"{LLAMA}:llama3_8b_sharded", **{"model.plan": str(LLAMA_PLAN)}, **keys)
    with pytest.raises(InputError, match=r"^model.plan: unknown key; allowed: name, "):  # the zoo's are Megatron's
        phaze.api.settings("predict", model="llama3-8b", **{"model.plan": str(LLAMA_PLAN)}, **keys)
