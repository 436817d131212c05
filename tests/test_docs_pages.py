"""The documentation's configuration reference (scripts/docs_pages.py, built by mkdocs) holds every key
of phaze/conf/config.yaml and of the model group, with its default and its comment."""

import importlib.util
import sys
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf

REPOSITORY = Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location("docs_pages", REPOSITORY / "scripts" / "docs_pages.py")
docs_pages = sys.modules.setdefault("docs_pages", importlib.util.module_from_spec(_SPEC))
_SPEC.loader.exec_module(docs_pages)


def loaded_keys(node, prefix: str = "") -> set[str]:
    """The dotted keys holding a value (a scalar or a list) in what OmegaConf loads."""
    keys = set()
    for key, value in node.items_ex(resolve=False):
        name = f"{prefix}{key}"
        if isinstance(value, DictConfig) and len(value):
            keys |= loaded_keys(value, f"{name}.")
        else:
            keys.add(name)
    return keys


def test_every_key_of_config_yaml_is_documented():
    loaded = OmegaConf.load(docs_pages.CONFIG)
    _, found = docs_pages.entries(docs_pages.CONFIG.read_text())
    groups = {entry.key for entry in found if entry.group}
    assert docs_pages.leaf_keys(found) - groups == loaded_keys(loaded) - {"defaults"}
    stated = {next(iter(item)) for item in loaded.defaults if isinstance(item, DictConfig)}
    assert groups == {group for group in stated if not group.startswith("override ")}
    reference = docs_pages.configuration_reference()
    for entry in found:
        assert f"| `{entry.key}` |" in reference
    values = OmegaConf.to_container(loaded, resolve=False)
    for entry in found:
        if not entry.mapping and not entry.group:  # the default as written is the value loaded
            value = values
            for part in entry.key.split("."):
                value = value[part]
            assert yaml.safe_load(entry.default) == value, entry.key


def test_every_key_of_the_model_group_is_documented():
    loaded = OmegaConf.load(docs_pages.MODEL_GROUP)
    _, found = docs_pages.entries(docs_pages.MODEL_GROUP.read_text(), prefix="model.")
    assert docs_pages.leaf_keys(found) == {f"model.{key}" for key in loaded_keys(loaded)}
    reference = docs_pages.configuration_reference()
    for entry in found:
        assert f"| `{entry.key}` |" in reference


def test_defaults_as_written_and_comments_with_their_continuations():
    text = """# a file: its heading

defaults:
  - _self_
  - model: tiny   # the model
  - override hydra/job_logging: phaze
plain: 1          # one
                  # and its continuation
list: [a, b]      # a list
hashed: a#b       # the value holds a hash
# what the next key is
described: null
# a section
first: x          # the first key of the section
nested:
  inner: 2        # inside
                  # still inside
  deeper:
    leaf: 'q'     # deepest
modes:            # a block list
  - none          # the first
  - full
same_indent:
- a
after: 3
"""
    heading, found = docs_pages.entries(text)
    assert heading == "a file: its heading"
    table = {entry.key: (entry.default, entry.description, entry.section, entry.mapping, entry.group)
             for entry in found}
    assert table == {
        "model": ("tiny", "the model", "", False, True),
        "plain": ("1", "one and its continuation", "", False, False),
        "list": ("[a, b]", "a list", "", False, False),
        "hashed": ("a#b", "the value holds a hash", "", False, False),
        "described": ("null", "what the next key is", "", False, False),
        "first": ("x", "the first key of the section", "a section", False, False),
        "nested": ("", "", "", True, False),
        "nested.inner": ("2", "inside still inside", "", False, False),
        "nested.deeper": ("", "", "", True, False),
        "nested.deeper.leaf": ("'q'", "deepest", "", False, False),
        "modes": ("[none, full]", "a block list the first", "", False, False),
        "same_indent": ("[a]", "", "", False, False),
        "after": ("3", "", "", False, False),
    }
    assert docs_pages.leaf_keys(found) == {"model", "plain", "list", "hashed", "described", "first", "nested.inner",
                                           "nested.deeper.leaf", "modes", "same_indent", "after"}
    assert yaml.safe_load(text)["modes"] == ["none", "full"]
