# Two commands on a fresh machine: `make demo` plans a bundled example, `make test` runs the tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
OUT := out
# pip's own notices (running as root, a newer pip) are not graphopt's lines: `make demo` prints
# graphopt's only
PIP := PIP_ROOT_USER_ACTION=ignore $(PY) -m pip --disable-pip-version-check

.PHONY: setup demo test test-quick readme-check lint bench gpu clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -qq --upgrade pip
	$(PIP) install -qq -c constraints.txt -e ".[dev]"
	touch $@

demo: setup
	$(VENV)/bin/graphopt plan examples/resnet_like.py:build --target h100 \
		--json $(OUT)/plan.json --md $(OUT)/plan.md --html $(OUT)/plan.html

test: setup
	$(PY) -m pytest -q

# everything but the real-architecture zoo (tests/test_architectures.py, a few minutes)
test-quick: setup
	$(PY) -m pytest -q -m "not zoo"

# the README's quoted command outputs against what the commands print now (make test runs it too)
readme-check: setup
	$(PY) -m tests.readme_check

lint: setup
	$(VENV)/bin/ruff check graphopt tests benchmarks examples

bench: setup
	$(PY) benchmarks/bench_planning.py

# onnxruntime-gpu and onnxruntime cannot live in one environment: swap them.
gpu: setup
	$(PY) -m pip uninstall --yes onnxruntime
	$(PY) -m pip install -c constraints.txt "onnxruntime-gpu"

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
