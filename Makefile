# Two commands on a fresh machine: `make run` (main job on the defaults) and `make test` (the suite,
# then the documentation site built with --strict; `make docs` builds the site alone, into site/).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Test processes (pytest-xdist): one per core of the 2-core CI machine; `make test TEST_WORKERS=0`
# runs the suite in this process. A test file runs whole in one process (--dist loadfile), so its
# module-scoped fixtures are built once.
TEST_WORKERS ?= 2
DOCS_BUILD = $(BIN)/mkdocs build --strict --quiet

.PHONY: install run test docs benchmarks

$(BIN)/phaze: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet torch==2.13.0 -e '.[test,docs]'
	touch $(BIN)/phaze

install: $(BIN)/phaze

run: install
	$(BIN)/phaze run_solver

test: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile
	$(DOCS_BUILD)

# The site's configuration reference and validation tables are made during the build
# (scripts/docs_pages.py): the validation page runs `phaze validate --markdown` (38 s on a cold cache).
docs: install
	$(DOCS_BUILD)

benchmarks: install
	for script in benchmarks/*.py; do $(BIN)/python $$script || exit 1; done
