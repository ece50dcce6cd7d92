"""Model exchange that cannot run code (issue 11, item 1).

A SEC model crosses as a skops file. The files here are hand-edited skops files whose schema asks
the loader to call ``exec``, ``eval``, ``os.system``, ``subprocess.Popen`` or
``importlib.import_module`` (each writes a marker file). Under the old allow-list (every type
whose name starts with ``builtins.``, ``numpy.``...) each of them runs; now every path that loads
a model refuses them before anything is built: a learner's exchange and select queries, the
server receiving a learner's model, ``SEC.load``, ``predict``, ``assign`` and the CLI.
"""

from __future__ import annotations

import io
import json
import sys
import time
import uuid
import zipfile

import numpy as np
import pandas as pd
import pytest
import skops.io as sio
from cases import assert_one_error_line
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.linear_model import LinearRegression, Ridge
from sklearn.neighbors import KNeighborsRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from typer.testing import CliRunner

import fedlatent as fl
from fedlatent.cli import app
from fedlatent.data.dataset import ClientData, FederatedDataset
from fedlatent.models.sec import (
    BUILTIN_CANDIDATES,
    CANDIDATE_SETS,
    SEC,
    TRUSTED_TYPES,
    SECModel,
    UntrustedModelError,
    check_extra_types,
    check_model,
    dumps_model,
    loads_model,
    make_candidates,
)

runner = CliRunner()
ATTACKS = ["exec", "eval", "os.system", "subprocess.Popen", "importlib.import_module"]


# ---- hand-written skops nodes ------------------------------------------------------------------
def _str(s):
    return {"__class__": "str", "__module__": "builtins", "__loader__": "JsonNode",
            "content": json.dumps(s), "is_json": True}


def _seq(kind, *items):
    loader = {"tuple": "TupleNode", "list": "ListNode"}[kind]
    return {"__class__": kind, "__module__": "builtins", "__loader__": loader,
            "content": list(items)}


def _call(module, name, *args):
    """A node whose loading calls ``module.name(*args)``."""
    return {"__class__": name, "__module__": module, "__loader__": "ConstructorFromReduceNode",
            "content": _seq("tuple", *args)}


def _via_builtins(module, func, arg):
    """``list(map(getattr(__import__(module), func), [arg]))``: builtins only."""
    fn = _call("builtins", "getattr", _call("builtins", "__import__", _str(module)), _str(func))
    return _call("builtins", "list", _call("builtins", "map", fn, _seq("list", arg)))


def _payload(attack, marker, module_name):
    write = f"open({str(marker)!r}, 'w').write('ran')"
    if attack == "exec":
        return _call("builtins", "exec", _str(write))
    if attack == "eval":
        return _call("builtins", "eval", _str(write))
    if attack == "os.system":
        return _via_builtins("os", "system", _str(f"touch '{marker}'"))
    if attack == "subprocess.Popen":
        return _via_builtins("subprocess", "Popen", _seq("list", _str("touch"), _str(str(marker))))
    return _via_builtins("importlib", "import_module", _str(module_name))


def _inject(blob, node):
    """A real LinearRegression file with one more attribute, ``node``."""
    with zipfile.ZipFile(io.BytesIO(bytes(blob))) as z:
        files = {n: z.read(n) for n in z.namelist()}
    schema = json.loads(files["schema.json"])
    attrs = schema["content"]
    attrs["content"]["evil"] = node
    attrs["key_types"]["content"].append(
        {"__class__": "str", "__module__": "builtins", "__loader__": "TypeNode"})
    files["schema.json"] = json.dumps(schema).encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for n, b in files.items():
            z.writestr(n, b)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8).copy()


def _old_loads(data):
    """The loader as it was: every type under these prefixes trusted."""
    untrusted = sio.get_untrusted_types(data=bytes(data))
    prefixes = ("sklearn.", "numpy.", "scipy.", "builtins.", "collections.")
    assert all(t.startswith(prefixes) for t in untrusted), untrusted
    return sio.loads(bytes(data), trusted=untrusted)


def _xy(n=30, p=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    return X, X @ np.arange(1.0, p + 1) + 0.1 * rng.standard_normal(n)


@pytest.fixture
def attack(request, tmp_path, monkeypatch):
    """``(blob, marker, ran)``: a model file that runs ``request.param`` when loaded the old way."""
    name = f"fedlatent_evil_{uuid.uuid4().hex}"
    marker = tmp_path / "marker"
    (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    X, y = _xy()
    blob = _inject(dumps_model(LinearRegression().fit(X, y)), _payload(request.param, marker, name))

    def ran(wait=0.3 if request.param == "subprocess.Popen" else 0.0):  # Popen: another process
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not marker.exists():
            time.sleep(0.02)
        return marker.exists()

    yield blob, marker, ran
    sys.modules.pop(name, None)


def _refused(fn, ran, *fragments):
    with pytest.raises(UntrustedModelError) as info:
        fn()
    msg = str(info.value)
    assert "outside the allow-list" in msg and "nothing was loaded" in msg, msg
    for f in fragments:
        assert f in msg, msg
    assert not ran(), "the model file ran code"
    return msg


@pytest.mark.parametrize("attack", ATTACKS, indirect=True)
def test_blob_runs_code_under_the_old_allow_list(attack):
    # the control: each crafted file really executes its payload with the old prefix list
    blob, _, ran = attack
    _old_loads(blob)
    assert ran(wait=5.0)


@pytest.mark.parametrize("attack", ATTACKS, indirect=True)
def test_loads_model_refuses_before_building(attack):
    blob, _, ran = attack
    _refused(lambda: loads_model(blob), ran, "'builtins.")
    _refused(lambda: check_model(blob, source="learner 'l03''s model"), ran, "learner 'l03'")


@pytest.mark.parametrize("attack", ATTACKS, indirect=True)
def test_learner_refuses_exchanged_and_candidate_models(attack):
    blob, _, ran = attack
    X, y = _xy()
    model, data = SECModel(), ClientData(X, y)
    rng = np.random.default_rng(0)
    _refused(lambda: model.client_query("exchange", {"model/0": blob, "offset": 4}, data, {},
                                        rng), ran, "model 4 of the exchange")
    payload = {"candidate_names": json.dumps(["rf"]), "candidate/0": blob}
    _refused(lambda: model.client_query("select", payload, data, {}, rng), ran,
             "candidate 'rf' sent by the server")


def _learners(n=4, seed=0):
    return FederatedDataset.from_arrays({f"l{i}": _xy(25, 3, seed + i) for i in range(n)})


@pytest.fixture(scope="module")
def fitted_sec():
    return SEC(candidates="linear", n_clusters=2, random_state=0).fit(_learners())


def _tampered(sec, blob, learner=1):
    """A copy of ``sec`` whose learner ``learner`` holds ``blob`` (as a tampered file would)."""
    import copy

    bad = copy.deepcopy(sec)
    models = list(bad.models_)
    models[learner] = np.asarray(blob, dtype=np.uint8)
    bad._model_sizes = np.array([m.size for m in models], dtype=np.int64)
    bad._model_bytes = np.concatenate(models)
    bad.models_ = models
    return bad


@pytest.mark.parametrize("attack", ATTACKS, indirect=True)
def test_server_refuses_a_learners_model_before_forwarding_it(attack, monkeypatch):
    blob, _, ran = attack
    orig = SECModel._select

    def lying(self, payload, data, state, rng):  # every learner lies; l0 is checked first
        reply, st = orig(self, payload, data, state, rng)
        return {**reply, "model": blob}, st

    monkeypatch.setattr(SECModel, "_select", lying)
    _refused(lambda: SEC(candidates="linear", n_clusters=2, random_state=0).fit(_learners()),
             ran, "learner 'l0''s model (sent in the select step)")


@pytest.mark.parametrize("attack", ATTACKS, indirect=True)
def test_tampered_saved_model_is_refused_on_load(attack, fitted_sec, tmp_path):
    blob, _, ran = attack
    _tampered(fitted_sec, blob).save(tmp_path / "m")
    _refused(lambda: SEC.load(tmp_path / "m"), ran, "learner 'l1''s model")


@pytest.mark.parametrize("attack", ATTACKS, indirect=True)
def test_predict_and_assign_refuse_a_tampered_model(attack, fitted_sec):
    blob, _, ran = attack
    bad = _tampered(fitted_sec, blob)
    X, _ = _xy(10)
    _refused(lambda: bad.predict(X, learner="l1"), ran, "learner 'l1''s model")
    _refused(lambda: bad.selected_models_, ran, "learner 'l1''s model")
    _refused(lambda: bad.assign(_learners(2, seed=10)), ran, "learner 'l1''s model")


@pytest.fixture(scope="module")
def cli_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("secfit")
    rows = []
    for c in range(4):
        X, y = _xy(25, 2, c)
        rows.append(pd.DataFrame({"x0": X[:, 0], "x1": X[:, 1], "y": y, "learner": f"l{c}"}))
    pd.concat(rows).to_csv(d / "data.csv", index=False)
    res = runner.invoke(app, ["fit", "sec", "--data", str(d / "data.csv"), "--client", "learner",
                              "--target", "y", "--candidates", "linear", "--clusters", "2",
                              "--out", str(d / "m")])
    assert res.exit_code == 0, res.output
    return d


@pytest.mark.parametrize("attack", ATTACKS, indirect=True)
def test_cli_predict_with_a_tampered_model_prints_one_line(attack, cli_model, tmp_path):
    import shutil

    blob, _, ran = attack
    shutil.copytree(cli_model / "m", tmp_path / "m")
    _tampered(SEC.load(cli_model / "m" / "model"), blob).save(tmp_path / "m" / "model")
    res = runner.invoke(app, ["predict", "--model", str(tmp_path / "m"), "--data",
                              str(cli_model / "data.csv"), "--out", str(tmp_path / "p.csv")])
    assert_one_error_line(res, "learner 'l1''s model", "outside the allow-list")
    assert not (tmp_path / "p.csv").exists()
    assert not ran()


@pytest.mark.parametrize("module, name", [("os", "system"), ("subprocess", "Popen"),
                                          ("importlib", "import_module"), ("builtins", "exec"),
                                          ("posix", "system"), ("numpy", "load")])
def test_direct_calls_are_refused(module, name, tmp_path):
    X, y = _xy()
    blob = _inject(dumps_model(LinearRegression().fit(X, y)),
                   _call(module, name, _str(str(tmp_path / "marker"))))
    with pytest.raises(UntrustedModelError, match=rf"'{module}\.{name}"):
        loads_model(blob)
    assert not (tmp_path / "marker").exists()


def test_allow_list_is_exact_names():
    # no wildcard, no function: every entry is one class (or a NumPy scalar type)
    import importlib

    for name in TRUSTED_TYPES:
        module, _, attr = name.rpartition(".")
        assert isinstance(getattr(importlib.import_module(module), attr), type), name
    assert not any(n.endswith(".") or "*" in n for n in TRUSTED_TYPES)
    assert not {"builtins.exec", "builtins.eval", "builtins.getattr", "builtins.__import__",
                "builtins.map", "builtins.object", "builtins.type"} & TRUSTED_TYPES


def test_protocol_and_loader_are_checked(tmp_path):
    X, y = _xy()
    good = dumps_model(LinearRegression().fit(X, y))
    # an allowed name loaded by a node kind that hands out or calls a callable
    fn = {"__class__": "LinearRegression", "__module__": "sklearn.linear_model._base",
          "__loader__": "FunctionNode"}
    with pytest.raises(UntrustedModelError, match=r"loaded by 'FunctionNode'"):
        loads_model(_inject(good, fn))
    with zipfile.ZipFile(io.BytesIO(bytes(good))) as z:
        files = {n: z.read(n) for n in z.namelist()}
    schema = json.loads(files["schema.json"])
    schema["protocol"] = 0  # the old node kinds
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for n, b in {**files, "schema.json": json.dumps(schema).encode()}.items():
            z.writestr(n, b)
    with pytest.raises(UntrustedModelError, match="not a skops protocol 2 file"):
        loads_model(buf.getvalue())
    with pytest.raises(UntrustedModelError, match="not a valid skops file"):
        loads_model(b"PK\x03\x04 truncated")


def test_candidate_sets_are_made_of_the_builtin_candidates():
    assert {n for names in CANDIDATE_SETS.values() for n in names} == set(BUILTIN_CANDIDATES)


@pytest.mark.parametrize("name", sorted(BUILTIN_CANDIDATES))
def test_every_candidate_round_trips(name):
    # every candidate set is made of these: each one, fitted or not, loads and predicts the same
    import warnings

    X, y = _xy(40, 3)
    ((_, est),) = make_candidates(name)
    assert type(loads_model(dumps_model(est))) is type(est)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = est.fit(X, y)
    back = loads_model(dumps_model(fitted))
    np.testing.assert_array_equal(back.predict(X), fitted.predict(X))


def test_scaling_pipeline_round_trips():
    X, y = _xy()
    pipe = make_pipeline(StandardScaler(), Ridge()).fit(X, y)
    np.testing.assert_array_equal(loads_model(dumps_model(pipe)).predict(X), pipe.predict(X))


class MeanRegressor(RegressorMixin, BaseEstimator):
    """A user's own candidate: predicts the mean."""

    def fit(self, X, y):
        self.mean_ = float(np.mean(y))
        self.n_features_in_ = np.shape(X)[1]
        return self

    def predict(self, X):
        return np.full(np.shape(X)[0], self.mean_)


MINE = f"{MeanRegressor.__module__}.{MeanRegressor.__qualname__}"


def test_user_type_loads_only_after_the_user_extends_the_list(tmp_path):
    X, y = _xy()
    blob = dumps_model(MeanRegressor().fit(X, y))
    with pytest.raises(UntrustedModelError, match=rf"\['{MINE}'\].*extra_trusted_types"):
        loads_model(blob)
    assert loads_model(blob, extra_types=[MINE]).predict(X[:3]).tolist() == [np.mean(y)] * 3
    fd = _learners()
    with pytest.raises(UntrustedModelError,
                       match=rf"candidate 'MeanRegressor' contains types .*'{MINE}'"):
        SEC(candidates=[MeanRegressor(), "linear"], n_clusters=2, random_state=0).fit(fd)
    sec = SEC(candidates=[MeanRegressor(), "linear"], n_clusters=2, random_state=0,
              extra_trusted_types=[MINE]).fit(fd)
    assert set(sec.selected_) <= {"MeanRegressor", "linear"}
    sec.save(tmp_path / "m")
    back = SEC.load(tmp_path / "m")
    np.testing.assert_array_equal(back.predict(X, learner="l0"), sec.predict(X, learner="l0"))
    assert SECModel(extra_trusted_types=[MINE]).get_config()["extra_trusted_types"] == [MINE]


@pytest.mark.parametrize("name, why", [
    ("builtins.exec", "standard library"), ("os.system", "standard library"),
    ("subprocess.Popen", "standard library"), ("importlib.import_module", "standard library"),
    ("numpy.testing._private.utils.runstring", "not a scikit-learn estimator class"),
    ("sklearn.utils.validation.check_array", "not a scikit-learn estimator class"),
    ("numpy.ndarray", "not a scikit-learn estimator class"),
    ("no_such_package_xyz.Model", "cannot be imported"),
    ("exec", "not a dotted"), ("a.b; import os", "not a dotted"),
])
def test_the_list_cannot_be_extended_with_code(name, why):
    with pytest.raises(ValueError, match=why):
        check_extra_types([name])
    with pytest.raises(ValueError, match=why):  # a server's setup message is refused too
        SECModel(extra_trusted_types=[name])
    with pytest.raises(ValueError, match=why):
        SEC(candidates="linear", extra_trusted_types=[name]).fit(_learners())


@pytest.mark.parametrize("attack", ["exec"], indirect=True)
def test_a_tampered_extension_opens_nothing(attack, fitted_sec, tmp_path):
    blob, _, ran = attack
    with pytest.raises(UntrustedModelError, match="builtins.exec"):
        loads_model(blob, extra_types=["builtins.exec"])
    bad = _tampered(fitted_sec, blob)
    bad.extra_trusted_types = ["builtins.exec"]  # the saved settings edited too
    bad.save(tmp_path / "m")
    with pytest.raises(ValueError, match="'builtins.exec' is in the standard library"):
        SEC.load(tmp_path / "m")
    assert not ran()


def test_malformed_trees_and_neighbours_are_refused():
    X, y = _xy()
    rf = fl.models.sec.make_candidates("rf")[0][1].set_params(n_estimators=3).fit(X, y)
    tree = rf.estimators_[1].tree_
    st = tree.__getstate__()
    st["nodes"]["left_child"][0] = 0  # a cycle: the root is its own child
    tree.__setstate__(st)
    with pytest.raises(UntrustedModelError, match="malformed: a tree node points outside"):
        loads_model(dumps_model(rf))
    knn = KNeighborsRegressor(algorithm="kd_tree").fit(X, y)
    knn.n_samples_fit_ = 10**6  # sklearn's bound on n_neighbors comes from it
    with pytest.raises(UntrustedModelError, match="neighbours model's sample counts disagree"):
        loads_model(dumps_model(knn))
