"""`tensor_parallel_plan`: plan files of several widths, the setting's checks, and prediction.json's
`plan` / `plan_verified` with Megatron's and with the searched plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import phaze.api
from phaze_common.checks import InputError
from graph_extract.plan import COLWISE, ROWWISE, Plan, plan_digest, plan_widths, read_plan, write_plan

DATA = Path(__file__).resolve().parent / "data"
MIXER = f"{DATA / 'mixer_llama.py'}:llama3_8b"

TWO = Plan(styles=(("layers.*.q", COLWISE), ("layers.*.o", ROWWISE)))
FOUR = Plan(styles=(("layers.*.q", COLWISE),))


# plan files ---------------------------------------------------------------------------------------

def test_a_file_of_plans_by_width_is_read_at_each_width(tmp_path):
    """Each width reads its own plan; one rank, which no plan splits, reads the first; a width the file
    lacks is refused naming the widths it has; the digest is the plan's, not the file's."""
    path = tmp_path / "plans.yaml"
    write_plan(path, {4: FOUR, 2: TWO})
    assert plan_widths(path) == (2, 4)
    assert read_plan(path, 2) == TWO and read_plan(path, 4) == FOUR and read_plan(path, 1) == TWO
    with pytest.raises(InputError, match=rf"^model.plan: {path}: no plan for tensor_parallel_width 8; allowed: 2, 4$"):
        read_plan(path, 8)
    alone = tmp_path / "two.yaml"
    alone.write_text("layers.*.q: ColwiseParallel\nlayers.*.o: RowwiseParallel\n")
    assert plan_widths(alone) is None and read_plan(alone, 8) == TWO
    assert plan_digest(alone, 8) == plan_digest(path, 2) != plan_digest(path, 4)


def test_a_width_mapped_to_nothing_is_refused(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("2: []\n")
    with pytest.raises(InputError, match=rf"^model.plan: {path}: width 2: must map module patterns"):
        read_plan(path, 2)


# the setting's checks ---------------------------------------------------------------------------

KEYS = dict(chip="h100_sxm", system="dgx_h100", num_devices=16, tensor_parallel_width=2, pipeline_parallel_width=1,
            data_parallel_width=8, global_batch_size=16, micro_batch_size=1, sequence_length=256)


def test_a_plan_that_is_neither_a_name_nor_a_file_is_refused_in_one_line(tmp_path):
    with pytest.raises(InputError, match=r"^tensor_parallel_plan: 'alpa' is not a file; allowed: megatron, searched, "
                                         r"or a YAML plan file"):
        phaze.api.settings("predict", "llama3-8b", tensor_parallel_plan="alpa", cache_dir=str(tmp_path), **KEYS)


def test_a_model_that_builds_its_own_shards_takes_megatron_only(tmp_path):
    """tests/data/hf_llama.py:llama3_8b_sharded takes tensor_parallel_width: Megatron's split is its code."""
    with pytest.raises(InputError, match=r"^tensor_parallel_plan: .* builds its own shards .*; allowed: megatron$"):
        phaze.api.settings("predict", f"{DATA / 'hf_llama.py'}:llama3_8b_sharded", tensor_parallel_plan="searched",
                           cache_dir=str(tmp_path), **KEYS)


# prediction.json ----------------------------------------------------------------------------------

#: A Llama in tests/data/mixer_llama.py's form (its attention and MLP one module), large enough that
#: splitting its products pays for their all-reduces: sizes as keywords.
SMALL_MIXER = dict(vocab_size=4096, num_hidden_layers=4, hidden_size=2048, num_attention_heads=16,
                   num_key_value_heads=8, intermediate_size=6144)


#: The lines of a factory file that load tests/data/mixer_llama.py as `mixer`.
MIXER_IMPORT = (f"import importlib.util\n\nimport torch\n\n"
                f"spec = importlib.util.spec_from_file_location('mixer_llama', {str(DATA / 'mixer_llama.py')!r})\n"
                f"mixer = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(mixer)\n\n\n")


def small_mixer(tmp_path: Path) -> str:
    """A factory file calling mixer_llama.llama3_8b at SMALL_MIXER's sizes (a module phaze loads by path)."""
    path = tmp_path / "small_mixer.py"
    arguments = ", ".join(f"{key}={value}" for key, value in SMALL_MIXER.items())
    path.write_text(f"{MIXER_IMPORT}"
                    f"def small(sequence_length: int = 1024):\n"
                    f"    return mixer.llama3_8b(sequence_length, {arguments})\n")
    return f"{path}:small"


def predicted(model: str, cache: Path, **keys) -> dict:
    from phaze.modes.predict import prediction_record

    checked = phaze.api.settings("predict", model, cache_dir=str(cache), **{**KEYS, **keys})
    return prediction_record(checked, phaze.api.run_prediction(checked), phaze.api.graphs(checked))


MEGATRON_BLOCK = {"q": COLWISE, "k": COLWISE, "v": COLWISE, "o": ROWWISE, "gate": COLWISE, "up": COLWISE,
                  "down": ROWWISE}


def test_the_searched_plan_splits_a_one_module_block_as_megatron_and_is_not_slower(tmp_path):
    """Megatron's plan found by structure sees one module (`mixer`) with all seven products and splits
    only the MLP's (gate, up colwise; down rowwise), keeping q, k, v and o whole on both ranks; the
    search splits the attention too. Both plans are verified; the searched one is cheaper by the ILP
    (plan_search: objective < megatron_objective) and priced no slower by the step model, its
    weights per rank fewer: the attention's four products, 2·h² + 2·h·(h·kv/heads) elements, halved."""
    model = small_mixer(tmp_path)
    megatron = predicted(model, tmp_path / "cache", sequence_length=1024)
    searched = predicted(model, tmp_path / "cache", sequence_length=1024, tensor_parallel_plan="searched")
    assert megatron["tensor_parallel_plan"] == "megatron" and searched["tensor_parallel_plan"] == "searched"
    assert megatron["plan_verified"] is True and searched["plan_verified"] is True
    block = {pattern.rpartition(".")[2]: style for pattern, style in searched["plan"].items()
             if pattern.startswith("model.stack.")}
    assert block == MEGATRON_BLOCK
    assert {pattern.rpartition(".")[2] for pattern in megatron["plan"] if pattern.startswith("model.stack.")} == {
        "gate", "up", "down"}
    search = searched["plan_search"]
    assert search["width"] == 2 and search["searched"] and search["objective"] < search["megatron_objective"]
    assert searched["time_per_batch_s"] <= megatron["time_per_batch_s"]
    # the attention whole on both ranks keeps at least what the split one keeps (its fused kernel's
    # replicated part counted from the kernel's tensors, not the unfused core's s × s ones)
    assert megatron["memory_bytes"]["activations"] >= searched["memory_bytes"]["activations"] > 0
    h, heads, kv, blocks = 2048, 16, 8, SMALL_MIXER["num_hidden_layers"]
    attention = 2 * h * h + 2 * h * (h * kv // heads)
    weights = lambda record: sum(stage["parameters"] for stage in record["stages"])  # noqa: E731
    assert weights(megatron) - weights(searched) == blocks * attention // 2


def test_a_zoo_model_searched_keeps_megatrons_plan_and_time(tmp_path):
    """The zoo's llama3-8b: the search ties Megatron's split (the ILP's objective equals Megatron's),
    so Megatron's plan is written and the prediction is the same to the bit."""
    megatron = predicted("llama3-8b", tmp_path / "cache")
    searched = predicted("llama3-8b", tmp_path / "cache", tensor_parallel_plan="searched")
    assert searched["plan"] == megatron["plan"] and searched["plan_verified"] is megatron["plan_verified"] is True
    search = searched["plan_search"]
    assert not search["searched"] and search["objective"] == pytest.approx(search["megatron_objective"], rel=1e-6)
    assert searched["time_per_batch_s"] == megatron["time_per_batch_s"]


def stacked_mixer(tmp_path: Path) -> str:
    """A factory file of mixer_llama's model at SMALL_MIXER's sizes (its keywords' defaults, which the
    verification shrinks) whose blocks return the mean of the Mixer's output and their input stacked
    (aten.stack, an operator the search's graph does not handle)."""
    path = tmp_path / "stacked_mixer.py"
    sizes = ", ".join(f"{key}: int = {value}" for key, value in SMALL_MIXER.items())
    path.write_text(f"{MIXER_IMPORT}"
                    f"class Stacked(mixer.Mixer):\n"
                    f"    def forward(self, x):\n"
                    f"        return torch.stack((super().forward(x), x)).mean(0)\n\n\n"
                    f"def stacked(sequence_length: int = 1024, {sizes}):\n"
                    f"    model = mixer.llama3_8b(sequence_length, vocab_size, num_hidden_layers, hidden_size, "
                    f"num_attention_heads, num_key_value_heads, intermediate_size)\n"
                    f"    for layer in model.model.stack:\n"
                    f"        layer.mixer.__class__ = Stacked\n"
                    f"    return model\n")
    return f"{path}:stacked"


def test_a_block_the_search_cannot_express_keeps_megatrons_plan(tmp_path):
    """A block stacking two tensors (`torch.stack`), an operator the search's graph does not handle:
    the width's record says so and Megatron's plan is priced."""
    model = stacked_mixer(tmp_path)
    megatron = predicted(model, tmp_path / "cache", sequence_length=1024)
    searched = predicted(model, tmp_path / "cache", sequence_length=1024, tensor_parallel_plan="searched")
    search = searched["plan_search"]
    assert search["status"] == "refused" and not search["searched"] and search["objective"] is None
    assert search["refused"].startswith("plan search: aten.stack.default at model.stack.0.mixer: this operator")
    assert searched["plan"] == megatron["plan"] and searched["time_per_batch_s"] == megatron["time_per_batch_s"]
