# fedlatent: everything runs in a local .venv created on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test-extras

.PHONY: demo test test-deployment lint docs bench clean venv

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

# Extras some tests need: the CPU build of torch 2.13.0 (pinned: an unpinned torch pulls
# gigabytes of CUDA packages), Flower 1.41 with Ray for the simulation and deployment tests
# (marked `flower`; skip them locally with `pytest -m "not flower"`) and MkDocs for `make docs`.
$(TEST_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e ".[dev,torch,flower-sim,privacy,docs]"
	touch $(TEST_STAMP)

venv: $(STAMP)

demo: $(STAMP)
	MPLBACKEND=Agg $(BIN)/fedlatent demo --out demo-output

# Lint, import contracts and declared imports first, then the documentation site (strict: a
# broken link or anchor fails), then pytest (tests/test_docs_code_blocks.py runs every example).
# The sources are byte-compiled first: with PYTHONDONTWRITEBYTECODE set (as on CI) every process
# the tests start (each Flower client message, Ray actor and CLI run) compiled them again.
# The tests marked `deployment` (real Flower deployments on loopback: a SuperLink, SuperNodes and
# a client process per message, about 15 minutes of a test worker on two busy cores) are left to
# `make test-deployment`; CI (.ci/run) runs both.
test: lint docs
	$(BIN)/python -m compileall -q src
	MPLBACKEND=Agg $(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=25 -m "not deployment"

# The real Flower deployments (tests marked `deployment`: tests/flower/test_deploy.py and the
# Flower page of tests/test_docs_code_blocks.py), one module after the other: the page's Ray
# start gives up after 30 s (a constant of Ray's) when it meets the deployments' dozen processes
# starting at once on two cores.
test-deployment: $(TEST_STAMP)
	$(BIN)/python -m compileall -q src
	MPLBACKEND=Agg $(BIN)/python -m pytest -q --durations=10 -m deployment

# Every third-party module src/ imports must be declared in pyproject.toml (core or an extra):
# checked by the shared tool beside the clone, against the venv with every extra installed.
DECLARED_IMPORTS ?= ../shared/tools/check_declared_imports.py

lint: $(TEST_STAMP)
	$(BIN)/ruff check src tests benchmarks .ci
	$(BIN)/lint-imports
	@test -f $(DECLARED_IMPORTS) || { echo "error: $(DECLARED_IMPORTS) not found: the \
	shared tools belong beside this clone (../shared), or give make DECLARED_IMPORTS=PATH" >&2; \
	exit 1; }
	$(BIN)/python $(DECLARED_IMPORTS) src

# The documentation site (docs/, mkdocs.yml) into site/; --strict turns every warning into an error.
docs: $(TEST_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -q -d site

# The benchmarks, each in its own process, at quick sizes (about ten minutes on two cores;
# BENCH_ARGS=--full: issue 23's sizes, an hour or more); their tables rewrite
# docs/benchmarks/performance.md (the benchmarks page), dated, with the machine and versions.
BENCH_ARGS ?=
bench: $(TEST_STAMP)
	$(BIN)/python benchmarks/report.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .ci-plain-venv demo-output site .pytest_cache
