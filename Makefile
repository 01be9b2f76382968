# Every target bootstraps .venv on first use, so a machine with only python3 and make works.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
READY := $(VENV)/.ready

.PHONY: test demo proto lint bench clean

$(READY): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

## test: the whole suite (unit, integration, examples, semantics gates, benchmark smoke runs)
test: $(READY)
	$(BIN)/python -m pytest

## proto: regenerate beam_agents/_protos from protos/
proto: $(READY)
	$(BIN)/python protos/generate.py

## lint: ruff over everything, mypy over the packages
lint: $(READY)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy beam_agents effector

## bench: the performance suite (under 10 minutes); writes BENCHMARKS.md
bench: $(READY)
	$(BIN)/python -m benchmarks

## demo: the end-to-end demo
demo: $(READY)
	$(BIN)/python examples/demo.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
