"""Plans verified by execution on tiny models: the five published config.json files shrunk for
verification (graph_extract.hf_shrink) under their derived plans, plans given explicitly (written for
the full model, matched by the tiny one's module paths), a wrong plan caught, and results cached."""

import json
import shutil
from functools import lru_cache
from pathlib import Path

import pytest
import torch

import graph_extract.verify as verify_module
from graph_extract import hf, verify_tensor_parallel
from graph_extract.export import export
from graph_extract.factory import factory_spec
from graph_extract.hf_shrink import shrunk
from graph_extract.parallel import all_reduce
from graph_extract.plan import COLWISE, ROWWISE, Plan, derived_plan
from graph_extract.plan_pass import apply_plan
from graph_extract.transformer import TransformerModel, example_inputs
from graph_extract.verify import MICRO_BATCH_SIZE, SEQUENCE, TINY
from graph_extract.zoo import get_spec
from phaze_common.checks import InputError

CONFIGS = Path(__file__).resolve().parent / "data" / "hf_configs"
FAMILIES = ("Qwen2.5-7B", "gemma-2-9b", "Phi-3-mini-4k-instruct", "OLMo-2-1124-7B", "gpt-oss-20b")
TOLERANCE = 1e-4


def config(name: str) -> Path:
    return CONFIGS / name / "config.json"


@lru_cache(maxsize=None)
def spec(name: str):
    return factory_spec(str(config(name)))


# the shrink rule ----------------------------------------------------------------------------------

#: By hand from each config.json (N heads, K key/value heads, h hidden, f feed-forward, P positions):
#: heads 8; key/value heads max(8·K // N, 1): Qwen 8·4//28 = 1, Gemma 8·8//16 = 4, GPT-OSS 8·8//64 = 1,
#: Phi-3 and OLMo (K = N) 8; head_dim (where given) 16, doubled as N·d > h: Gemma 16·256 = 4096 >
#: 3584, GPT-OSS 64·64 = 4096 > 2880; feed-forward 8·round(128·f/h / 8): Qwen 128·18944/3584 = 676.6
#: -> 680, Gemma 128·4 = 512, Phi-3 128·8192/3072 = 341.3 -> 344, OLMo 128·11008/4096 = 344, GPT-OSS
#: 128·2880/2880 = 128; windows: 16/2 = 8 where shorter than P (Gemma 4096 < 8192, Phi-3 2047 < 4096,
#: GPT-OSS 128 < 131072), else 2·16 = 32 (Qwen 131072 = P); GPT-OSS 8 experts of 32, 4 per token (4 <=
#: 8/2); token ids modulo 256 (OLMo 100257 -> 161, 100277 -> 181; Qwen 151643 -> 91).
SHRUNK = {
    "Qwen2.5-7B": dict(num_attention_heads=8, num_key_value_heads=1, intermediate_size=680, sliding_window=32,
                       eos_token_id=91),
    "gemma-2-9b": dict(num_attention_heads=8, num_key_value_heads=4, head_dim=32, intermediate_size=512,
                       sliding_window=8, sliding_window_size=8),
    "Phi-3-mini-4k-instruct": dict(num_attention_heads=8, num_key_value_heads=8, intermediate_size=344,
                                   sliding_window=8, original_max_position_embeddings=32),
    "OLMo-2-1124-7B": dict(num_attention_heads=8, num_key_value_heads=8, intermediate_size=344, eos_token_id=161,
                           pad_token_id=181),
    "gpt-oss-20b": dict(num_attention_heads=8, num_key_value_heads=1, head_dim=32, intermediate_size=128,
                        sliding_window=8, num_local_experts=8, num_experts_per_tok=4,
                        layer_types=["sliding_attention", "full_attention"]),
}


@pytest.mark.parametrize("name", FAMILIES)
def test_the_shrink_rule_by_hand(name):
    data = hf.read_config(config(name))
    small = shrunk(data, SEQUENCE)
    assert {key: small[key] for key in SHRUNK[name]} == SHRUNK[name]
    assert (small["num_hidden_layers"], small["hidden_size"], small["vocab_size"], small["max_position_embeddings"],
            small["model_type"]) == (2, 128, 256, 2 * SEQUENCE, data["model_type"])
    for width in (2, 4, 8):  # every split size a multiple of the width (key/value heads: or a divisor)
        assert small["num_attention_heads"] % width == small["intermediate_size"] % width == 0
        assert small["vocab_size"] % width == 0
        assert small["num_key_value_heads"] % width == 0 or width % small["num_key_value_heads"] == 0


@pytest.mark.parametrize("name", ["gemma-2-9b", "gpt-oss-20b"])
def test_the_shrunk_model_has_the_full_models_first_blocks(name):
    """The same parameters (names, number of dimensions) and attention kinds per block as the full
    model cut to its first two blocks (Gemma-2 and GPT-OSS: sliding, then full attention)."""
    full = hf.build(config(name), 2)
    small = hf.build_shrunk(config(name), SEQUENCE)
    assert [(key, value.dim()) for key, value in small.named_parameters()] == [
        (key, value.dim()) for key, value in full.named_parameters()]
    assert small.config.layer_types == full.config.layer_types == ["sliding_attention", "full_attention"]
    assert small.config.sliding_window < SEQUENCE
    assert all(value.dtype == torch.float32 and value.device.type == "cpu" for value in small.parameters())


def test_a_size_the_rule_does_not_know_is_refused(tmp_path):
    """CTRL's feed-forward width is `dff` (8192 in transformers' default CTRLConfig), a key the rule
    does not know; key/value heads that do not divide the heads are refused too."""
    from transformers import CTRLConfig

    path = tmp_path / "ctrl" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**CTRLConfig().to_dict(), "model_type": "ctrl"}))
    with pytest.raises(InputError, match=r"^dff: a size of 8192 the verification's shrink rule does not know "):
        hf.build_shrunk(path, SEQUENCE)
    with pytest.raises(InputError, match=r"^num_key_value_heads: 3 does not divide num_attention_heads=28; "):
        shrunk({**hf.read_config(config("Qwen2.5-7B")), "num_key_value_heads": 3}, SEQUENCE)


# each family under its derived plan ----------------------------------------------------------------

@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_computes_the_model_at_two_ranks(name):
    result = verify_tensor_parallel(spec(name), 2)
    assert result.max_abs_error < TOLERANCE and result.passed, result


@pytest.mark.parametrize("name", ["Qwen2.5-7B", "gemma-2-9b"])
def test_two_families_compute_the_model_at_four_ranks(name):
    """Qwen's one key/value head held by all 4 ranks (Megatron's rule), Gemma's 4 one per rank."""
    result = verify_tensor_parallel(spec(name), 4)
    assert result.max_abs_error < TOLERANCE, result


# plans given explicitly -------------------------------------------------------------------------------

def qwen_plan() -> Plan:
    """transformers' own tensor-parallel plan of Qwen2 (`Qwen2Config.base_model_tp_plan`, Megatron's
    split), its paths under the loss wrapper, and the vocabulary split as Megatron's."""
    from transformers import Qwen2Config

    return Plan.of({"model.model.embed_tokens": ROWWISE, "model.lm_head": COLWISE,
                    **{f"model.model.{pattern}": style for pattern, style in Qwen2Config.base_model_tp_plan.items()}})


def drop_all_reduces(monkeypatch, module_path: str) -> list[int]:
    """Rank graphs without the all-reduce the plan pass puts at `module_path`: a row split whose sum
    is never taken. Returns the ranks it was dropped from."""
    dropped: list[int] = []

    def without(graph, plan, width, rank=0, values=None):
        built = apply_plan(graph, plan, width, rank, values)
        for node in list(built.graph.nodes):
            if node.target is all_reduce and node.meta.get("module_path") == module_path:
                node.replace_all_uses_with(node.args[0])
                built.graph.erase_node(node)
                dropped.append(rank)
        built.recompile()
        return built

    monkeypatch.setattr(verify_module, "apply_plan", without)
    return dropped


def test_a_plan_written_for_the_full_model_verifies_the_shrunk_one(monkeypatch):
    """transformers' Qwen2 plan (wildcards over the blocks) gives the derived plan's ranks: the same
    error to the last bit; without o_proj's all-reduce in block 0 each rank keeps its partial sum of
    the attention's output and the losses differ."""
    derived = verify_tensor_parallel(spec("Qwen2.5-7B"), 2)
    written = verify_tensor_parallel(spec("Qwen2.5-7B"), 2, plan=qwen_plan())
    assert written.max_abs_error == derived.max_abs_error < TOLERANCE
    dropped = drop_all_reduces(monkeypatch, "model.model.layers.0.self_attn.o_proj")
    wrong = verify_tensor_parallel(spec("Qwen2.5-7B"), 2, plan=qwen_plan())
    assert dropped == [0, 1]
    assert not wrong.passed and wrong.max_abs_error > 100 * TOLERANCE


def test_a_plan_that_does_not_compose_is_refused():
    """o_proj colwise takes the heads' split output where it needs it whole: the plan pass refuses it."""
    plan = Plan(styles=(("model.model.layers.*.self_attn.o_proj", COLWISE), *qwen_plan().styles))
    with pytest.raises(InputError, match=r"^plan: aten.linear.default at model.model.layers.0.self_attn.o_proj: a "
                                         r"colwise product of a S\(2\) input"):
        verify_tensor_parallel(spec("Qwen2.5-7B"), 2, plan=plan)


#: Megatron's split of the zoo's blocks written out (Shoeybi et al. 2019, Sec. 3): q, k, v and the
#: MLP's gate and up colwise, the attention's output and the MLP's down rowwise, the vocabulary split.
MEGATRON = Plan.of({"embedding.word": ROWWISE, "head": COLWISE, "layers.*.attention.query": COLWISE,
                    "layers.*.attention.key": COLWISE, "layers.*.attention.value": COLWISE,
                    "layers.*.attention.dense": ROWWISE, "layers.*.mlp.gate": COLWISE, "layers.*.mlp.up": COLWISE,
                    "layers.*.mlp.down": ROWWISE})


def test_a_zoo_model_under_a_plan_given_and_a_wrong_one(monkeypatch):
    """The written plan is the derived one at every planned path of the tiny llama3-8b, verifies with
    its error to the last bit, and fails with block 0's attention all-reduce dropped."""
    model_spec = get_spec("llama3-8b").with_overrides(**TINY, num_kv_heads=2)
    with torch.device("meta"):
        model = TransformerModel(model_spec, SEQUENCE, model_spec.padded_vocab_size(2), MICRO_BATCH_SIZE)
    derived = derived_plan(export(model, example_inputs(model, MICRO_BATCH_SIZE, SEQUENCE)), "layers")
    assert [MEGATRON.style(path) for path, _ in derived.styles] == [style for _, style in derived.styles]
    assert len(derived.styles) == 2 + 2 * 7
    given = verify_tensor_parallel("llama3-8b", 2, plan=MEGATRON)
    assert given.max_abs_error == verify_tensor_parallel("llama3-8b", 2).max_abs_error < TOLERANCE
    dropped = drop_all_reduces(monkeypatch, "layers.0.attention.dense")
    wrong = verify_tensor_parallel("llama3-8b", 2, plan=MEGATRON)
    assert dropped == [0, 1] and not wrong.passed


# the cache ----------------------------------------------------------------------------------------

def counted_runs(monkeypatch) -> list[int]:
    """The widths verifications run at from now on; each run's error is its number in that list (1,
    2, ...), so that a result read back from the cache shows whose it is."""
    runs: list[int] = []

    def run(model, inputs, plan, width, blocks):
        runs.append(width)
        return float(len(runs))

    monkeypatch.setattr(verify_module, "verify_plan", run)
    return runs


def test_a_verification_is_run_once_per_key(tmp_path, monkeypatch):
    """The second call of a key reads cache_dir/verified/ (no run: the first run's error); another
    width, plan or seed runs; a damaged file is set aside and run again."""
    runs = counted_runs(monkeypatch)
    first = verify_tensor_parallel("llama3-8b", 2, cache_dir=tmp_path)
    again = verify_tensor_parallel("llama3-8b", 2, cache_dir=tmp_path)
    assert runs == [2] and again == first and first.max_abs_error == 1.0
    files = list((tmp_path / "verified").iterdir())
    assert len(files) == 1 and json.loads(files[0].read_text())["max_abs_error"] == 1.0
    verify_tensor_parallel("llama3-8b", 4, cache_dir=tmp_path)
    verify_tensor_parallel("llama3-8b", 2, plan=MEGATRON, cache_dir=tmp_path)
    verify_tensor_parallel("llama3-8b", 2, seed=1, cache_dir=tmp_path)
    assert runs == [2, 4, 2, 2] and len(list((tmp_path / "verified").glob("*.json"))) == 4
    files[0].write_text("{not json")
    assert verify_tensor_parallel("llama3-8b", 2, cache_dir=tmp_path).max_abs_error == 5.0
    assert runs == [2, 4, 2, 2, 2] and (files[0].parent / f"{files[0].name}.corrupt").exists()
    assert verify_tensor_parallel("llama3-8b", 2, cache_dir=tmp_path).max_abs_error == 5.0


def test_a_config_json_is_keyed_by_its_bytes(tmp_path, monkeypatch):
    """The same config.json at another path reads the first one's result; a changed file runs."""
    runs = counted_runs(monkeypatch)
    copies = [tmp_path / folder / "config.json" for folder in ("a", "b", "c")]
    for copy in copies:
        copy.parent.mkdir()
        shutil.copy(config("OLMo-2-1124-7B"), copy)
    copies[2].write_text(json.dumps({**json.loads(copies[2].read_text()), "rms_norm_eps": 1e-5}))
    cache = tmp_path / "cache"
    results = [verify_tensor_parallel(factory_spec(str(copy)), 2, cache_dir=cache).max_abs_error for copy in copies]
    assert runs == [2, 2] and results == [1.0, 1.0, 2.0]
