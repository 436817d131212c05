"""Input the command line used to take without a word or to answer with a traceback: a key a mode does
not read, an option that does not apply, a malformed override, a chip by path. Each is one line
`phaze: error: <field>: ...`, exit 2, nothing written; and what each mode prices when a key is left
at its default."""

import sys

import pytest
from hydra import compose, initialize_config_module

from phaze.cli import check_command_line, main
from phaze.settings import settings_from_config

#: A tiny GPT on 16 A100 (t 2, p 2, d 4), as test_predict's, for `phaze predict`.
PREDICT = ["model=megatrongpt3", "+model.overrides.num_layers=2", "+model.overrides.hidden_size=256",
           "+model.overrides.num_heads=8", "+model.overrides.ffn_hidden_size=1024", "+model.overrides.vocab_size=1024",
           "+model.overrides.max_position_embeddings=128", "sequence_length=128", "chip=a100_80gb", "system=dgx_a100",
           "global_batch_size=16", "micro_batch_size=2", "num_devices=16", "tensor_parallel_width=2",
           "pipeline_parallel_width=2", "data_parallel_width=4"]
#: The same mixture-free model for `phaze run_solver` on the template chip.
SEARCH = [*PREDICT[:8], "global_batch_size=16", "num_devices=16", "max_tensor_parallel_width=2"]


def refusal(mode, *arguments, capsys, monkeypatch, tmp_path) -> str:
    """What `phaze <mode> arguments` (in this process, in an empty tmp_path) says after `phaze: error: `:
    exit 2, one line on stderr, nothing on stdout, nothing written."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["phaze", mode, *arguments])
    with pytest.raises(SystemExit) as stopped:
        main()
    captured = capsys.readouterr()
    assert stopped.value.code == 2, captured.err
    assert captured.out == "" and list(tmp_path.iterdir()) == []
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("phaze: error: "), captured.err
    return lines[0].removeprefix("phaze: error: ")


def settings(mode, *overrides):
    with initialize_config_module("phaze.conf", version_base="1.3"):
        return settings_from_config(compose("config", overrides=[f"mode={mode}", *overrides]))


def test_recompute_null_is_every_mode_for_a_search_and_none_for_predict():
    assert settings("predict", *PREDICT).axes.recompute == ("none",)
    assert settings("run_solver", *SEARCH).axes.recompute == ("none", "selective", "full")
    assert settings("run_solver", "system=original").axes.recompute == ("none", "full")


@pytest.mark.parametrize("arguments, message", [
    (["=5"], "'=5': no key before '='; an override is key=value (e.g. tensor_parallel_width=8)"),
    (["="], "'=': no key before '='; an override is key=value (e.g. tensor_parallel_width=8)"),
    (["+=1"], "'+=1': no key before '='; an override is key=value (e.g. tensor_parallel_width=8)"),
    ([".=1"], ".: '.=1' has an empty name between dots; a key is names joined by single dots (e.g. "
              "model.overrides.num_layers=4)"),
    (["a..b=1"], "a..b: 'a..b=1' has an empty name between dots; a key is names joined by single dots (e.g. "
                 "model.overrides.num_layers=4)"),
    (["key="], "key: unknown key;"),
    (["hbm_size=[1,2"], "hbm_size: cannot read 'hbm_size=[1,2' (no viable alternative at input '[1,2')"),
    (["hbm_size=1]"], "hbm_size: cannot read 'hbm_size=1]' (extraneous input ']' expecting <EOF>)"),
], ids=["value-without-key", "equals-alone", "plus-without-key", "dot-alone", "double-dot", "empty-value",
        "open-bracket", "close-bracket"])
def test_a_malformed_override_is_one_line(arguments, message, capsys, monkeypatch, tmp_path):
    said = refusal("predict", "model=llama3-8b", *arguments, capsys=capsys, monkeypatch=monkeypatch, tmp_path=tmp_path)
    assert said.startswith(message), said


PREDICT_READS_NOT = "phaze predict does not read it (it prices the one placement given; the search's keys are run_solver's)"


@pytest.mark.parametrize("mode, arguments, message", [
    ("predict", ["search=exhaustive"], f"search: {PREDICT_READS_NOT}; allowed: bounded (the default)"),
    ("predict", ["candidate_sample=3"], f"candidate_sample: {PREDICT_READS_NOT}; allowed: null (the default)"),
    ("predict", ["executor=ray"], f"executor: {PREDICT_READS_NOT}; allowed: local (the default)"),
    ("predict", ["max_tensor_parallel_width=4"], f"max_tensor_parallel_width: {PREDICT_READS_NOT}; allowed: 8 (the "
                                                 "default)"),
    ("predict", ["max_context_parallel_width=2"], f"max_context_parallel_width: {PREDICT_READS_NOT}; allowed: null "
                                                  "(the default)"),
    ("predict", ["area_budget=1e9"], f"area_budget: {PREDICT_READS_NOT}; allowed: null (the default)"),
    ("predict", ["architecture_space=system"], f"architecture_space: {PREDICT_READS_NOT}; allowed: original (the "
                                               "default)"),
    ("predict", ["schedule.backend=heuristic"], "schedule.backend: phaze predict does not read it (a100_80gb is "
                                                "priced by its roofline: no layer is scheduled); allowed: cpsat (the "
                                                "default)"),
    ("run_solver", ["pipeline_parallel_width=2"], "pipeline_parallel_width: phaze run_solver does not read it (it "
                                                  "searches the pipeline and data-parallel widths; predict prices "
                                                  "given ones); allowed: null (the default)"),
    ("run_solver", ["chip=a100_80gb", "search=exhaustive"], "search: phaze run_solver does not read it (a100_80gb is "
                                                            "a chip that exists: no chip is searched, only the "
                                                            "placement); allowed: bounded (the default)"),
    ("extract_graph", ["num_devices=16"], "num_devices: phaze extract_graph does not read it (it traces the model's "
                                          "graphs only); allowed: 1024 (the default)"),
], ids=["search", "candidate-sample", "executor", "max-width", "max-context", "area", "space", "schedule-on-a-gpu",
        "pipeline-to-the-search", "search-on-a-known-chip", "devices-to-extract"])
def test_a_key_the_mode_does_not_read_is_refused(mode, arguments, message, capsys, monkeypatch, tmp_path):
    given = PREDICT if mode == "predict" else ["model=megatrongpt3"]
    assert refusal(mode, *given, *arguments, capsys=capsys, monkeypatch=monkeypatch, tmp_path=tmp_path) == message


def test_a_key_the_mode_does_not_read_is_taken_at_its_default(tmp_path, monkeypatch):
    """Its default, given or composed (the model's max_tensor_parallel_width, a system preset's keys:
    system=original's sgd, no sharding, no fused attention)."""
    monkeypatch.chdir(tmp_path)
    assert check_command_line("predict", [*PREDICT, "search=bounded", "max_tensor_parallel_width=8", "executor=local"])
    assert check_command_line("extract_graph", ["model=bertbase", "system=original"])


@pytest.mark.parametrize("arguments, message", [
    (["overlap_expert_dispatch=true"], "overlap_expert_dispatch: megatrongpt3 has no experts, so no tokens are "
                                       "dispatched; allowed: false"),
    (["expert_dispatch=deduplicated"], "expert_dispatch: megatrongpt3 has no experts, so no tokens are dispatched; "
                                       "allowed: all_to_all"),
    (["expert_dispatch_sms=16"], "expert_dispatch_sms: megatrongpt3 has no experts, so no tokens are dispatched; "
                                 "allowed: null"),
    (["reshard_after_forward=false"], "reshard_after_forward: false keeps the weights data_parallel_sharding=full "
                                      "gathers; data_parallel_sharding=optimizer gathers none; allowed here: true"),
    (["sharded_collectives=blocking_tensors", "data_parallel_sharding=gradients"],
     "sharded_collectives: blocking_tensors is how data_parallel_sharding=full issues its gathers and reduce-scatters; "
     "data_parallel_sharding=gradients issues none; allowed here: prefetched_layers"),
    (["data_parallel_shard_width=2", "data_parallel_sharding=none"],
     "data_parallel_shard_width: data_parallel_sharding=none shards nothing (hybrid sharding splits a sharded state "
     "within groups); allowed here: null"),
], ids=["overlap-dispatch", "deduplicated-dispatch", "dispatch-sms", "reshard", "blocking", "shard-width"])
def test_an_option_that_does_not_apply_is_refused(arguments, message, capsys, monkeypatch, tmp_path):
    assert refusal("predict", *PREDICT, "recompute=none", *arguments, capsys=capsys, monkeypatch=monkeypatch,
                   tmp_path=tmp_path) == message


def test_options_that_apply_somewhere_in_a_search_are_taken():
    """A list of shardings with full takes full's options; a shard width applies to any sharding but none."""
    searched = settings("run_solver", *SEARCH, "data_parallel_sharding=[optimizer,full]", "reshard_after_forward=false",
                        "data_parallel_shard_width=2")
    assert searched.axes.data_parallel_shardings == ("optimizer", "full")
    assert searched.question.training.reshard_after_forward is False


def test_expert_dispatch_sms_needs_the_overlap_it_holds_sms_for(capsys, monkeypatch, tmp_path):
    said = refusal("predict", "model=mixtral-8x7b", "system=dgx_h100", "num_devices=64", "tensor_parallel_width=8",
                   "pipeline_parallel_width=4", "data_parallel_width=2", "global_batch_size=64", "recompute=none",
                   "expert_dispatch_sms=24", capsys=capsys, monkeypatch=monkeypatch, tmp_path=tmp_path)
    assert said == ("expert_dispatch_sms: the SMs an overlapped dispatch holds; needs overlap_expert_dispatch=true; "
                    "allowed here: null")


@pytest.mark.parametrize("arguments, message", [
    (["tensor_parallel_width=8.0"], "tensor_parallel_width: must be a positive integer, got 8.0"),
    (["num_devices=320", "tensor_parallel_width=8", "pipeline_parallel_width=40", "data_parallel_width=1",
      "global_batch_size=8"],
     "pipeline_parallel_width: 40 stages divide neither the 32 blocks nor 32 + 2 (embedding and loss counted); "
     "allowed: 1, 2, 4, 8, 16, 17, 32, 34"),
    (["chip=no/such/b300.yaml"], "chip: no such chip file 'no/such/b300.yaml'; allowed: a100_80gb, b200, gb200,"),
], ids=["width-not-an-integer", "pipeline-of-more-stages-than-layers", "chip-file-missing"])
def test_a_refusal_says_what_is_wrong_and_what_is_allowed(arguments, message, capsys, monkeypatch, tmp_path):
    said = refusal("predict", "model=llama3-8b", "system=dgx_h100", "num_devices=8", "tensor_parallel_width=8",
                   "pipeline_parallel_width=1", "data_parallel_width=1", "global_batch_size=8", "recompute=none",
                   *arguments, capsys=capsys, monkeypatch=monkeypatch, tmp_path=tmp_path)
    assert said.startswith(message), said


def test_the_command_line_caches_where_the_api_does(user_cache):
    """cache_dir null: the per-user cache folder ($XDG_CACHE_HOME/phaze) for the command line and the
    API alike, so that neither redoes what the other cached; a cache_dir given still wins."""
    import phaze.api

    assert settings("extract_graph", "model=bertbase").cache_dir == user_cache
    assert phaze.api.settings("extract_graph", "bertbase").cache_dir == user_cache
    assert settings("extract_graph", "model=bertbase", "cache_dir=elsewhere").cache_dir.name == "elsewhere"
