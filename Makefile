# fedlatent: everything runs in a local .venv created on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean venv

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	MPLBACKEND=Agg $(BIN)/fedlatent demo --out demo-output

test: $(STAMP)
	MPLBACKEND=Agg $(BIN)/python -m pytest -q
	$(BIN)/ruff check src tests benchmarks

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_gmm.py

clean:
	rm -rf $(VENV) demo-output .pytest_cache
