"""The command line on every registered model (issue 20, item 4): ``fit NAME`` on the model's
example data (its registry example) writes a model that ``predict`` reads back, with the
predictions the Python estimator gives. A new registered model is covered without an edit."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from fedlatent.cli import app
from fedlatent.engine.contract.registry import estimator_entries, estimator_names, example

runner = CliRunner()


def _write(name, tmp_path):
    """The default example's data as one CSV (client, features, target, entity columns) and
    the options naming its columns."""
    fd = example(name).case().data()
    df = fd.to_pandas(client="client")
    path = tmp_path / "data.csv"
    df.to_csv(path, index=False)
    args = ["--data", str(path), "--client", "client",
            "--features", ",".join(str(f) for f in fd.feature_names)]
    entry = estimator_entries()[name]
    if entry.target:
        args += ["--target", fd.target_name or "y"]
    if entry.entity:
        args += ["--entity", fd.entity_name or "entity"]
    return fd, df, path, args


@pytest.mark.parametrize("name", estimator_names())
def test_fit_then_predict_on_every_registered_model(name, tmp_path):
    fd, df, path, args = _write(name, tmp_path)
    out = tmp_path / "fit"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = runner.invoke(app, ["fit", name, *args, *example(name).cli_args,
                                  "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    meta = json.loads((out / "model.json").read_text())
    cls = estimator_entries()[name].cls
    assert meta["class"] == cls.__name__
    est = cls.load(out / "model")
    assert list(est.feature_names_in_) == [str(f) for f in fd.feature_names]
    res = runner.invoke(app, ["predict", "--model", str(out), "--data", str(path),
                              "--out", str(tmp_path / "pred.csv")])
    assert res.exit_code == 0, res.output
    pred = pd.read_csv(tmp_path / "pred.csv")
    assert len(pred) == len(df)
    if example(name).personalized:  # per-client weights beside the model: not comparable
        return
    # the loaded estimator's predictions for every row where its data are, in the file's order
    want = np.asarray(est.predict_dataset(fd), dtype=float)
    np.testing.assert_allclose(pred["prediction"].to_numpy(dtype=float), want, rtol=1e-10)

@pytest.mark.parametrize("name", estimator_names())
def test_every_registered_model_has_an_example_the_tests_can_run(name):
    ex = example(name)
    fd = ex.case().data()
    est = ex.case().make()
    assert type(est) is estimator_entries()[name].cls
    assert fd.n_clients >= 2 and fd.n_samples > 0
    assert set(ex.fitted_arrays(type(est))) <= set(type(est)._save_arrays)
