"""FederatedDataset constructors, readers, partitioners, and every bad-input message."""

import numpy as np
import pandas as pd
import pytest

import fedlatent as fl
from fedlatent.data import DataValidationError, dirichlet_partition, split_arrays


def frame():
    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(30, 3)), columns=["x1", "x2", "x3"])
    df["client"] = np.repeat(["a", "b", "c"], 10)
    df["y"] = rng.integers(0, 2, size=30)
    df["ent"] = np.tile([1, 2], 15)
    return df


def test_from_pandas_groups_rows_by_client():
    fd = fl.FederatedDataset.from_pandas(frame(), client="client", features=["x1", "x2"],
                                         target="y", entity="ent")
    assert fd.client_ids == ["a", "b", "c"]
    assert fd.n_samples == 30 and fd.n_features == 2
    np.testing.assert_array_equal(fd["b"].X, frame()[["x1", "x2"]].to_numpy()[10:20])
    np.testing.assert_array_equal(fd["c"].y, frame()["y"].to_numpy()[20:])
    assert fd.has_entity and fd.has_target


def test_default_features_are_all_other_columns():
    fd = fl.FederatedDataset.from_pandas(frame(), client="client", target="y", entity="ent")
    assert fd.feature_names == ["x1", "x2", "x3"]


def test_from_arrays_with_and_without_y():
    rng = np.random.default_rng(0)
    fd = fl.FederatedDataset.from_arrays({"u": rng.normal(size=(4, 2)), 7: rng.normal(size=(3, 2))})
    assert fd.client_ids == ["7", "u"] and not fd.has_target
    fd2 = fl.FederatedDataset.from_arrays({"u": (np.ones((4, 2)), np.arange(4))})
    np.testing.assert_array_equal(fd2["u"].y, np.arange(4))


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_read_table_csv_and_parquet(tmp_path, suffix):
    df = frame()
    path = tmp_path / f"d{suffix}"
    df.to_csv(path, index=False) if suffix == ".csv" else df.to_parquet(path)
    fd = fl.FederatedDataset.read_table(path, client="client", features=["x1", "x3"], target="y")
    np.testing.assert_allclose(fd["a"].X, df[["x1", "x3"]].to_numpy()[:10])


def test_read_table_unknown_suffix_and_missing_file(tmp_path):
    (tmp_path / "d.xlsx").write_text("x")
    with pytest.raises(DataValidationError, match=r"expected a .csv, .tsv or .parquet file"):
        fl.FederatedDataset.read_table(tmp_path / "d.xlsx", client="client")
    with pytest.raises(DataValidationError, match=r"data file .* does not exist"):
        fl.FederatedDataset.read_table(tmp_path / "nope.csv", client="client")


def test_nan_names_client_and_column():
    df = frame()
    df.loc[[12, 15, 17, 18], "x3"] = np.nan
    # the data layer keeps NaN (missing values, issue 25); a model that cannot take them
    # refuses at fit, before any round, with the same message
    fd = fl.FederatedDataset.from_pandas(df, client="client", target="y")
    with pytest.raises(DataValidationError, match=r"^client 'b': column 'x3' has 4 NaN values; "
                       r"drop or impute them before fitting$"):
        fl.LatentClassRegression(2, random_state=0).fit(fd)


def test_inf_names_client_and_column():
    df = frame()
    df.loc[25, "x2"] = np.inf
    df.loc[26, "x2"] = -np.inf
    with pytest.raises(DataValidationError, match=r"^client 'c': column 'x2' has 2 infinite "
                       r"values; drop or clip them before fitting$"):
        fl.FederatedDataset.from_pandas(df, client="client", target="y")


def test_non_numeric_column_names_client_and_value():
    df = frame()
    df["x2"] = df["x2"].astype(object)
    df.loc[14, "x2"] = "abc"
    with pytest.raises(DataValidationError, match=r"^client 'b': column 'x2' is not numeric "
                       r"\(value 'abc'\); convert it to numbers or leave it out of features$"):
        fl.FederatedDataset.from_pandas(df, client="client", target="y")


def test_unknown_columns():
    with pytest.raises(DataValidationError, match=r"^feature column 'x9' is not in the data; "
                       r"available columns: \['x1', 'x2', 'x3', 'client', 'y', 'ent'\]$"):
        fl.FederatedDataset.from_pandas(frame(), client="client", features=["x1", "x9"])
    with pytest.raises(DataValidationError, match=r"^client column 'site' is not in the data"):
        fl.FederatedDataset.from_pandas(frame(), client="site")
    with pytest.raises(DataValidationError, match=r"^target column 'label' is not in the data"):
        fl.FederatedDataset.from_pandas(frame(), client="client", target="label")


def test_empty_client():
    with pytest.raises(DataValidationError, match=r"^client 'b' has no samples; remove it or "
                       r"give it data$"):
        fl.FederatedDataset.from_arrays({"a": np.ones((3, 2)), "b": np.ones((0, 2))})


def test_inconsistent_widths():
    with pytest.raises(DataValidationError, match=r"^client 'b' has 3 features but client 'a' "
                       r"has 2; every client must have the same columns$"):
        fl.FederatedDataset.from_arrays({"a": np.ones((3, 2)), "b": np.ones((3, 3))})


def test_y_length_and_nan_target():
    with pytest.raises(DataValidationError, match=r"^client 'a': y has 2 values but X has 3 rows$"):
        fl.FederatedDataset.from_arrays({"a": (np.ones((3, 2)), [0, 1])})
    df = frame().astype({"y": float})
    df.loc[3, "y"] = np.nan
    # kept by the data layer (issue 25); refused at fit by a model that cannot leave the row out
    fd = fl.FederatedDataset.from_pandas(df, client="client", target="y")
    with pytest.raises(DataValidationError, match=r"^client 'a': target column 'y' has 1 NaN"):
        fl.FederatedGaussianMixture(2).fit(fd)


def test_missing_client_id():
    df = frame()
    df.loc[4, "client"] = None
    with pytest.raises(DataValidationError, match=r"client column 'client' has 1 missing values"):
        fl.FederatedDataset.from_pandas(df, client="client")


def test_train_test_split_keeps_every_client_on_both_sides():
    fd = fl.FederatedDataset.from_pandas(frame(), client="client", target="y")
    tr, te = fd.train_test_split(0.3, random_state=0)
    assert tr.sizes() == {"a": 7, "b": 7, "c": 7} and te.sizes() == {"a": 3, "b": 3, "c": 3}
    both = np.vstack([tr["a"].X, te["a"].X])
    assert sorted(map(tuple, both)) == sorted(map(tuple, fd["a"].X))


def test_dirichlet_partition_is_a_partition_and_skewed():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, size=4000)
    parts = dirichlet_partition(y, 20, alpha=0.1, random_state=1)
    allidx = np.concatenate(parts)
    assert sorted(allidx.tolist()) == list(range(4000))
    # strong skew: most clients are dominated by one label
    dom = [np.bincount(y[p], minlength=4).max() / len(p) for p in parts]
    assert np.median(dom) > 0.7
    flat = dirichlet_partition(y, 20, alpha=1000.0, random_state=1)
    dom_flat = [np.bincount(y[p], minlength=4).max() / len(p) for p in flat]
    assert np.median(dom_flat) < 0.4
    fd = split_arrays(rng.normal(size=(4000, 2)), parts, y)
    assert fd.n_clients == 20 and fd.n_samples == 4000


def test_dirichlet_partition_errors():
    with pytest.raises(ValueError, match="alpha must be > 0"):
        dirichlet_partition(np.zeros(10), 2, 0.0)
    with pytest.raises(ValueError, match="10 samples cannot give 20 clients 1 each"):
        dirichlet_partition(np.zeros(10), 20, 1.0)


# ---- values that would be silently changed or overflow (issue 11, item 5) ---------------------
def test_integer_and_boolean_columns_keep_their_values():
    df = frame()
    df["x1"] = df["x1"] > 0
    fd = fl.FederatedDataset.from_pandas(df, client="client", target="y")
    assert fd["a"].y.dtype.kind == "i"  # class labels stay integers (FedGMM's classes_)
    np.testing.assert_array_equal(fd["a"].X[:, 0], (frame()["x1"][:10] > 0).to_numpy(float))


def test_numbers_written_as_text_are_numbers():
    df = frame()
    df["x2"] = df["x2"].map(repr)
    fd = fl.FederatedDataset.from_pandas(df, client="client", target="y")
    np.testing.assert_array_equal(fd["b"].X[:, 1], frame()["x2"].to_numpy()[10:20])


def test_duplicated_columns_outside_the_roles_are_left_alone():
    df = frame().assign(z=1.0, w=2.0).rename(columns={"w": "z"})
    fd = fl.FederatedDataset.from_pandas(df, client="client", features=["x1"], target="y")
    assert fd.feature_names == ["x1"]
    with pytest.raises(DataValidationError, match=r"^column 'z' appears 2 times in the data; "):
        fl.FederatedDataset.from_pandas(df, client="client", target="y")


def test_values_at_the_bound_are_accepted_and_beyond_it_refused():
    from fedlatent.data.validation import MAX_ABS_VALUE

    X = np.ones((4, 2))
    X[1, 1] = -MAX_ABS_VALUE
    assert fl.FederatedDataset.from_arrays({"a": X})["a"].X[1, 1] == -1e150
    X[1, 1] = np.nextafter(-MAX_ABS_VALUE, -np.inf)
    with pytest.raises(DataValidationError, match=r"^client 'a': column 'x1' has 1 values of "
                       r"magnitude above 1e\+150 \(largest 1e\+150\)"):
        fl.FederatedDataset.from_arrays({"a": X})


def test_client_row_order_matches_a_stable_sort_of_every_row():
    from fedlatent.data.dataset import client_row_order

    rng = np.random.default_rng(0)
    pool = np.array(["b", "a", "10", "9", "é", "Z", "z", "a ", "_x", "1.0", "1"], dtype=object)
    keys = pool[rng.integers(0, len(pool), 500)]
    ids, order, bounds = client_row_order(keys)
    ref = np.argsort(keys, kind="stable")
    np.testing.assert_array_equal(order, ref)
    assert list(ids) == sorted(set(keys))
    assert bounds[0] == 0 and bounds[-1] == len(keys)
    for j, cid in enumerate(ids):
        rows = order[bounds[j]:bounds[j + 1]]
        assert (keys[rows] == cid).all() and (np.diff(rows) > 0).all()
