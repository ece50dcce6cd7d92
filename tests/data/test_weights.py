"""Frequency weights in the data layer (issue 24 item 5): the weight column of
``from_pandas`` / ``read_table`` / ``from_arrays``, its checks (negative, NaN, inf, all-zero
client: errors naming the column and at most ten clients), and weights kept through every
row operation."""

import ast
import inspect
import textwrap

import numpy as np
import pandas as pd
import pytest

import fedlatent as fl
from fedlatent.data import frame
from fedlatent.data.validation import DataValidationError


def table(w=None, n_clients=3, per=4):
    rng = np.random.default_rng(0)
    n = n_clients * per
    df = pd.DataFrame({"site": np.repeat([f"s{i}" for i in range(n_clients)], per)[::-1],
                       "x": rng.normal(size=n), "y": rng.normal(size=n)})
    df["w"] = np.arange(1, n + 1, dtype=float) if w is None else w
    df.index = [f"r{i}" for i in range(n)]
    return df


def test_from_pandas_keeps_each_rows_weight_and_no_feature_reads_it():
    df = table()
    fd = fl.FederatedDataset.from_pandas(df, client="site", target="y", weight="w")
    assert fd.feature_names == ["x"] and fd.weight_name == "w" and fd.has_weights
    for cid, cd in fd.items():
        want = df.loc[df.site == cid, "w"].to_numpy()
        np.testing.assert_array_equal(cd.weight, want)
        np.testing.assert_array_equal(cd.X[:, 0], df.loc[df.site == cid, "x"].to_numpy())
    back = fd.to_pandas(client="site")
    assert list(back.columns) == ["site", "x", "y", "w"]
    assert sorted(back["w"]) == sorted(df["w"])
    assert list(fd.row_index) == list(df.index)


def test_mass_and_records_count_weights_and_rows():
    df = table(w=[0.0, 2.5, 1.0, 3.0] * 3)
    fd = fl.FederatedDataset.from_pandas(df, client="site", weight="w")
    cd = fd["s0"]
    assert cd.mass() == pytest.approx(6.5) and cd.n_records() == 3 and cd.n_samples == 4
    assert cd.mass(np.array([1, 3])) == pytest.approx(5.5)
    assert cd.n_records(np.array([0, 2])) == 1
    plain = fl.FederatedDataset.from_pandas(df, client="site")
    assert plain["s0"].mass() == 4 and isinstance(plain["s0"].mass(), int)
    assert plain["s0"].weight is None and not plain.has_weights


def test_row_operations_keep_the_weights():
    fd = fl.FederatedDataset.from_pandas(table(), client="site", target="y", weight="w")
    tr, te = fd.train_test_split(test_size=0.5, random_state=0)
    for part in (tr, te, fd.subset(["s1"]), fd.map(lambda c, cd: cd.replace(X=cd.X * 2))):
        assert part.weight_name == "w"
        for cid, cd in part.items():
            full = fd[cid]
            pos = [list(full.rows).index(r) for r in cd.rows]
            np.testing.assert_array_equal(cd.weight, full.weight[pos])
    pooled = fd.pooled()
    np.testing.assert_array_equal(pooled.weight, np.concatenate([fd[c].weight
                                                                 for c in fd.client_ids]))


def test_from_arrays_and_read_table_take_weights(tmp_path):
    rng = np.random.default_rng(1)
    data = {"a": rng.normal(size=(3, 2)), "b": rng.normal(size=(2, 2))}
    fd = fl.FederatedDataset.from_arrays(data, weights={"a": [1, 2, 3], "b": [0.5, 1]})
    np.testing.assert_array_equal(fd["a"].weight, [1.0, 2.0, 3.0])
    assert fd["b"].mass() == pytest.approx(1.5) and fd.weight_name == "weight"
    with pytest.raises(DataValidationError, match=r"missing \['b'\], unknown \['c'\]"):
        fl.FederatedDataset.from_arrays(data, weights={"a": [1, 2, 3], "c": [1, 1]})
    path = tmp_path / "t.csv"
    table().to_csv(path, index=False)
    fd = fl.FederatedDataset.read_table(path, client="site", target="y", weight="w")
    assert fd["s2"].weight.tolist() == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("bad, what", [(-1.0, "negative"), (np.nan, "NaN"),
                                       (np.inf, "infinite")])
def test_a_bad_weight_names_the_column_and_the_client(bad, what):
    w = np.ones(12)
    w[5] = bad  # row 5 is client s1's
    with pytest.raises(DataValidationError,
                       match=rf"weight column 'w' has {what} values at clients 's1' "
                             r"\(1 at client 's1'\)"):
        fl.FederatedDataset.from_pandas(table(w), client="site", weight="w")


def test_a_client_with_all_zero_weights_is_refused_naming_at_most_ten():
    df = table(w=0.0, n_clients=13, per=2)
    df.loc[df.site == "s0", "w"] = 1.0
    with pytest.raises(DataValidationError) as err:
        fl.FederatedDataset.from_pandas(df, client="site", weight="w")
    msg = str(err.value)
    assert msg.startswith("weight column 'w' is zero on every row of clients 's1', 's10', ")
    assert msg.count("'s") == 10 and "and 2 more" in msg and "leave it out" in msg


def test_weight_column_errors():
    df = table()
    with pytest.raises(DataValidationError, match=r"weight column 'v' is not in the data"):
        fl.FederatedDataset.from_pandas(df, client="site", weight="v")
    with pytest.raises(DataValidationError,
                       match=r"column 'y' cannot be both the target and the weight column"):
        fl.FederatedDataset.from_pandas(df, client="site", target="y", weight="y")
    with pytest.raises(DataValidationError, match=r"column 'w' cannot be both a feature and"):
        fl.FederatedDataset.from_pandas(df, client="site", features=["x", "w"], weight="w")
    df["w"] = df["w"].astype(str).replace("3.0", "three")
    with pytest.raises(DataValidationError,
                       match=r"client 's2': weight column 'w' is not numeric"):
        fl.FederatedDataset.from_pandas(df, client="site", weight="w")


def test_frame_parts_is_decomposed_under_80_lines():
    fns = {n.name: n for n in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(frame))))
           if isinstance(n, ast.FunctionDef)}
    assert fns["frame_parts"].end_lineno - fns["frame_parts"].lineno + 1 < 80


def test_client_files_refuse_weights_rather_than_drop_them(tmp_path):
    from fedlatent.data.files import write_client_files

    fd = fl.FederatedDataset.from_pandas(table(), client="site", weight="w")
    with pytest.raises(DataValidationError, match=r"client files do not carry frequency "
                                                  r"weights yet: the weight column 'w'"):
        write_client_files(fd, tmp_path / "out")
    assert not (tmp_path / "out").exists()
