"""Saved models: an atomic pair verified by hash, validated on load (issue 11, item 4).

A saved model of each of the five models whose arrays or settings were tampered with (NaN,
negative or unnormalized weights, non-positive-definite covariances, wrong shapes, labels out of
range, a truncated .npz, an edited hash) is refused on load, in Python and by the CLI in one
line, naming the file and the field; an interrupted save is refused, never read mixed.
"""

import hashlib
import io
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import fedlatent as fl
from fedlatent.cli import app
from fedlatent.engine.contract.registry import estimator_class, estimator_names, example


def gmm_fd():
    rng = np.random.default_rng(0)
    return fl.FederatedDataset.from_arrays(
        {f"c{c}": rng.normal(size=(40, 2)) + 3 * (c % 2) for c in range(4)})


def gmm(max_rounds):
    return fl.FederatedGaussianMixture(
        2, max_rounds=max_rounds, tol=0, random_state=3, verbose=False,
        federation=fl.Federation(participation=0.5, step_size=0.5, random_state=3))


def fit(est, fd, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(fd, **kw)


# ---- saved models --------------------------------
def _fits():
    """Every registered model's "saved" example case (fedlatent.models.<name>.example): a new
    registered model is covered without editing this file."""
    out = {}
    for name in estimator_names():
        case = example(name).case("saved")
        out[name] = (case.make(), case.data())
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory, saturation_rule_off_module):  # the examples' small "saved" cases
    """Each model fitted and saved once: ``{name: (prefix, data frame of its data)}``."""
    root = tmp_path_factory.mktemp("models")
    out = {}
    for name, (est, fd) in _fits().items():
        fit(est, fd)
        (root / name).mkdir()
        est.save(root / name / "model")
        out[name] = (root / name / "model", fd)
    return out


def _copy(saved, name, tmp_path):
    prefix, _ = saved[name]
    for ext in (".npz", ".json"):
        (tmp_path / f"model{ext}").write_bytes(Path(f"{prefix}{ext}").read_bytes())
    return tmp_path / "model"


def _first_float(prefix):
    """The first saved float array of the model at ``prefix`` (a field NaN must break)."""
    with np.load(f"{prefix}.npz", allow_pickle=False) as z:
        return next(k for k in z.files if z[k].dtype.kind == "f" and z[k].size)


def tamper(prefix, field, change):
    """Change array ``field`` of the saved model at ``prefix`` and record the new sha256 (an
    attacker who rewrites both files)."""
    npz, js = Path(f"{prefix}.npz"), Path(f"{prefix}.json")
    with np.load(npz, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays[field] = change(np.array(arrays[field]))
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    npz.write_bytes(buf.getvalue())
    meta = json.loads(js.read_text())
    meta["npz_sha256"] = hashlib.sha256(buf.getvalue()).hexdigest()
    js.write_text(json.dumps(meta))


def _set(index, value):
    def change(a):
        a[index] = value
        return a
    return change


def _neg_eye(a):
    a[0] = -np.eye(a.shape[-1])
    return a


CLASSES = {name: estimator_class(name) for name in estimator_names()}

#: (model, case): field, change, the error
TAMPER = {
    ("gmm", "nan weight"): ("weights_", _set(0, np.nan), "field 'weights_' has NaN or infinite"),
    ("gmm", "negative weight"): ("weights_", lambda a: a * [-1, 3],
                                 "field 'weights_' has negative weights"),
    ("gmm", "weights not summing to 1"): ("weights_", lambda a: a * 0.9,
                                          "field 'weights_' does not sum to 1"),
    ("gmm", "non-PD covariance"): ("covariances_", _neg_eye,
                                   "field 'covariances_' is not positive definite"),
    ("gmm", "bad precision factor"): ("precisions_cholesky_", lambda a: -a,
                                      "field 'precisions_cholesky_' has a non-positive diagonal"),
    ("gmm", "non-triangular precision factor"): (
        "precisions_cholesky_", lambda a: a + np.tril(np.ones_like(a), -1),
        "field 'precisions_cholesky_' is not upper triangular"),
    ("gmm", "string-typed means"): ("means_", lambda a: a.astype(str),  # issue 39
                                    r"field 'means_' has dtype <U\d+, not numbers"),
    ("gmm", "wrong shape"): ("means_", lambda a: a[:1],
                             r"field 'means_' has shape \(1, 2\), the saved settings need "
                             r"\(2, 2\)"),
    ("fedgmm", "nan weight"): ("weights_x_", _set(0, np.nan),
                               "field 'weights_x_' has NaN or infinite"),
    ("fedgmm", "negative weight"): ("weights_y_", lambda a: a * [-1, 3],
                                    "field 'weights_y_' has negative weights"),
    ("fedgmm", "non-PD covariance"): ("covariances_", _neg_eye,
                                      "field 'covariances_' is not positive definite"),
    ("fedgmm", "wrong shape"): ("coef_", lambda a: a[:1], "field 'coef_' has shape"),
    ("lcr", "nan weight"): ("weights_", _set(1, np.inf), "field 'weights_' has NaN or infinite"),
    ("lcr", "negative weight"): ("weights_", lambda a: a * [-1, 3],
                                 "field 'weights_' has negative weights"),
    ("lcr", "non-positive variance"): ("noise_variance_", _set(0, -1.0),
                                       "field 'noise_variance_' has values <= 0"),
    ("lcr", "text coefficients"): ("coef_", lambda a: a.astype(str),
                                   r"field 'coef_' has dtype <U\d+, not numbers"),
    ("lcr", "wrong shape"): ("coef_", lambda a: np.hstack([a, a]),
                             r"field 'coef_' has shape \(2, 2\), the saved settings need "
                             r"\(2, 1\)"),
    ("hlcr", "nan precision"): ("precisions_", _set((0, 0, 0), np.nan),
                                "field 'precisions_' has NaN or infinite"),
    ("hlcr", "negative count"): ("cluster_counts_", _set(0, -3.0),
                                 "field 'cluster_counts_' has values < 0"),
    ("hlcr", "non-PD precision"): ("precisions_", _neg_eye,
                                   "field 'precisions_' is not positive definite"),
    ("hlcr", "label out of range"): ("labels_", _set(0, 7), r"field 'labels_' has labels "
                                     r"outside \[-1, 1\]"),
    ("hlcr", "wrong shape"): ("c_", lambda a: a[:, :2], "field 'c_' has shape"),
    ("sec", "nan error"): ("errors_", _set(0, np.nan), "field 'errors_' has NaN or infinite"),
    ("sec", "label out of range"): ("labels_", _set(0, -1), r"field 'labels_' has labels "
                                    r"outside \[0, 5\]"),
    ("sec", "model sizes"): ("_model_sizes", _set(0, 0), "field '_model_sizes' has values <= 0"),
    ("sec", "model bytes"): ("_model_bytes", lambda a: a[:-1], r"field '_model_sizes' sums to "
                                 r"\d+, but '_model_bytes' holds \d+ bytes"),
    ("sec", "wrong shape"): ("labels_", lambda a: a[:-1], "field 'labels_' has shape"),
}


@pytest.mark.parametrize("model,case", list(TAMPER), ids=[f"{m}-{c}" for m, c in TAMPER])
def test_a_tampered_saved_model_is_refused_on_load(saved, tmp_path, model, case):
    field, change, match = TAMPER[model, case]
    prefix = _copy(saved, model, tmp_path)
    CLASSES[model].load(prefix)  # the copy loads
    tamper(prefix, field, change)
    with pytest.raises(ValueError, match=r"model\.npz( / model\.json)?: " + match):
        CLASSES[model].load(prefix)


def _edit(meta, path, value):
    *head, last = path
    for k in head:
        meta = meta[k]
    meta[last] = value


JSON_TAMPER = {
    "unknown covariance type": (("params", "covariance_type"), "bogus",
                                r"setting 'covariance_type' is 'bogus', not one of"),
    "other n_components": (("params", "n_components"), 3,
                           r"field 'weights_' has shape \(2,\), the saved settings need \(3,\)"),
    "fewer feature names": (("fitted", "feature_names_in_"), ["x0"],
                            r"field 'means_' has shape \(2, 2\), the saved settings need "
                            r"\(2, 1\)"),
    "unknown federation setting": (("params", "federation"), {"nope": 1},
                                   "Federation.* unexpected keyword argument 'nope'"),
    "malformed history": (("history",), [{"bogus": 1}],
                          "RoundRecord.* unexpected keyword argument 'bogus'"),
    "fitted field of the wrong type": (("fitted", "n_iter_"), "3",
                                       r"fitted field 'n_iter_' is '3', not a int"),
}


@pytest.mark.parametrize("case", list(JSON_TAMPER))
def test_a_tampered_settings_file_is_refused(saved, tmp_path, case):
    path, value, match = JSON_TAMPER[case]
    prefix = _copy(saved, "gmm", tmp_path)
    meta = json.loads(Path(f"{prefix}.json").read_text())
    _edit(meta, path, value)
    Path(f"{prefix}.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"model\.(npz|json)\b.*: " + match):
        fl.FederatedGaussianMixture.load(prefix)


@pytest.mark.parametrize("model", list(CLASSES))
def test_a_truncated_or_edited_saved_model_is_refused(saved, tmp_path, model):
    prefix = _copy(saved, model, tmp_path)
    npz, js = Path(f"{prefix}.npz"), Path(f"{prefix}.json")
    data = npz.read_bytes()
    npz.write_bytes(data[: len(data) - 100])
    with pytest.raises(ValueError, match=r"model\.npz does not match model\.json: its sha256 "
                                         r"is .*an interrupted save, or a file truncated or "
                                         r"edited since"):
        CLASSES[model].load(prefix)
    npz.write_bytes(data)
    meta = json.loads(js.read_text())
    meta["npz_sha256"] = "0" * 64
    js.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"model\.npz does not match model\.json"):
        CLASSES[model].load(prefix)
    del meta["npz_sha256"]
    js.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"records no sha256 of model\.npz"):
        CLASSES[model].load(prefix)


@pytest.mark.parametrize("model,field", [("sec", "cv_mse_"), ("hlcr", "history_train_mse_")])
def test_fields_that_may_hold_nan_or_inf_still_load(saved, tmp_path, model, field):
    """SEC's validation MSE is NaN past a learner's candidates and inf for a failed one;
    HLCR's training MSE is NaN for rounds before a resume: such files load."""
    est = CLASSES[model].load(saved[model][0])
    a = np.array(getattr(est, field), dtype=float)
    a.flat[0], a.flat[-1] = np.nan, np.inf
    setattr(est, field, a)
    est.save(tmp_path / "m")
    np.testing.assert_array_equal(getattr(CLASSES[model].load(tmp_path / "m"), field), a)


def test_an_unexpected_array_or_fitted_field_is_refused(saved, tmp_path):
    prefix = _copy(saved, "gmm", tmp_path)
    tamper(prefix, "weights_", lambda a: a)
    with np.load(f"{prefix}.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    buf = io.BytesIO()
    np.savez(buf, **arrays, predict=np.zeros(2))
    Path(f"{prefix}.npz").write_bytes(buf.getvalue())
    meta = json.loads(Path(f"{prefix}.json").read_text())
    meta["npz_sha256"] = hashlib.sha256(buf.getvalue()).hexdigest()
    Path(f"{prefix}.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"model\.npz: unexpected array\(s\) \['predict'\]"):
        fl.FederatedGaussianMixture.load(prefix)
    np.savez(buf := io.BytesIO(), **arrays)
    Path(f"{prefix}.npz").write_bytes(buf.getvalue())
    meta["npz_sha256"] = hashlib.sha256(buf.getvalue()).hexdigest()
    meta["fitted"]["_runtime"] = "x"
    Path(f"{prefix}.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"model\.json: unknown fitted field '_runtime'"):
        fl.FederatedGaussianMixture.load(prefix)


def test_an_interrupted_save_is_refused_not_mixed(saved, tmp_path, monkeypatch):
    """The .npz of a new save replaced, the process dies before the .json: load refuses."""
    prefix = _copy(saved, "gmm", tmp_path)
    est = fl.FederatedGaussianMixture.load(prefix)
    est.weights_ = est.weights_[::-1].copy()
    real = os.replace

    def die_on_json(src, dst):
        if str(dst).endswith(".json"):
            raise OSError("simulated crash")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", die_on_json)
    with pytest.raises(OSError, match="simulated crash"):
        est.save(prefix)
    monkeypatch.setattr(os, "replace", real)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json", "model.npz"]
    with pytest.raises(ValueError, match=r"model\.npz does not match model\.json"):
        fl.FederatedGaussianMixture.load(prefix)


@pytest.mark.parametrize("model", list(CLASSES))
def test_the_cli_refuses_a_tampered_model_in_one_line(saved, tmp_path, model):
    prefix = _copy(saved, model, tmp_path)
    field = {"gmm": "weights_", "fedgmm": "weights_x_", "lcr": "weights_",
             "hlcr": "precisions_", "sec": "errors_"}.get(model) or _first_float(prefix)
    tamper(prefix, field, lambda a: a * np.nan)
    data = tmp_path / "d.csv"
    data.write_text("a,b\n1,2\n")
    res = CliRunner().invoke(app, ["predict", "--model", str(tmp_path), "--data", str(data),
                                   "--out", str(tmp_path / "p.csv")])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: cannot load the "), res.output
    assert f"field '{field}' has NaN or infinite values" in lines[0]
    assert not (tmp_path / "p.csv").exists()
