"""Input gaps a careful attacker or user would still hit after issue 11's first pass: FedGMM.adapt
and the regressions' predict-time ``y`` refuse bad values naming the column; the command line's
outputs are all-or-nothing (a failed ``score``, ``predict`` or ``fit`` leaves no file and no
half-written directory); client ids that collide once written as text are refused.
"""

import datetime
import json
import warnings

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import fedlatent as fl
from fedlatent.cli import app
from fedlatent.data.dataset import ClientData, DataValidationError, FederatedDataset

# the saturation rule (issue 22) off for this module: its federations' clients are smaller than
# the rule allows, and it tests something else (conftest.py)
pytestmark = pytest.mark.usefixtures("saturation_rule_off_module")


# ---- 1. FedGMM.adapt ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fedgmm():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sp = fl.datasets.make_fedgmm_synthetic(n_clients=3, n_samples_per_client=40,
                                               n_components=2, n_features=2, random_state=0)
        fd = FederatedDataset(dict(sp.train.clients), ["u", "v"], sp.train.target_name)
        est = fl.FedGMM(2, 2, max_rounds=2, random_state=0, verbose=False).fit(fd)
    return est, fd


def test_adapt_text_value_names_column(fedgmm):
    est, fd = fedgmm
    cd = fd[fd.client_ids[0]]
    X = cd.X[:5].astype(object)
    X[2, 1] = "oops"
    with pytest.raises(ValueError, match=r"^X: column 'v' is not numeric \(value 'oops'\); "
                                         r"convert it to numbers$"):
        est.adapt((X, cd.y[:5]))


def test_adapt_dataframe_with_text_names_column(fedgmm):
    est, fd = fedgmm
    cd = fd[fd.client_ids[0]]
    X = pd.DataFrame(cd.X[:5], columns=["u", "v"]).astype(object)
    X.loc[0, "u"] = "n/a"
    with pytest.raises(ValueError, match=r"^X: column 'u' is not numeric \(value 'n/a'\)"):
        est.adapt((X, cd.y[:5]))


@pytest.mark.parametrize("bad, match", [
    # NaN is not refused: FedGMM takes missing values (tests/models/test_fedgmm_missing.py)
    (np.inf, r"^X: column 'v' has 1 infinite values; drop or clip them before predicting$"),
    (1e200, r"^X: column 'v' has 1 values of magnitude above 1e\+150"),
    (1 + 2j, r"^X: column 'v' is complex"),
])
def test_adapt_bad_values_refused(fedgmm, bad, match):
    est, fd = fedgmm
    cd = fd[fd.client_ids[0]]
    X = cd.X[:5].astype(complex if isinstance(bad, complex) else float)
    X[1, 1] = bad
    with pytest.raises(ValueError, match=match):
        est.adapt((X, cd.y[:5]))


def test_adapt_unknown_labels_named(fedgmm):
    est, fd = fedgmm
    cd = fd[fd.client_ids[0]]
    y = np.array(cd.y[:5]).copy()
    y[0] = 7
    with pytest.raises(ValueError, match=r"^y has labels \[7\] unseen at training \(known "
                                         r"classes: \[0, 1\]\)"):
        est.adapt((cd.X[:5], y))


def test_adapt_y_length_mismatch(fedgmm):
    est, fd = fedgmm
    cd = fd[fd.client_ids[0]]
    with pytest.raises(ValueError, match=r"^adapt: X has 5 rows but y has 4; pass one label"):
        est.adapt((cd.X[:5], cd.y[:4]))


def test_adapt_good_input_unchanged(fedgmm):
    est, fd = fedgmm
    cd = fd[fd.client_ids[0]]
    a = est.adapt((cd.X[:30], cd.y[:30]))
    b = est.adapt(ClientData(cd.X[:30], cd.y[:30]))
    np.testing.assert_array_equal(a.predict_proba(cd.X[:5]), b.predict_proba(cd.X[:5]))


# ---- 2. predict-time y of LCR, HLCR, SEC -------------------------------------------------------
def _arrays(n=12, seed=0):
    rng = np.random.default_rng(seed)
    return {c: (rng.normal(size=(n, 2)), rng.normal(size=n)) for c in ("p", "q")}


@pytest.fixture(scope="module")
def lcr():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fd = FederatedDataset.from_arrays(_arrays(20), feature_names=["u", "v"])
        return fl.LatentClassRegression(2, max_rounds=3, random_state=0).fit(fd)


Y_CASES = [
    ("complex", np.array([0.1, 1 + 2j, 0.3]), r"^target 'y' is complex; fedlatent fits real"),
    ("text", np.array([0.1, "abc", 0.3], dtype=object),
     r"^target 'y' is not numeric \(value 'abc'\); encode it as numbers$"),
    ("text_dtype", np.array(["0.1", "x", "0.3"]),
     r"^target 'y' is not numeric \(value '0.1'\)|^target 'y' is not numeric \(value 'x'\)"),
    ("nan", np.array([0.1, np.nan, 0.3]),
     r"^target 'y' has 1 NaN or infinite values; drop those rows before predicting$"),
    ("inf", np.array([0.1, -np.inf, 0.3]), r"^target 'y' has 1 NaN or infinite values"),
    ("huge", np.array([0.1, 2e150, 0.3]), r"^target 'y' has 1 values of magnitude above 1e\+150"),
    ("huge_int", np.array([0, 10**200, 1], dtype=object),
     r"^target 'y' has 1 values of magnitude above 1e\+150"),
    ("date", np.array([0.1, datetime.date(2020, 1, 1), 0.3], dtype=object),
     r"^target 'y' holds dates/times"),
]


@pytest.mark.parametrize("method", ["predict_proba", "score_samples", "score"])
@pytest.mark.parametrize("case, y, match", Y_CASES, ids=[c[0] for c in Y_CASES])
def test_lcr_predict_y_refused(lcr, method, case, y, match):
    X = np.zeros((3, 2))
    with pytest.raises(ValueError, match=match):
        getattr(lcr, method)(X, y)


def test_lcr_predict_y_good_unchanged(lcr):
    X = np.array([[0.1, 0.2], [0.3, -0.1]])
    y = np.array([0.5, -0.2])
    a = lcr.score_samples(X, y)
    b = lcr.score_samples(X, y.astype(object))
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"^y has 3 values for 2 rows of X$"):
        lcr.score_samples(X, np.zeros(3))


def _frame(n=8):
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"site": np.repeat(["s0", "s1", "s2"], n)})
    df["a"] = rng.normal(size=len(df))
    df["b"] = rng.normal(size=len(df))
    df["e"] = [f"{s}-{i % 2}" for i, s in enumerate(df["site"])]
    df["y"] = df["a"] + 2 * df["b"] + 0.1 * rng.normal(size=len(df))
    return df


@pytest.fixture(scope="module")
def hlcr_sec():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fd = FederatedDataset.from_pandas(_frame(), client="site", features=["a", "b"],
                                          target="y", entity="e")
        hlcr = fl.HLCR(2, max_rounds=2, random_state=0).fit(fd)
        sfd = FederatedDataset.from_arrays(_arrays(12), feature_names=["a", "b"])
        sec = fl.SEC(candidates="linear", n_clusters=1, random_state=0).fit(sfd)
    return hlcr, fd, sec, sfd


def _text_target(fd, cid, value):
    """fd with one text value in client cid's target (from_arrays keeps text targets)."""
    clients = {}
    for c, cd in fd.items():
        y = cd.y.astype(object)
        if c == cid:
            y[1] = value
        clients[c] = ClientData(cd.X, y, cd.entity)
    return FederatedDataset(clients, fd.feature_names, fd.target_name, fd.entity_name)


def test_hlcr_mse_text_target_named(hlcr_sec):
    hlcr, fd, _, _ = hlcr_sec
    bad = _text_target(fd, "s1", "abc")
    with pytest.raises(ValueError, match=r"^client 's1': target 'y' is not numeric \(value "
                                         r"'abc'\); encode it as numbers$"):
        hlcr.mse(bad)
    with pytest.raises(ValueError, match=r"^client 's1': target 'y' is not numeric"):
        hlcr.score_dataset(bad)


def test_hlcr_mse_no_target_named(hlcr_sec):
    hlcr, fd, _, _ = hlcr_sec
    nt = FederatedDataset({c: ClientData(cd.X, None, cd.entity) for c, cd in fd.items()},
                          fd.feature_names, None, fd.entity_name)
    with pytest.raises(ValueError, match=r"^client 's0' has no target; scoring HLCR needs"):
        hlcr.mse(nt)


def test_hlcr_context_text_target_named(hlcr_sec):
    hlcr, fd, _, _ = hlcr_sec
    ctx = _text_target(fd, "s2", "zz")
    with pytest.raises(ValueError, match=r"^context: client 's2': target 'y' is not numeric"):
        hlcr.predict(np.zeros((1, 2)), ["new"], ["new-0"], context=ctx)


def test_hlcr_mse_good_unchanged(hlcr_sec):
    hlcr, fd, _, _ = hlcr_sec
    y = np.concatenate([cd.y for _, cd in fd.items()])
    expected = float(np.mean((hlcr.predict_dataset(fd) - y) ** 2))
    assert hlcr.mse(fd) == expected


def test_sec_score_dataset_text_target_named(hlcr_sec):
    _, _, sec, sfd = hlcr_sec
    bad = _text_target(sfd, "q", "oops")
    with pytest.raises(ValueError, match=r"^client 'q': target 'y' is not numeric \(value "
                                         r"'oops'\)"):
        sec.score_dataset(bad)
    nt = FederatedDataset({c: ClientData(cd.X) for c, cd in sfd.items()}, sfd.feature_names)
    with pytest.raises(ValueError, match=r"^client 'p' has no target; scoring SEC needs"):
        sec.score_dataset(nt)


# ---- 3 and 4. all-or-nothing output of predict, score and fit ----------------------------------
runner = CliRunner()


def _boom(*args, **kwargs):
    raise ValueError("boom")


@pytest.fixture(scope="module")
def gmm_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("gmm")
    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(60, 2)), columns=["a", "b"])
    df["site"] = np.repeat(["s0", "s1", "s2"], 20)
    df.to_csv(root / "data.csv", index=False)
    res = runner.invoke(app, ["fit", "gmm", "--data", str(root / "data.csv"), "--client", "site",
                              "-k", "2", "--max-rounds", "3", "--no-progress",
                              "--out", str(root / "m")])
    assert res.exit_code == 0, res.output
    return root


def _listing(path):
    return sorted(p.name for p in path.iterdir())


def test_score_failure_leaves_no_per_row_file(gmm_model, tmp_path, monkeypatch):
    from fedlatent.models.gmm.saved import FederatedGaussianMixture as Reader

    monkeypatch.setattr(fl.FederatedGaussianMixture, "score_dataset", _boom)
    monkeypatch.setattr(Reader, "score_dataset", _boom)  # what the command reads it with
    out = tmp_path / "rows.csv"
    res = runner.invoke(app, ["score", "--model", str(gmm_model / "m"), "--data",
                              str(gmm_model / "data.csv"), "--out", str(out)])
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines()[-1] == "error: boom"
    assert _listing(tmp_path) == []


def test_score_writes_rows_then_score(gmm_model, tmp_path):
    out = tmp_path / "rows.csv"
    res = runner.invoke(app, ["score", "--model", str(gmm_model / "m"), "--data",
                              str(gmm_model / "data.csv"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0] == f"wrote 60 per-row scores to {out}"
    assert lines[1].startswith("mean log-likelihood: ") or ": " in lines[1]
    assert len(pd.read_csv(out)) == 60
    assert _listing(tmp_path) == ["rows.csv"]


def _half_written_csv(self, path, *args, **kwargs):
    with open(path, "w") as fh:
        fh.write("row,site,prediction\n0,s0,")
    raise OSError(28, "No space left on device", str(path))


@pytest.mark.parametrize("command", ["predict", "score"])
def test_interrupted_write_leaves_old_file_and_no_temp(gmm_model, tmp_path, monkeypatch, command):
    out = tmp_path / "out.csv"
    out.write_text("old\n")
    monkeypatch.setattr(pd.DataFrame, "to_csv", _half_written_csv)
    res = runner.invoke(app, [command, "--model", str(gmm_model / "m"), "--data",
                              str(gmm_model / "data.csv"), "--out", str(out)])
    assert res.exit_code == 2
    assert res.stderr.startswith("error: No space left on device: ")
    assert out.read_text() == "old\n"
    assert _listing(tmp_path) == ["out.csv"]


def _fit_gmm(data, out):
    return runner.invoke(app, ["fit", "gmm", "--data", str(data), "--client", "site", "-k", "2",
                               "--max-rounds", "3", "--no-progress", "--out", str(out)])


def _failing_write(monkeypatch, where):
    """Make the fit's writing fail: inside model.save (history) or after it (history.csv)."""
    from fedlatent.engine.fedem.history import History

    if where == "save":
        monkeypatch.setattr(History, "to_frame", _boom)
    else:
        monkeypatch.setattr(pd.DataFrame, "to_csv", _boom)


@pytest.mark.parametrize("where", ["save", "history_csv"])
def test_fit_failure_while_writing_leaves_no_directory(gmm_model, tmp_path, monkeypatch, where):
    _failing_write(monkeypatch, where)
    res = _fit_gmm(gmm_model / "data.csv", tmp_path / "m")
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines()[-1] == "error: boom"
    assert _listing(tmp_path) == []


@pytest.mark.parametrize("where", ["save", "history_csv"])
def test_fit_failure_keeps_existing_directory_unchanged(gmm_model, tmp_path, monkeypatch, where):
    out = tmp_path / "m"
    out.mkdir()
    (out / "model.json").write_text("old")
    (out / "notes.txt").write_text("mine")
    _failing_write(monkeypatch, where)
    res = _fit_gmm(gmm_model / "data.csv", out)
    assert res.exit_code == 2
    assert _listing(tmp_path) == ["m"]
    assert _listing(out) == ["model.json", "notes.txt"]
    assert (out / "model.json").read_text() == "old"


def test_fit_into_existing_directory_replaces_its_files(gmm_model, tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "model.json").write_text("old")
    (out / "notes.txt").write_text("mine")
    res = _fit_gmm(gmm_model / "data.csv", out)
    assert res.exit_code == 0, res.output
    assert _listing(tmp_path) == ["m"]
    assert _listing(out) == ["history.csv", "model.json", "model.npz", "notes.txt", "roles.json"]
    assert json.loads((out / "model.json").read_text())["class"] == "FederatedGaussianMixture"
    assert (out / "notes.txt").read_text() == "mine"


def test_fit_sec_failure_after_fit_leaves_nothing(tmp_path, monkeypatch):
    import fedlatent.cli.fit_models as fm

    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(40, 2)), columns=["a", "b"])
    df["y"] = df["a"] - df["b"] + 0.1 * rng.normal(size=40)
    df["site"] = np.repeat(["s0", "s1", "s2", "s3"], 10)
    df.to_csv(tmp_path / "d.csv", index=False)
    monkeypatch.setattr(fm, "_similarity_heatmap", _boom)
    res = runner.invoke(app, ["fit", "sec", "--data", str(tmp_path / "d.csv"), "--client",
                              "site", "--target", "y", "--candidates", "linear", "-k", "1",
                              "--out", str(tmp_path / "m")])
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines()[-1] == "error: boom"
    assert _listing(tmp_path) == ["d.csv"]


# ---- 5. client ids that collide once written as text -------------------------------------------
def _ids_frame(ids):
    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(len(ids), 2)), columns=["a", "b"])
    df["c"] = pd.Series(list(ids), dtype=object)
    return df


def test_int_and_text_client_ids_refused_in_a_table():
    with pytest.raises(DataValidationError, match=r"^client column 'c': client ids 1 and '1' are "
                                                  r"the same once written as text; rename one$"):
        FederatedDataset.from_pandas(_ids_frame([1, "1", 2, 2]), client="c")


def test_int_and_text_client_ids_refused_in_arrays_and_constructor():
    X = np.zeros((3, 2))
    with pytest.raises(DataValidationError, match=r"^client ids 1 and '1' are the same once "
                                                  r"written as text; rename one$"):
        FederatedDataset.from_arrays({1: X, "1": X + 1})
    with pytest.raises(DataValidationError, match=r"^client ids 1 and '1' are the same"):
        FederatedDataset({1: ClientData(X), "1": ClientData(X + 1)}, ["a", "b"])


def test_empty_client_ids_refused_with_row_count():
    with pytest.raises(DataValidationError, match=r"^client column 'c' has 2 rows with an empty "
                                                  r"client id; every row needs a client id$"):
        FederatedDataset.from_pandas(_ids_frame(["", "x", " ", "x"]), client="c")
    with pytest.raises(DataValidationError, match=r"^client id '' is empty; give every client a "
                                                  r"non-empty id$"):
        FederatedDataset.from_arrays({"": np.zeros((2, 1)), "b": np.zeros((2, 1))})


@pytest.mark.parametrize("missing", [None, float("nan")])
def test_missing_client_ids_refused(missing):
    with pytest.raises(DataValidationError, match=r"^client column 'c' has 1 missing values; "
                                                  r"every row needs a client id$"):
        FederatedDataset.from_pandas(_ids_frame([missing, "x", "y", "y"]), client="c")
    with pytest.raises(DataValidationError, match=rf"^a client id is missing \({missing!r}\)"):
        FederatedDataset.from_arrays({missing: np.zeros((2, 1)), "b": np.zeros((2, 1))})


def test_distinct_ids_still_accepted():
    fd = FederatedDataset.from_pandas(_ids_frame([1, 2, "x", "x"]), client="c")
    assert fd.client_ids == ["1", "2", "x"]
    assert fd.sizes() == {"1": 1, "2": 1, "x": 2}


def test_int_and_text_entity_ids_refused():
    df = _frame()
    df["e"] = df["e"].astype(object)
    df.loc[0, "e"], df.loc[1, "e"] = 7, "7"
    with pytest.raises(DataValidationError, match=r"^entity column 'e': entity ids 7 and '7' are "
                                                  r"the same once written as text; rename one$"):
        FederatedDataset.from_pandas(df, client="site", features=["a"], target="y", entity="e")


# ---- 6. roles, wide tables, client files whose metadata lies -----------------------------------
def test_one_column_cannot_hold_two_roles():
    df = _frame()
    with pytest.raises(DataValidationError, match=r"^column 'site' cannot be both the client and "
                                                  r"the entity column; give each role its own"):
        FederatedDataset.from_pandas(df, client="site", features=["a"], target="y", entity="site")
    with pytest.raises(DataValidationError, match=r"^column 'y' cannot be both the target and "
                                                  r"the entity column"):
        FederatedDataset.from_pandas(df, client="site", features=["a"], target="y", entity="y")
    with pytest.raises(DataValidationError, match=r"^column 'site' cannot be both the client and "
                                                  r"the target column"):
        FederatedDataset.from_pandas(df, client="site", features=["a"], target="site")


def test_features_given_as_one_string_refused():
    df = _frame()
    df["ab"] = 1.0
    with pytest.raises(DataValidationError, match=r"^features must be a list of column names, "
                                                  r"got the string 'ab'; write features=\['ab'\]$"):
        FederatedDataset.from_pandas(df, client="site", features="ab", target="y")


def test_wide_table_reads_in_linear_time():
    import time

    wide = pd.DataFrame(np.random.default_rng(0).normal(size=(4, 20000)))
    wide["site"] = ["a", "a", "b", "b"]
    t0 = time.process_time()
    fd = FederatedDataset.from_pandas(wide, client="site")
    assert fd.n_features == 20000
    assert time.process_time() - t0 < 5.0  # was 36 s: one DataFrame assignment per column
    np.testing.assert_array_equal(fd["b"].X, wide.iloc[2:, :20000].to_numpy())


def _client_file(path, cols, meta):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(cols)
    raw = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    pq.write_table(table.replace_schema_metadata({b"fedlatent": raw}), path)
    return path


_COLS = {"a": np.arange(3.0), "b": np.array(["x", "y", "z"]), "y": np.arange(3.0)}


@pytest.mark.parametrize("meta, match", [
    ({"client_id": "c", "features": ["a", "b"], "target": "y"},
     r"^client file '.*f\.parquet': column 'b' is not numeric \(value 'x'\); convert it"),
    ({"client_id": "c", "features": ["a", "y"], "target": "y"},
     r"has broken fedlatent metadata: column 'y' is given 2 roles \(feature, target, entity\)"),
    (b"not json", r"has broken fedlatent metadata \(not JSON: "),
    ({"client_id": "", "features": ["a"]}, r"has broken fedlatent metadata \(client id ''\)"),
    ({"client_id": "c", "features": "a"}, r"has broken fedlatent metadata \(no list of features"),
    ([1, 2], r"has broken fedlatent metadata \(no list of features"),
    ({"client_id": "c", "features": [1]}, r"broken fedlatent metadata \(column names must be text"),
], ids=["text_feature", "feature_is_target", "not_json", "empty_id", "features_str", "not_dict",
        "int_name"])
def test_client_file_whose_metadata_lies_is_refused(tmp_path, meta, match):
    from fedlatent.data.files import read_client_file

    path = _client_file(tmp_path / "f.parquet", _COLS, meta)
    with pytest.raises(DataValidationError, match=match):
        read_client_file(path)


def test_client_file_not_parquet_refused(tmp_path):
    from fedlatent.data.files import read_client_file

    (tmp_path / "f.parquet").write_bytes(b"garbage" * 10)
    with pytest.raises(DataValidationError, match=r"^cannot read '.*f\.parquet' as a Parquet file"):
        read_client_file(tmp_path / "f.parquet")


def test_client_file_round_trip_unchanged(tmp_path):
    from fedlatent.data.files import read_client_file, write_client_files

    fd = FederatedDataset.from_pandas(_frame(), client="site", features=["a", "b"], target="y",
                                      entity="e")
    paths = write_client_files(fd, tmp_path)
    back = read_client_file(paths["s1"])
    np.testing.assert_array_equal(back["s1"].X, fd["s1"].X)
    np.testing.assert_array_equal(back["s1"].y, fd["s1"].y)
    assert back.client_ids == ["s1"] and back.feature_names == ["a", "b"]


def test_csv_with_byte_order_mark_reads_its_first_column(tmp_path):
    df = _frame()[["site", "a", "b"]]
    (tmp_path / "d.csv").write_bytes(b"\xef\xbb\xbf" + df.to_csv(index=False).encode())
    res = runner.invoke(app, ["fit", "gmm", "--data", str(tmp_path / "d.csv"), "--client",
                              "site", "-k", "1", "--max-rounds", "2", "--no-progress",
                              "--out", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "m" / "roles.json").read_text())["features"] == ["a", "b"]
