"""The engine's rooms (issue 20, item 2): sub-packages by concern, layered, short functions, and
the helpers that replaced repeated code (docs/architecture.md, section 1)."""

import ast
import functools
import inspect
from pathlib import Path

import numpy as np
import pytest
from sklearn.base import clone

import fedlatent

SRC = Path(fedlatent.__file__).parent
ENGINE = SRC / "engine"

#: the rooms, highest first: a room imports only rooms after it (pyproject's layers contract)
ROOMS = ["estimation", "rounds", "transport", "node", "contract", "secagg", "site", "fedem",
         "protocol", "privacy"]
LEAVES = {"errors", "faults", "stats", "warn"}


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _imports(path: Path, package: str) -> set[str]:
    """Absolute names of the fedlatent modules ``path`` imports (lazy ones included)."""
    out = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out |= {mod} | {f"{mod}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m.startswith("fedlatent.")}


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["fedlatent", "engine"] else None


def _function_lengths(root: Path):
    for p in root.rglob("*.py"):
        for n in ast.walk(_tree(p)):
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
                yield n.end_lineno - n.lineno + 1, f"{p.relative_to(SRC)}:{n.lineno} {n.name}"


def test_the_engine_top_level_holds_the_rooms_and_four_leaf_modules():
    modules = {p.stem for p in ENGINE.glob("*.py")} - {"__init__"}
    rooms = {p.name for p in ENGINE.iterdir() if (p / "__init__.py").is_file()}
    assert modules == LEAVES
    assert rooms == set(ROOMS)


def test_each_room_imports_only_the_rooms_below_it():
    order = {r: i for i, r in enumerate(ROOMS)} | {leaf: len(ROOMS) for leaf in LEAVES}
    wrong, seen = [], set()
    for p in ENGINE.rglob("*.py"):
        parts = p.relative_to(SRC.parent).with_suffix("").parts
        here = ".".join(parts[:-1] if p.stem == "__init__" else parts)
        src = _room(here)
        seen.add(src)
        package = here if p.stem == "__init__" else here.rpartition(".")[0]
        for target in _imports(p, package):
            dst = _room(target)
            if src in order and dst in order and src != dst and order[dst] <= order[src]:
                wrong.append(f"{here} -> {target}")
    assert seen - {None} == set(order)
    assert wrong == []


def test_the_estimator_module_is_under_700_lines():
    from fedlatent.engine import FederatedEstimator

    lines = Path(inspect.getsourcefile(FederatedEstimator)).read_text().count("\n")
    assert lines < 700


def test_no_engine_function_over_60_lines():
    assert [s for n, s in _function_lengths(ENGINE) if n > 60] == []


def test_the_seeded_generators_are_one_function_wherever_imported():
    from fedlatent.engine.contract import model
    from fedlatent.engine.fedem import seeds

    assert model.server_rng is seeds.server_rng and model.client_rng is seeds.client_rng
    assert seeds.server_rng(3, 2).random() == np.random.default_rng(
        np.random.SeedSequence(entropy=3, spawn_key=(2**32 + 7, 2, 0))).random()


def test_store_params_stores_the_arguments_of_the_init_that_calls_it():
    from fedlatent.engine.contract.params import store_params

    class Base:
        def __init__(self, a=1, *, b=None):
            store_params(self, locals())

    class Child(Base):
        def __init__(self, c=3):
            super().__init__(a=c + 1)
            self.c = c

    child = Child()
    assert vars(child) == {"a": 4, "b": None, "c": 3}


def test_a_baseline_built_on_fedgmm_keeps_fedgmm_parameters_and_clones():
    from fedlatent.baselines import FedAvg

    est = FedAvg(l2=0.5)
    assert (est.n_input_components, est.n_learners, est.l2) == (1, 1, 0.5)
    assert clone(est).get_params() == est.get_params()


def test_gaussian_start_reads_the_parameters_of_its_names_with_defaults_for_the_others():
    from fedlatent.models.fedgmm import FedGMM
    from fedlatent.models.gmm.init import GaussianStart

    est = FedGMM(2, covariance_type="diag", reg_covar=1e-3, init_params="random")
    assert GaussianStart.of(est) == GaussianStart(covariance_type="diag", reg_covar=1e-3,
                                                  init_params="random")


def test_the_shared_data_checks_name_the_parameter():
    from fedlatent.engine.estimation.checks import check_enough_rows, check_weights_init

    class Rows:
        n_samples = 3

    with pytest.raises(ValueError, match=r"^the federation has 3 rows in all, fewer than "
                                         r"n_components=5$"):
        check_enough_rows(Rows(), 5, "n_components", unit="rows")
    check_enough_rows(Rows(), 3, "n_components")
    with pytest.raises(ValueError, match=r"weights_init must be 2 non-negative numbers summing "
                                         r"to 1, got array\(\[0\.7, 0\.7\]\)"):
        check_weights_init([0.7, 0.7], 2)
    check_weights_init(None, 2)
