"""Checkpoints and saved models: atomic, verified on resume and on load (issue 11, item 4).

A crash while a checkpoint is written cannot mix rounds; resuming a checkpoint of another run
(federation, clients, their units or states, seed, model) is refused saying what differs; a
tampered saved model of each of the five models is refused on load, in Python and by the CLI,
naming the file and the field; and a run killed with SIGKILL at 20 random points always leaves
a checkpoint that resumes to exactly the uninterrupted result, or none.
"""

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import fedlatent as fl
from fedlatent.cli import app

FED = dict(participation=0.5, step_size=0.5, random_state=3)


def gmm_fd(drop_row=False, shift=0.0):
    rng = np.random.default_rng(0)
    arrays = {f"c{c}": rng.normal(size=(40, 2)) + 3 * (c % 2) for c in range(4)}
    if drop_row:
        arrays["c1"] = arrays["c1"][:-1]
    arrays["c2"] = arrays["c2"] + shift
    return fl.FederatedDataset.from_arrays(arrays)


def gmm(max_rounds=12, fed=None, **kw):
    fed = fl.Federation(**FED) if fed is None else fed
    return fl.FederatedGaussianMixture(2, max_rounds=max_rounds, tol=0, federation=fed,
                                       random_state=3, verbose=False, **kw)


def fit(est, fd, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(fd, **kw)


def assert_same_fit(a, b):
    for name in ("weights_", "means_", "covariances_", "precisions_cholesky_"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    np.testing.assert_array_equal(a.history_.to_frame()["objective"],  # NaN: nobody sampled
                                  b.history_.to_frame()["objective"])


@pytest.fixture(scope="module")
def full():
    """The uninterrupted 12-round fit."""
    return fit(gmm(), gmm_fd())


def checkpoint_at(tmp_path, rounds=5, fd=None, est=None):
    ck = tmp_path / "ck"
    fit(est or gmm(rounds), fd or gmm_fd(), checkpoint=ck, checkpoint_every=1)
    return ck


def rewrite_checkpoint(ck, edit):
    """Rewrite checkpoint ``ck`` after ``edit(arrays, meta)``, its sha256 recomputed (a writer
    that is wrong, not a corrupted file)."""
    from fedlatent.engine.checkpoint import META_ENTRY, _arrays_sha256

    npz = Path(f"{ck}.npz")
    with np.load(npz, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays.pop(META_ENTRY).tobytes())
    edit(arrays, meta)
    meta["sha256"] = _arrays_sha256(arrays)
    arrays[META_ENTRY] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(npz, **arrays)


# ---- a crash between writes cannot mix rounds -------------------------------------------------
@pytest.mark.parametrize("crash_at", [3, 6, 9])
def test_a_crash_during_a_checkpoint_write_keeps_the_previous_checkpoint(
        tmp_path, monkeypatch, full, crash_at):
    """os.replace fails at its ``crash_at``-th call (the process dying mid-save): the run stops
    there, and resuming gives exactly the uninterrupted fit."""
    real, calls = os.replace, []

    def dying_replace(src, dst):
        calls.append(dst)
        if len(calls) >= crash_at:
            raise OSError("simulated crash")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", dying_replace)
    with pytest.raises(OSError, match="simulated crash"):
        fit(gmm(), gmm_fd(), checkpoint=tmp_path / "ck", checkpoint_every=1)
    monkeypatch.setattr(os, "replace", real)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.npz"]  # no half, no temp file
    resumed = fit(gmm(), gmm_fd(), checkpoint=tmp_path / "ck", resume=True)
    assert_same_fit(resumed, full)


def test_a_checkpoint_whose_arrays_and_metadata_are_of_different_rounds_is_refused(tmp_path):
    from fedlatent.engine.checkpoint import META_ENTRY

    ck = checkpoint_at(tmp_path, 5)
    with np.load(f"{ck}.npz", allow_pickle=False) as z:
        meta5 = z[META_ENTRY]
    fit(gmm(6), gmm_fd(), checkpoint=ck, checkpoint_every=1)
    with np.load(f"{ck}.npz", allow_pickle=False) as z:
        mixed = {k: z[k] for k in z.files}
    mixed[META_ENTRY] = meta5  # round-6 arrays, round-5 settings
    np.savez(f"{ck}.npz", **mixed)
    with pytest.raises(ValueError, match=r"ck\.npz: its arrays do not match the sha256 it "
                                         r"records \(edited or corrupted\)"):
        fit(gmm(), gmm_fd(), checkpoint=ck, resume=True)


def test_a_truncated_checkpoint_is_refused(tmp_path):
    ck = checkpoint_at(tmp_path, 3)
    data = Path(f"{ck}.npz").read_bytes()
    Path(f"{ck}.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"ck\.npz is not a readable \.npz archive"):
        fit(gmm(), gmm_fd(), checkpoint=ck, resume=True)


def test_a_checkpoint_of_the_old_two_file_layout_is_refused(tmp_path):
    ck = tmp_path / "ck"
    np.savez(f"{ck}.npz", **{"params/weights": np.ones(2) / 2})
    Path(f"{ck}.json").write_text(json.dumps({"model": "gmm", "seed": 3, "round": 5}))
    with pytest.raises(ValueError, match="has no 'meta.json' entry: it was written by an older"):
        fit(gmm(), gmm_fd(), checkpoint=ck, resume=True)


def test_one_file_is_written_and_resume_of_the_same_run_is_exact(tmp_path, full):
    ck = checkpoint_at(tmp_path, 5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.npz"]
    assert_same_fit(fit(gmm(), gmm_fd(), checkpoint=ck, resume=True), full)


# ---- resume refuses another run ---------------------------------------------------------------
def test_resume_without_a_checkpoint_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no checkpoint .*ck\.npz to resume from"):
        fit(gmm(), gmm_fd(), checkpoint=tmp_path / "ck", resume=True)


def test_resume_with_another_federation_is_refused(tmp_path):
    ck = checkpoint_at(tmp_path)
    other = gmm(fed=fl.Federation(**{**FED, "participation": 1.0}))
    with pytest.raises(ValueError, match=r"federation differs: participation 0\.5 in the "
                                         r"checkpoint, 1\.0 now$"):
        fit(other, gmm_fd(), checkpoint=ck, resume=True)


def test_resume_with_other_clients_is_refused(tmp_path):
    ck = checkpoint_at(tmp_path)
    fd = gmm_fd()
    fewer = fl.FederatedDataset.from_arrays({c: fd[c].X for c in ("c0", "c1", "c2")})
    with pytest.raises(ValueError, match=r"was written for clients \['c0', 'c1', 'c2', 'c3'\]; "
                                         r"this fit has \['c0', 'c1', 'c2'\]"):
        fit(gmm(), fewer, checkpoint=ck, resume=True)


def test_resume_with_a_client_of_other_size_is_refused(tmp_path):
    ck = checkpoint_at(tmp_path)
    with pytest.raises(ValueError, match=r"client 'c1' had 40 units in the checkpoint, 39 now "
                                         r"\(its data changed\)"):
        fit(gmm(), gmm_fd(drop_row=True), checkpoint=ck, resume=True)


def test_resume_with_other_data_of_the_same_size_is_refused(tmp_path):
    ck = checkpoint_at(tmp_path)
    with pytest.raises(ValueError, match=r"the initial parameter '\w+' differs from this fit's "
                                         r"\(the clients' data changed since it was written\)"):
        fit(gmm(), gmm_fd(shift=5.0), checkpoint=ck, resume=True)


def test_resume_with_removed_client_states_is_refused(tmp_path):
    ck = checkpoint_at(tmp_path)

    def drop(arrays, meta):
        for k in [k for k in arrays if k.startswith("client/2/")]:
            del arrays[k]

    rewrite_checkpoint(ck, drop)
    with pytest.raises(ValueError, match=r"is missing the private state of client 'c2' "
                                         r"\('engine/initialized'\); it cannot be resumed"):
        fit(gmm(), gmm_fd(), checkpoint=ck, resume=True)


def test_resume_of_a_checkpoint_without_any_client_state_is_refused(tmp_path):
    ck = checkpoint_at(tmp_path)

    def drop_all(arrays, meta):
        for k in [k for k in arrays if k.startswith("client/")]:
            del arrays[k]
        meta["client_states"] = None

    rewrite_checkpoint(ck, drop_all)
    with pytest.raises(ValueError, match="was written by a runtime whose clients keep their "
                                         "state themselves"):
        fit(gmm(), gmm_fd(), checkpoint=ck, resume=True)


def test_resume_with_a_client_state_of_another_shape_is_refused(tmp_path):
    ck = checkpoint_at(tmp_path)

    def widen(arrays, meta):
        arrays["client/0/V/nk"] = np.zeros(3)

    rewrite_checkpoint(ck, widen)
    with pytest.raises(ValueError, match=r"state 'V/nk' of client 'c0' has dtype <f8 and shape "
                                         r"\(3,\), recorded <f8 \[2\]"):
        fit(gmm(), gmm_fd(), checkpoint=ck, resume=True)


def test_resume_with_a_non_finite_statistic_is_refused(tmp_path):
    ck = checkpoint_at(tmp_path)
    rewrite_checkpoint(ck, lambda a, m: a["S_hat/nk"].__setitem__(0, np.nan))
    with pytest.raises(ValueError, match=r"'S_hat/nk' has non-finite values"):
        fit(gmm(), gmm_fd(), checkpoint=ck, resume=True)


def test_resume_with_another_seed_is_refused(tmp_path):
    ck = checkpoint_at(tmp_path)
    other = gmm(fed=fl.Federation(**{**FED, "random_state": 4}))
    with pytest.raises(ValueError, match=r"was written with seed 3; this fit has seed 4"):
        fit(other, gmm_fd(), checkpoint=ck, resume=True)


def test_resume_with_other_model_settings_is_refused(tmp_path):
    ck = checkpoint_at(tmp_path)
    with pytest.raises(ValueError, match=r'model settings differ: covariance_type "full" in the '
                                         r'checkpoint, "diag" now'):
        fit(gmm(covariance_type="diag"), gmm_fd(), checkpoint=ck, resume=True)


def test_resume_with_another_model_is_refused(tmp_path):
    rng = np.random.default_rng(0)
    fd = fl.FederatedDataset.from_arrays(
        {f"c{c}": (rng.normal(size=(40, 2)), rng.normal(size=40)) for c in range(4)})
    ck = tmp_path / "ck"
    fit(fl.LatentClassRegression(2, max_rounds=3, random_state=3,
                                 federation=fl.Federation(**FED)), fd, checkpoint=ck)
    with pytest.raises(ValueError, match=r"ck\.npz is of model 'lcr'; this fit is 'gmm'"):
        fit(gmm(), fd, checkpoint=ck, resume=True)


# ---- saved models: atomic pair, verified and validated on load --------------------------------
def _fits():
    from fedlatent.data.fedgmm_data import make_fedgmm_synthetic
    from fedlatent.data.sec_data import make_sec_simulation1

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 10, size=(4, 40))
    lcr_fd = fl.FederatedDataset.from_arrays(
        {f"s{c}": (x[c][:, None], np.where(rng.random(40) < .5, 5 + 2 * x[c], 15 - x[c])
                   + rng.normal(size=40)) for c in range(4)})
    hlcr_fd = fl.datasets.make_synthhlcr(n_agents=6, n_entities=6, entities_per_agent=2,
                                         events_per_entity=10, n_clusters=2, n_features=2,
                                         sigma=0.3, random_state=0)
    sec_fd, _ = make_sec_simulation1(n_learners=6, n_samples=25, snr=64.0, random_state=0)
    fedgmm_fd = make_fedgmm_synthetic(4, 60, n_features=2, mean_scale=2.0,
                                      random_state=0).train
    return {
        "gmm": (gmm(5), gmm_fd()),
        "fedgmm": (fl.FedGMM(2, 2, max_rounds=4, random_state=0, verbose=False), fedgmm_fd),
        "lcr": (fl.LatentClassRegression(2, max_rounds=10, random_state=0), lcr_fd),
        "hlcr": (fl.HLCR(2, sigma=0.3, max_rounds=4, random_state=0), hlcr_fd),
        "sec": (fl.SEC(candidates="linear", n_clusters=2, random_state=0), sec_fd),
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
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


CLASSES = {"gmm": fl.FederatedGaussianMixture, "fedgmm": fl.FedGMM,
           "lcr": fl.LatentClassRegression, "hlcr": fl.HLCR, "sec": fl.SEC}

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
             "hlcr": "precisions_", "sec": "errors_"}[model]
    tamper(prefix, field, lambda a: a * np.nan)
    data = tmp_path / "d.csv"
    data.write_text("a,b\n1,2\n")
    res = CliRunner().invoke(app, ["predict", "--model", str(tmp_path), "--data", str(data),
                                   "--out", str(tmp_path / "p.csv")])
    assert res.exit_code != 0
    assert "Traceback" not in res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: cannot load the "), res.output
    assert f"field '{field}' has NaN or infinite values" in lines[0]
    assert not (tmp_path / "p.csv").exists()


# ---- SIGKILL at random points -------------------------------------------------------------------
CHILD = r"""
import os, sys, warnings
import numpy as np, fedlatent as fl
warnings.simplefilter("ignore")
rng = np.random.default_rng(0)
fd = fl.FederatedDataset.from_arrays(
    {f"c{c}": rng.normal(size=(40, 2)) + 3 * (c % 2) for c in range(4)})
def run(ck, rounds):
    fl.FederatedGaussianMixture(
        2, max_rounds=rounds, tol=0, random_state=3, verbose=False,
        federation=fl.Federation(participation=0.5, step_size=0.5, random_state=3),
    ).fit(fd, checkpoint=ck, checkpoint_every=1)
run(sys.argv[1] + "-warmup", 2)  # imports and compiled paths, before any fork
print("ready", flush=True)
for line in sys.stdin:  # one forked run per line; its pid, then how it ended
    pid = os.fork()
    if pid == 0:
        try:
            run(sys.argv[1], int(line))
        finally:
            os._exit(0)
    print(pid, flush=True)
    print(os.waitpid(pid, 0)[1], flush=True)
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork and SIGKILL")
def test_sigkill_at_random_points_never_leaves_a_checkpoint_that_resumes_wrongly(tmp_path):
    """20 runs (each a fork of one process that has imported everything) killed with SIGKILL
    at random times: each leaves no checkpoint, or one that resumes to exactly the
    uninterrupted fit."""
    rounds = 30
    ck = tmp_path / "ck"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(ck)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "ready"

        def start():
            child.stdin.write(f"{rounds}\n")
            child.stdin.flush()
            return int(child.stdout.readline())

        t0 = time.perf_counter()  # one uninterrupted run, to time it
        start()
        assert int(child.stdout.readline()) == 0
        duration = time.perf_counter() - t0
        full = fit(gmm(rounds), gmm_fd())
        rng = np.random.default_rng(11)
        outcomes = []
        for _ in range(20):
            for p in tmp_path.iterdir():
                p.unlink()
            pid = start()
            time.sleep(rng.uniform(0.0, duration))
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # pragma: no cover - finished already
                pass
            status = int(child.stdout.readline())
            try:
                resumed = fit(gmm(rounds), gmm_fd(), checkpoint=ck, resume=True,
                              checkpoint_every=10**6)
            except FileNotFoundError:
                outcomes.append("no checkpoint yet")
                continue
            assert_same_fit(resumed, full)
            outcomes.append("killed, resumed exactly" if status else "finished")
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    assert outcomes.count("killed, resumed exactly") >= 10, outcomes
