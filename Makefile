# Every target bootstraps .venv on first use, so a machine with only python3 and make works.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
READY := $(VENV)/.ready
PY := $(abspath $(BIN))/python
COMPILED := build/compiled
# "yes" where the compiled core can be built: a C compiler and Python's headers.
CAN_COMPILE := $(shell $(PYTHON) -c "import os, shutil, sysconfig; \
	cc = (sysconfig.get_config_var('CC') or 'cc').split()[0]; \
	headers = os.path.join(sysconfig.get_paths()['include'], 'Python.h'); \
	print('yes' if shutil.which(cc) and os.path.exists(headers) else '')" 2>/dev/null)
NO_COMPILER := no C compiler or Python headers here, so the compiled core was not

.PHONY: test lint docs dist demo backtest-demo proto bench clean compiled

$(READY): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

## test: lint, then the whole suite (unit, integration, examples, semantics gates, the docs
## build, the wheel, benchmark smoke runs), one test file per worker process, a worker per CPU
## (TEST_WORKERS=0 runs it in this process); then, where a C compiler is present, the tests
## that drive the runtime core again against its compiled build
TEST_WORKERS ?= logical
GATES := tests/semantics/test_
COMPILED_TESTS := tests/core tests/model tests/replay tests/adapters tests/io tests/loop \
	tests/portable $(GATES)retry_gate.py $(GATES)crash_gate.py $(GATES)clock_gate.py \
	$(GATES)bad_input_gate.py $(GATES)state_cache.py $(GATES)budget_gate.py
test: lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile
ifeq ($(CAN_COMPILE),)
	@echo "test: $(NO_COMPILER) built or tested"
else
	$(MAKE) compiled
	cd $(COMPILED) && BEAM_AGENTS_COMPILED=1 $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile \
		-p no:cacheprovider $(COMPILED_TESTS)
endif

## compiled: a copy of the working tree in build/compiled whose runtime core is compiled by
## mypyc (setup.py with BEAM_AGENTS_COMPILE=1); needs a C compiler
compiled: $(READY)
	rm -rf $(COMPILED)
	mkdir -p $(COMPILED)
	git ls-files -z --cached --others --exclude-standard \
		| tar --null --files-from=- --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C $(COMPILED)
	cd $(COMPILED) && BEAM_AGENTS_COMPILE=1 $(PY) setup.py --quiet build_ext --inplace >build.log 2>&1 \
		|| (tail -40 build.log; exit 1)

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

## bench: the performance suite (under 15 minutes), the activations in the compiled core too
## where a C compiler is present; writes BENCHMARKS.md
bench: $(READY)
ifeq ($(CAN_COMPILE),)
	@echo "bench: $(NO_COMPILER) measured"
	$(BIN)/python -m benchmarks
else
	$(MAKE) compiled
	$(BIN)/python -m benchmarks --compiled $(COMPILED)
endif

## demo: the end-to-end demo (KEEP=1 leaves the effector and its web console up until Ctrl-C)
demo: $(READY)
	KEEP=$(KEEP) $(BIN)/python examples/demo.py

## backtest-demo: record the fraud triage, replay it, backtest a changed approval threshold
backtest-demo: $(READY)
	$(BIN)/python examples/backtest_demo.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site dist build
