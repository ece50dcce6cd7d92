"""The command line: fit gmm writes its outputs; bad input exits non-zero and writes nothing."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from fedlatent.cli import app

runner = CliRunner()


def write_data(path, n_clients=6, seed=0):
    rng = np.random.default_rng(seed)
    frames = []
    for c in range(n_clients):
        X = rng.normal(loc=4 * (c % 2), size=(80, 2))
        f = pd.DataFrame(X, columns=["a", "b"])
        f["site"] = f"s{c}"
        f["note"] = "x"
        frames.append(f)
    df = pd.concat(frames, ignore_index=True)
    if str(path).endswith(".parquet"):
        df.to_parquet(path)
    else:
        df.to_csv(path, index=False)
    return df


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_fit_gmm_writes_model_and_history(tmp_path, suffix):
    data = tmp_path / f"d{suffix}"
    write_data(data)
    out = tmp_path / "fit"
    res = runner.invoke(app, ["fit", "gmm", "--data", str(data), "--client", "site",
                              "--features", "a,b", "--components", "2", "--out", str(out),
                              "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "6 clients, 480 samples, 2 features, K=2 (full)" in res.output
    meta = json.loads((out / "model.json").read_text())
    assert meta["class"] == "FederatedGaussianMixture"
    hist = pd.read_csv(out / "history.csv")
    assert hist["round"].tolist() == list(range(1, len(hist) + 1))
    w = np.load(out / "model.npz", allow_pickle=False)["weights_"]
    np.testing.assert_allclose(np.sort(w), [0.5, 0.5], atol=0.02)


def test_fit_gmm_with_partial_participation_and_quantization(tmp_path):
    data = tmp_path / "d.csv"
    write_data(data)
    out = tmp_path / "fit"
    res = runner.invoke(app, ["fit", "gmm", "--data", str(data), "--client", "site",
                              "--features", "a,b", "-k", "2", "--participation", "0.5",
                              "--step-size", "0.5", "--quantize", "4", "--max-rounds", "15",
                              "--tol", "0", "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    hist = pd.read_csv(out / "history.csv")
    assert len(hist) == 15 and hist["participants"].iloc[1:].max() < 6


@pytest.mark.parametrize(
    "mutate, args, message",
    [
        # (NaN: the GMM takes missing values since issue 25; the refusal of the models that
        # cannot is tests/cli/test_cli_missing.py::test_lcr_fit_refuses_empty_cells)
        (None, ["--features", "a,zz"],
         "error: feature column 'zz' is not in the data; available columns: "
         "['a', 'b', 'site', 'note']"),
        (None, ["--features", "a,note"],
         "error: client 's0': column 'note' is not numeric (value 'x'); convert it to numbers "
         "or leave it out of features"),
        (lambda df: df.assign(b=np.where(df.index == 400, np.inf, df["b"])),
         ["--features", "a,b"],
         "error: client 's5': column 'b' has 1 infinite values; drop or clip them before fitting"),
    ],
)
def test_bad_input_exits_nonzero_and_writes_nothing(tmp_path, mutate, args, message):
    data = tmp_path / "d.csv"
    df = write_data(data)
    if mutate is not None:
        mutate(df).to_csv(data, index=False)
    out = tmp_path / "fit"
    res = runner.invoke(app, ["fit", "gmm", "--data", str(data), "--client", "site", *args,
                              "-k", "2", "--out", str(out)])
    assert res.exit_code != 0
    assert message in res.output
    assert not out.exists()


def test_bad_federation_setting_is_refused(tmp_path):
    data = tmp_path / "d.csv"
    write_data(data)
    out = tmp_path / "fit"
    res = runner.invoke(app, ["fit", "gmm", "--data", str(data), "--client", "site",
                              "--features", "a,b", "-k", "2", "--participation", "0",
                              "--out", str(out)])
    assert res.exit_code != 0
    assert "error: --participation must be in (0, 1], got 0.0" in res.output  # not Python
    assert not out.exists()


def test_demo_command(tmp_path):
    res = runner.invoke(app, ["demo", "--out", str(tmp_path), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    line = [ln for ln in res.output.splitlines() if ln.startswith("largest difference")][0]
    diffs = [float(tok.rstrip(",")) for tok in line.split() if "e-" in tok]
    assert len(diffs) == 3 and max(diffs) < 1e-8


def test_experiment_command_lists_unknown_names(tmp_path):
    res = runner.invoke(app, ["experiment", "nope", "--out", str(tmp_path)])
    assert res.exit_code != 0
    assert "unknown experiment 'nope'; available:" in res.output
    assert "fedem-toy" in res.output
