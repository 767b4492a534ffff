# The two commands a newcomer runs (see README): `make run` and `make test`.
# Both create .venv on first use and install the pinned dependencies from pyproject.toml.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test test-fast lint bench-quick clean

$(BIN)/.installed: pyproject.toml
	bash scripts/bootstrap.sh "$(PY)" "$(VENV)"
	touch $@

run: $(BIN)/.installed
	$(BIN)/python -m splitflow demo

test: $(BIN)/.installed lint
	$(BIN)/python -m pytest

test-fast: $(BIN)/.installed
	$(BIN)/python -m pytest -m "not slow"

lint: $(BIN)/.installed
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy --strict

bench-quick: $(BIN)/.installed
	for b in bench/[!_]*.py; do $(BIN)/python $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
