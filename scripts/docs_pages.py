"""The documentation's generated parts, made when `mkdocs build` runs (mkdocs.yml names this file
under `hooks:`), so that they cannot drift from the code:

* the configuration reference, from the comments of `phaze/conf/config.yaml` (and of the model
  group's `phaze/conf/model/custom.yaml`): every key with its default and what it means;
* the validation tables, printed by `phaze validate --markdown` on the bundled calibration set.

A page asks for one by holding its marker line (`MARKERS`); the hook puts the Markdown in its place.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
CONFIG = REPOSITORY / "phaze" / "conf" / "config.yaml"
MODEL_GROUP = REPOSITORY / "phaze" / "conf" / "model" / "custom.yaml"
RUNS = REPOSITORY / "arch_configs" / "calibration" / "runs.json"

_KEY = re.compile(r"^(?P<indent> *)(?P<item>- +)?(?P<key>[A-Za-z_][\w/-]*|override [\w/]+) *:(?P<rest>.*)$")


@dataclass
class Entry:
    """A key of a YAML configuration file: its dotted name, its default as written (empty for a
    mapping), whether it holds other keys, and its comments (the lines above it and those after it)."""

    key: str
    default: str
    mapping: bool = False
    group: bool = False  # an entry of hydra's defaults list: a configuration group and its option
    comments: list[str] = field(default_factory=list)
    items: list[str] = field(default_factory=list)  # a block list's items, as written
    section: str = ""  # the comment line heading the keys from this one on, if any

    @property
    def description(self) -> str:
        return " ".join(self.comments)


def _split_comment(text: str) -> tuple[str, str | None]:
    """(value, comment) of what follows a key's colon: the comment starts at the first '#' after a
    blank (a '#' inside a value, as in `a#b`, is the value's)."""
    match = re.search(r"(^|\s)#", text)
    if not match:
        return text.strip(), None
    return text[:match.start()].strip(), text[match.end():].strip()


def entries(text: str, prefix: str = "") -> tuple[str, list[Entry]]:
    """(the file's heading comment, its keys in file order) of a YAML configuration file written as
    phaze's are: `key: value   # comment`, a comment's continuation on the lines after it (comment lines
    indented past the key), a comment block above a key without a comment of its own (it describes
    that key) or with one (it heads a section: the keys from there on), nested mappings by
    indentation, block lists (`- item` lines under a key: its value), and hydra's `defaults:` list,
    whose `- group: option` entries are keys (`_self_` and `override` entries are not)."""
    heading: list[str] = []
    found: list[Entry] = []
    parents: list[tuple[int, str, Entry]] = []  # the mappings holding the next key: (indent, key, entry)
    block: list[str] = []  # comment lines above the next key
    last: Entry | None = None  # the key whose comment a comment line may continue
    last_indent = 0
    in_defaults = False
    owner: Entry | None = None  # a key without a value, whose block list may follow
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            if not found and block:  # the file's heading: the comment block before a blank line
                heading, block = heading + block, []
            last = None
            continue
        if stripped.startswith("#"):
            comment = stripped[1:].strip()
            column = len(line) - len(line.lstrip())
            if last is not None and column > last_indent and not block:
                last.comments.append(comment)  # a continuation of the key's comment
            else:
                block.append(comment)
                last = None
            continue
        if stripped.startswith("- ") and not in_defaults:  # an item of a block list: its key's value
            if owner is None:
                raise ValueError(f"a list item without its key: {line!r}")
            value, comment = _split_comment(stripped[2:])
            if owner.mapping:  # the key holds a list, not other keys
                owner.mapping = False
                parents = [parent for parent in parents if parent[2] is not owner]
            owner.items.append(value)
            owner.default = "[" + ", ".join(owner.items) + "]"
            owner.comments += [comment] if comment else []
            block, last = [], owner
            continue
        if in_defaults and re.fullmatch(r"- +[\w/]+", stripped):  # `- _self_`: no key
            block, last = [], None
            continue
        match = _KEY.match(line)
        if not match:
            raise ValueError(f"configuration line not understood: {line!r}")
        indent = len(match["indent"]) + (len(match["item"]) if match["item"] else 0)
        value, comment = _split_comment(match["rest"])
        key = match["key"]
        if match["item"]:
            block = []
            if key == "_self_" or key.startswith("override "):
                last = None
                continue
            entry = Entry(prefix + key, value, group=True, comments=[comment] if comment else [])
        else:
            while parents and parents[-1][0] >= indent:
                parents.pop()
            dotted = ".".join([name for _, name, _ in parents] + [key])
            in_defaults = dotted == "defaults"
            if in_defaults:
                heading, block, last = heading + block, [], None
                continue
            entry = Entry(prefix + dotted, value, mapping=value == "")
            if comment is None:
                entry.comments = block
            else:
                entry.comments = [comment]
                entry.section = " ".join(block)
            block = []
            if entry.mapping:
                parents.append((indent, key, entry))
        owner = entry if entry.mapping else None
        found.append(entry)
        last, last_indent = entry, indent
    return " ".join(heading), found


def leaf_keys(found: list[Entry]) -> set[str]:
    """The dotted keys that hold a value, not other keys."""
    return {entry.key for entry in found if not entry.mapping}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{text}`" if text else "—"


def _table(rows: list[Entry], below: set[str] = frozenset()) -> list[str]:
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    for entry in rows:
        default = "(its keys below)" if entry.mapping else _code(_cell(entry.default))
        meaning = _cell(entry.description) or "—"
        if entry.key in below:
            meaning += f" The keys: [`{entry.key}`](#{entry.key.replace('.', '').lower()})."
        lines.append(f"| `{entry.key}` | {default} | {meaning} |")
    return lines


def configuration_reference(config: Path = CONFIG, model_group: Path = MODEL_GROUP) -> str:
    """The configuration reference: config.yaml's groups, its keys by section (a comment heading the
    keys after it starts one), each top-level mapping's keys, then the model group's keys."""
    heading, found = entries(config.read_text())
    groups = [entry for entry in found if entry.group]
    for entry in groups:
        entry.comments = entry.comments or [f"an option of the {entry.key} group"]
    mappings = {entry.key: [] for entry in found if entry.mapping and "." not in entry.key}
    sections: list[tuple[str, list[Entry]]] = [("Keys", [])]
    for entry in found:
        if entry.group:
            continue
        top = entry.key.split(".")[0]
        if top in mappings and entry.key != top:
            mappings[top].append(entry)
            continue
        if entry.section:
            sections.append((entry.section, []))
        sections[-1][1].append(entry)
    lines = [f"`phaze/conf/config.yaml` begins: *{heading}*", "", "## Configuration groups", "",
             "Each names a file of its group: `model=llama3-8b` reads `phaze/conf/model/llama3-8b.yaml`, "
             "`system=dgx_h100` the system file `phaze_hardware/systems/dgx_h100.yaml`; the model group's "
             "keys are [below](#the-model-group).", ""]
    lines += _table(groups)
    for title, rows in sections:
        if rows:
            lines += ["", f"## {title}", ""] + _table(rows, set(mappings))
    for top, rows in mappings.items():
        lines += ["", f"## `{top}`", ""] + _table(rows)
    model_heading, model_keys = entries(model_group.read_text(), prefix="model.")
    if not model_heading and model_keys and model_keys[0].comments:  # the file's comment sits on its first key
        model_heading, model_keys[0].comments = " ".join(model_keys[0].comments), []
    lines += ["", "## The model group", "", f"`phaze/conf/model/custom.yaml`: *{model_heading}* A zoo model's "
              "file (`phaze/conf/model/<name>.yaml`) has the same keys but `config`.", ""]
    lines += _table(model_keys)
    return "\n".join(lines) + "\n"


def validation_tables(runs: Path = RUNS) -> str:
    """What `phaze validate --markdown` prints for the calibration set."""
    done = subprocess.run([sys.executable, "-m", "phaze", "validate", "--markdown", str(runs)], cwd=REPOSITORY,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"phaze validate --markdown failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


#: The marker lines a page may hold, and what replaces each.
MARKERS = {"<!-- generated: configuration reference -->": configuration_reference,
           "<!-- generated: phaze validate --markdown -->": validation_tables}
_made: dict[str, str] = {}  # each generated part made once per process (`mkdocs serve` rebuilds)


def on_page_markdown(markdown: str, page, config, files) -> str:  # mkdocs' hook
    for marker, make in MARKERS.items():
        if marker in markdown:
            if marker not in _made:
                _made[marker] = make()
            markdown = markdown.replace(marker, _made[marker])
    return markdown
