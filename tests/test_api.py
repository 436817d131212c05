"""The Python API: `phaze.predict` and `phaze.search` take the command line's keys, check them the same
way, and give what `phaze predict` and `phaze run_solver` give."""

import json

import pytest

import phaze
import phaze.api
from phaze_common.checks import InputError
from tests.test_predict import TINY, TINY_ARGUMENTS
from tests.test_predict import phaze as phaze_command

#: the tiny GPT of test_predict on 16 A100 (t 2, p 2, d 4), as keywords
KEYS = dict(model="megatrongpt3", chip="a100_80gb", system="dgx_a100", num_devices=16, global_batch_size=16,
            micro_batch_size=2, sequence_length=128, recompute="selective", tensor_parallel_width=2,
            pipeline_parallel_width=2, data_parallel_width=4,
            **{"model.overrides": {"num_layers": 2, "hidden_size": 256, "num_heads": 8, "ffn_hidden_size": 1024,
                                   "vocab_size": 1024, "max_position_embeddings": 128}})


@pytest.fixture
def keys(tmp_path):
    return dict(KEYS, cache_dir=str(tmp_path / "cache"))


def test_predict_gives_what_the_command_gives(keys, tmp_path):
    prediction = phaze.predict(**keys)
    run = phaze_command("predict", *TINY_ARGUMENTS, "num_devices=16", "tensor_parallel_width=2",
                        "pipeline_parallel_width=2", "data_parallel_width=4", f"hydra.run.dir={tmp_path / 'run'}",
                        f"cache_dir={tmp_path / 'cache'}", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    record = json.loads((tmp_path / "run" / "prediction.json").read_text())
    assert prediction.time_per_batch_s == record["time_per_batch_s"]
    assert prediction.breakdown_s == record["breakdown_s"] and prediction.memory_bytes == record["memory_bytes"]
    assert (prediction.tokens_per_s, prediction.mfu, prediction.fits) == (record["tokens_per_s"], record["mfu"], True)
    assert sum(prediction.breakdown_s.values()) == pytest.approx(prediction.time_per_batch_s, rel=1e-12)
    assert prediction.layout.text() == "t=2 p=2 d=4 v=1" and prediction.reason is None
    assert prediction.group_tiers == record["group_tiers"]
    # Megatron's rank order on 2 DGX A100 of 8: t = 2 (ranks 0-1) and d = 4 at stride 2 (0, 2, 4, 6)
    # inside a node's NVLink, p = 2 at stride 8 across the nodes
    assert [prediction.group_tiers[name] for name in ("tensor", "data", "pipeline")] == [
        "nvlink3", "nvlink3", "infiniband_hdr"]


def test_a_model_spec_is_a_model(keys):
    by_name = phaze.predict(**keys)
    spec = TINY.with_overrides(vocab_size=1024)
    by_spec = phaze.predict(**{**{key: value for key, value in keys.items() if key != "model.overrides"},
                               "model": spec})
    assert by_spec.time_per_batch_s == by_name.time_per_batch_s and by_spec.memory_bytes == by_name.memory_bytes


def test_a_warm_prediction_reuses_what_the_process_holds(keys, monkeypatch):
    first = phaze.predict(**keys)

    def traced_again(*arguments, **options):
        raise AssertionError("extracted again instead of kept in the process")

    def priced_again(*arguments, **options):
        raise AssertionError("layer costs or step model made again for a layout of the same shard")

    with monkeypatch.context() as patched:
        patched.setattr(phaze.api, "extract", traced_again)
        assert phaze.predict(**keys) == first
        patched.setattr(phaze.api, "chip_costs", priced_again)
        patched.setattr(phaze.api.TrainingStepModel, "step", staticmethod(priced_again))
        another_layout = {**keys, "pipeline_parallel_width": 1, "data_parallel_width": 8}
        other = phaze.predict(**another_layout)  # the same shard (t=2): only its placement is priced
    assert other.layout.pipeline_parallel_width == 1 and other.time_per_batch_s != first.time_per_batch_s
    for kept in (phaze.api._STEP_GRAPHS, phaze.api._STEPS, phaze.api._FLOPS):
        kept.values.clear()
    phaze.api._graphs.cache_clear()
    assert phaze.predict(**another_layout) == other  # made afresh: the same prediction


def test_a_layout_that_does_not_fit_is_a_prediction(keys):
    prediction = phaze.predict(**{**keys, "hbm_size": 0.001})
    assert not prediction.fits and prediction.reason.startswith("memory: stage")
    assert prediction.memory_bytes["total"] > 0.001 * 2**30


@pytest.mark.parametrize("change, message", [
    ({"tensor_parallel_widht": 2}, "tensor_parallel_widht: unknown key; did you mean tensor_parallel_width?"),
    ({"data_parallel_width": 2}, "data_parallel_width: tensor x pipeline x data parallel = 2 x 2 x 2 = 8, must "
                                 "equal num_devices=16"),
    ({"model": "gpt5"}, "model: unknown 'gpt5'; allowed: bertbase"),
    ({"system": "dgx_a200"}, "system: unknown 'dgx_a200'; allowed: deepseek_h800, dgx_a100"),
    ({"chip": "tpuv4_like"}, "chip: predict prices a chip that exists; allowed: a100_80gb, b200, gb200, h100_sxm, "
                             "h200_sxm, h800_sxm, mi300x, tpuv4, tpuv5e, tpuv5p, tpuv6e or a chip file's path"),
    ({"hbm_size": 1000}, "hbm_size: must be a finite number in (0, 80] GiB (the HBM of a100_80gb), got 1000"),
    ({"schedule": {"backend": "magic"}}, "schedule.backend: unknown 'magic'; allowed: cpsat, milp, heuristic"),
])
def test_bad_keywords_are_the_command_lines_one_line(keys, change, message):
    with pytest.raises(InputError) as raised:
        phaze.predict(**{**keys, **change})
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_the_system_names_its_chip(keys):
    assert phaze.predict(**{key: value for key, value in keys.items() if key != "chip"}) == phaze.predict(**keys)


def test_search_gives_what_run_solver_gives_and_a_table(keys, tmp_path):
    search = {key: value for key, value in keys.items()
              if key not in ("tensor_parallel_width", "pipeline_parallel_width", "data_parallel_width", "recompute",
                             "micro_batch_size")}
    found = phaze.search(**search, micro_batch_size=[1, 2], n_jobs=1, directory=tmp_path / "api")
    run = phaze_command("run_solver", *TINY_ARGUMENTS[:-2], "micro_batch_size=[1,2]", "num_devices=16",
                        "n_jobs=1", f"cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}",
                        cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    best = json.loads((tmp_path / "run" / "best.json").read_text())
    assert found.throughput == best["throughput"] > 0 and found.best["placement"] == best["placement"]
    table = found.to_pandas()
    assert len(table) == 2 * 3  # two micro-batch sizes x three recomputation modes on the one chip
    assert table["throughput"].max() == best["throughput"]
    assert (tmp_path / "api" / "best.json").exists()


def test_the_api_caches_in_the_users_cache_folder_not_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert phaze.predict(**KEYS).fits
    assert list(work.iterdir()) == [] and (tmp_path / "xdg" / "phaze" / "graphs").is_dir()


def test_predict_prices_no_recomputation_unless_told(keys):
    """`recompute` null: predict prices `none` (Megatron-LM's and NeMo's default), as if given."""
    unset = {key: value for key, value in keys.items() if key != "recompute"}
    prediction = phaze.predict(**unset)
    assert prediction.placement.recompute == "none"
    assert prediction == phaze.predict(**unset, recompute="none")
    assert prediction.step.breakdown["recompute"] == 0.0


def test_predict_refuses_a_key_only_the_search_reads(keys):
    with pytest.raises(InputError) as raised:
        phaze.predict(**keys, search="exhaustive")
    assert str(raised.value) == ("search: phaze predict does not read it (it prices the one placement given; the "
                                 "search's keys are run_solver's); allowed: bounded (the default)")
    assert phaze.predict(**keys, search="bounded").fits  # the default is taken


def test_zero3_in_a_pipeline_is_noted_with_the_frameworks_that_run_it(keys):
    """Full sharding with p = 2 is priced, and prediction.json's record (and best.json's placement) says
    which frameworks compose them; with p = 1, or the optimizer state alone sharded, nothing is noted."""
    from phaze.modes.predict import prediction_record
    from phaze.search_run import noted
    from solver.training_step.options import PIPELINE_SHARDING_NOTES

    def notes(**changes):
        checked = phaze.api.settings("predict", **{**keys, **changes})
        return prediction_record(checked, phaze.api.run_prediction(checked), phaze.api.graphs(checked))["notes"]

    assert notes(data_parallel_sharding="full") == [PIPELINE_SHARDING_NOTES["full"]]
    assert "DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3" in PIPELINE_SHARDING_NOTES["full"]
    assert notes(data_parallel_sharding="full", pipeline_parallel_width=1, data_parallel_width=8) == []
    assert notes() == []
    placement = {"data_parallel_sharding": "full", "pipeline_parallel_width": 2}
    assert noted({"feasible": True, "placement": placement})["placement"]["notes"] == [PIPELINE_SHARDING_NOTES["full"]]
    unsplit = noted({"feasible": True, "placement": {**placement, "pipeline_parallel_width": 1}})
    assert "notes" not in unsplit["placement"]
