"""Client ids are data, never paths (issue 11, item 2).

FedGMM keeps one weights file per client beside a model (``clients/``), and client data files are
written one per client: an id such as ``../../x``, an absolute path, ``a/b``, ``..``, ``CON``, an
id with NUL or a newline, 300 characters, or two ids equal but for case must never write or read
outside the output directory, and the weights must come back to the right client.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cases import assert_one_error_line
from typer.testing import CliRunner

import fedlatent as fl
from fedlatent.cli import app
from fedlatent.data.fedgmm_data import make_fedgmm_synthetic
from fedlatent.data.files import (
    client_file_names,
    client_files,
    read_client_file,
    write_client_files,
)

runner = CliRunner()


def _hostile(root: Path) -> list[str]:
    return ["../../x", "../../../x", str(root.parent / "abs_escape"), "a/b", "..", ".", "CON",
            "nul.txt", "with\x00nul", "new\nline", "x" * 300, "spaces and ünïcödé", "../x",
            "_000001", "manifest", "C:\\win"]


HOSTILE_IDS = _hostile(Path("/tmp/placeholder"))  # the absolute one is rebuilt per test


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def sandbox(tmp_path):
    """``(out, check)``: an output directory and a check that nothing appeared outside it (the
    tests' own inputs go to ``tmp_path / "in"``)."""
    root = tmp_path.parent
    out = tmp_path / "out"
    (tmp_path / "in").mkdir(exist_ok=True)
    before = _listing(root)

    def check():
        new = _listing(root) - before
        ok = [str(d.relative_to(root)) for d in (out, tmp_path / "in")]
        escaped = sorted(p for p in new
                         if not any(p == d or p.startswith(d + os.sep) for d in ok))
        assert escaped == [], escaped
        assert not Path("/abs_escape.npz").exists()

    return out, check


def _frame(ids, seed=0):
    sp = make_fedgmm_synthetic(len(ids), 60, n_features=2, mean_scale=2.0, random_state=seed)
    df = sp.train.to_pandas()
    mapping = dict(zip(sorted(df["client"].unique()), ids))
    df["client"] = df["client"].map(mapping)
    return df


def _fit_args(data, out):
    return ["fit", "fedgmm", "--data", str(data), "--client", "client", "--target", "y",
            "--input-components", "2", "--learners", "2", "--max-rounds", "3", "--out", str(out),
            "--no-progress"]


def _api_fit(df):
    fd = fl.FederatedDataset.from_pandas(df, client="client", target="y")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        est = fl.FedGMM(n_input_components=2, n_learners=2, max_rounds=3, random_state=0).fit(fd)
    return est, fd


def test_file_names_are_safe_and_distinct(tmp_path):
    ids = _hostile(tmp_path) + ["Case", "case", "plain-id_1.v2"]
    names = client_file_names(ids)
    assert len(set(names.values())) == len(ids)
    assert len({n.casefold() for n in names.values()}) == len(ids)
    for name in names.values():
        assert "/" not in name and "\\" not in name and "\x00" not in name and "\n" not in name
        assert name.endswith(".npz") and not name.startswith(".") and len(name) <= 80
        assert name.split(".")[0].lower() not in {"con", "nul", "prn", "aux"}
    assert names["plain-id_1.v2"] == "plain-id_1.v2.npz"  # plain ids keep their name
    assert names["Case"] == "_000016.npz" and names["case"] == "_000017.npz"  # case-twins: index
    assert names["_000001"] == "_000013.npz"  # an index-like id never takes an index's name
    with pytest.raises(ValueError, match="client ids must be strings; got 3"):
        client_file_names(["a", 3])


@pytest.mark.parametrize("i", range(len(HOSTILE_IDS)), ids=[repr(c)[:20] for c in HOSTILE_IDS])
def test_python_api_round_trips_every_id(i, tmp_path, sandbox):
    out, check = sandbox
    cid = _hostile(tmp_path)[i]
    df = _frame([cid, "b", "c"])
    est, fd = _api_fit(df)
    paths = est.save_client_weights(out / "clients")
    est.save(out / "model")
    check()
    assert all(p.parent == out / "clients" for p in paths)
    back = fl.FedGMM.load(out / "model")
    assert set(client_files(out / "clients")) == {cid, "b", "c"}
    for c in (cid, "b", "c"):
        pers = back.load_client_weights(c, out / "clients")
        np.testing.assert_array_equal(pers.predict_proba(fd[c].X),
                                      est.predict_proba(fd[c].X, client=c))
    check()


@pytest.mark.parametrize("i", range(len(HOSTILE_IDS)), ids=[repr(c)[:20] for c in HOSTILE_IDS])
def test_cli_fit_and_predict_stay_inside_out(i, tmp_path, sandbox):
    out, check = sandbox
    cid = _hostile(tmp_path)[i]
    df = _frame([cid, "b", "c"])
    data = tmp_path / "in" / "data.parquet"
    df.to_parquet(data)
    res = runner.invoke(app, _fit_args(data, out))
    assert res.exit_code == 0, res.output
    check()
    res = runner.invoke(app, ["predict", "--model", str(out), "--data", str(data),
                              "--out", str(out / "pred.csv")])
    assert res.exit_code == 0, res.output
    check()
    pred = pd.read_csv(out / "pred.csv", keep_default_na=False)
    est = fl.FedGMM.load(out / "model")
    rows = (df["client"] == cid).to_numpy()
    pers = est.load_client_weights(cid, out / "clients")
    X = df.loc[rows, [c for c in df.columns if c.startswith("x")]].to_numpy()
    np.testing.assert_array_equal(pred["prediction"].to_numpy()[rows], pers.predict(X))


@pytest.mark.usefixtures("saturation_rule_off")
def test_all_weird_ids_together(tmp_path, sandbox):
    out, check = sandbox
    ids = _hostile(tmp_path) + ["Case", "case"]
    df = _frame(ids, seed=1)
    data = tmp_path / "in" / "data.parquet"
    df.to_parquet(data)
    res = runner.invoke(app, _fit_args(data, out))
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "clients" / "manifest.json").read_text())
    assert sorted(c for c, _ in manifest["clients"]) == sorted(ids)
    assert len(list((out / "clients").glob("*.npz"))) == len(ids)
    res = runner.invoke(app, ["predict", "--model", str(out), "--data", str(data),
                              "--out", str(out / "pred.csv")])
    assert res.exit_code == 0, res.output
    check()
    est = fl.FedGMM.load(out / "model")
    pi = {c: est.load_client_weights(c, out / "clients").pi for c in ids}
    assert not np.array_equal(pi["Case"], pi["case"])  # each twin got its own weights back


@pytest.fixture
def fitted_dir(tmp_path):
    (tmp_path / "in").mkdir(exist_ok=True)
    df = _frame(["a", "b", "c"])
    data = tmp_path / "in" / "data.parquet"
    df.to_parquet(data)
    res = runner.invoke(app, _fit_args(data, tmp_path / "m"))
    assert res.exit_code == 0, res.output
    return tmp_path / "m", df


@pytest.mark.parametrize("cid", ["../model", "../../m/model", "/etc/passwd", "manifest"])
def test_predict_never_reads_a_file_named_by_an_id(cid, fitted_dir, tmp_path):
    model_dir, df = fitted_dir
    df = df.assign(client=df["client"].replace("a", cid))
    df.to_parquet(tmp_path / "new.parquet")
    res = runner.invoke(app, ["predict", "--model", str(model_dir), "--data",
                              str(tmp_path / "new.parquet"), "--out", str(tmp_path / "p.csv")])
    assert_one_error_line(res, f"client {cid!r} has no weights file in", "use --global")
    assert not (tmp_path / "p.csv").exists()


@pytest.mark.parametrize("entry", [["a", "../model.npz"], ["a", "/etc/passwd"], ["a", "a/b.npz"],
                                   ["a", "..npz"], "not a pair"])
def test_a_tampered_manifest_is_refused(entry, fitted_dir, tmp_path):
    model_dir, df = fitted_dir
    path = model_dir / "clients" / "manifest.json"
    doc = json.loads(path.read_text())
    doc["clients"][0] = entry
    path.write_text(json.dumps(doc))
    df.to_parquet(tmp_path / "in" / "d.parquet")
    res = runner.invoke(app, ["predict", "--model", str(model_dir), "--data",
                              str(tmp_path / "in" / "d.parquet"), "--out", str(tmp_path / "p.csv")])
    assert_one_error_line(res, "is not a fedlatent client manifest", "write the directory again")


def test_a_directory_without_manifest_still_reads_plain_ids(fitted_dir, tmp_path):
    # directories written before manifests: plain ids, <id>.npz
    model_dir, df = fitted_dir
    (model_dir / "clients" / "manifest.json").unlink()
    assert sorted(client_files(model_dir / "clients")) == ["a", "b", "c"]
    df.to_parquet(tmp_path / "in" / "d.parquet")
    res = runner.invoke(app, ["predict", "--model", str(model_dir), "--data",
                              str(tmp_path / "in" / "d.parquet"), "--out", str(tmp_path / "p.csv")])
    assert res.exit_code == 0, res.output


def test_client_data_files_stay_inside_and_keep_their_ids(tmp_path, sandbox):
    out, check = sandbox
    ids = _hostile(tmp_path) + ["Case", "case"]
    fd = fl.FederatedDataset.from_arrays(
        {c: (np.full((3, 2), float(k)), np.arange(3.0)) for k, c in enumerate(ids)})
    paths = write_client_files(fd, out)
    check()
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in paths.values())
    assert len({p.name.casefold() for p in paths.values()}) == len(ids)
    for c, p in paths.items():
        back = read_client_file(p)
        assert back.client_ids == [c]
        np.testing.assert_array_equal(back[c].X, fd[c].X)


def test_partition_prints_each_id_on_its_own_line(tmp_path, sandbox):
    out, check = sandbox
    ids = ["new\nline", "flower-supernode --evil", "b"]
    df = _frame(ids)
    df.to_parquet(tmp_path / "in" / "d.parquet")
    res = runner.invoke(app, ["flower", "partition", "--data", str(tmp_path / "in" / "d.parquet"),
                              "--client", "client", "--target", "y", "--out", str(out)])
    assert res.exit_code == 0, res.output
    check()
    lines = res.stdout.splitlines()
    assert lines[0].startswith("wrote 3 client files")
    # the SuperLink's command and the registrations first (no id in them), then a comment
    # line per client (the id as a JSON string) and its command: nothing else
    first = next(i for i, ln in enumerate(lines) if ln.startswith("# client "))
    assert not any(i in ln for ln in lines[:first] for i in ("--evil", "new\\nline"))
    assert [ln.startswith("# client ") for ln in lines[first:]] == [True, False] * 3
    assert '# client "new\\nline"' in res.stdout
