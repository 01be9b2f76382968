# Every target bootstraps .venv on first use, so a machine with only python3 and make works.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
READY := $(VENV)/.ready

.PHONY: test lint docs dist demo backtest-demo proto bench clean

$(READY): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

## test: lint, then the whole suite (unit, integration, examples, semantics gates, the docs
## build, the wheel, benchmark smoke runs), one test file per worker process, a worker per CPU
## (TEST_WORKERS=0 runs it in this process)
TEST_WORKERS ?= logical
test: lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

## docs: the documentation site, built strictly into site/
docs: $(READY)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

## dist: the wheel and the sdist, into dist/
dist: $(READY)
	$(BIN)/python -m build --no-isolation --outdir dist

## proto: regenerate beam_agents/_protos from protos/
proto: $(READY)
	$(BIN)/python protos/generate.py

## lint: ruff over everything, mypy over the packages, the benchmarks and the examples
lint: $(READY)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy beam_agents effector benchmarks examples

## bench: the performance suite (under 10 minutes); writes BENCHMARKS.md
bench: $(READY)
	$(BIN)/python -m benchmarks

## demo: the end-to-end demo (KEEP=1 leaves the effector and its web console up until Ctrl-C)
demo: $(READY)
	KEEP=$(KEEP) $(BIN)/python examples/demo.py

## backtest-demo: record the fraud triage, replay it, backtest a changed approval threshold
backtest-demo: $(READY)
	$(BIN)/python examples/backtest_demo.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site dist build
