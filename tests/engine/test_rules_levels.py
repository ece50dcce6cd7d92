"""Rare category levels (issue 22, item 1): a one-hot level held by one record gives that
record's row back from any sum carrying its indicator, from one client's reply and from the
secure aggregate alike. Every client refuses the setup while a level is held by 1 or 2 of its
records (``min_records_per_block``, DataSHIELD's ``nfilter.tab``), naming the column and how
many levels, never a level's name or count (issue 39: those are data; the site's own log names
them); the fix is to merge rare levels before encoding."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

import fedlatent as fl
from fedlatent.engine.faults import FederatedFitError
from fedlatent.engine.protocol.messages import ERROR_KEY

ONE_LEVEL = fl.DisclosurePolicy(min_records_per_block=1)  # every rule but the level rule


def _frame(seed=0, rare="green"):
    rng = np.random.default_rng(seed)
    rows = []
    for c in ("a", "b"):
        for i in range(40):
            colour = rare if (c, i) == ("a", 7) else ("red" if rng.random() < 0.5 else "blue")
            rows.append({"client": c, "x1": rng.normal(), "x2": rng.normal() * 2,
                         "colour": colour})
    return pd.DataFrame(rows)


def _fd(df):
    return fl.FederatedDataset.from_pandas(df, client="client", features=["x1", "x2", "colour"],
                                           categorical="onehot")


def _gmm(policy, **kw):
    return fl.FederatedGaussianMixture(2, random_state=0, max_rounds=2, verbose=False,
                                       federation=fl.Federation(disclosure=policy, **kw))


def test_level_counts_include_the_reference_level():
    from fedlatent.data.categorical import level_counts

    fd = _fd(_frame())
    a = fd["a"]
    (col, names, counts), = level_counts(fd.encoding, fd.feature_names, a.X, a.weight)
    assert col == "colour" and names == ["blue", "green", "red"]
    assert counts[1] == 1 and counts.sum() == 40  # green once; blue is the dropped reference


def test_a_one_record_level_gives_the_row_back_from_a_reply_without_the_rule():
    df = _frame()
    fd = _fd(df)
    rt = fl.InProcessRuntime(fd, record=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        _gmm(ONE_LEVEL).fit(fd, runtime=rt)
    j = fd.feature_names.index("colour=green")
    row = fd["a"].X[7]
    down = None
    found = []
    for direction, cid, method, msg in rt.log:
        if cid != "a" or method != "estep":
            continue
        if direction == "down":
            down = msg
            continue
        n = float(msg["n"])
        S = {k: (np.asarray(msg[f"delta/{k}"]) + np.asarray(down.get(f"S_hat/{k}", 0.0))) * n
             for k in ("sx", "sxx")}
        c = np.asarray(down["params/center"])
        sx, sxx = S["sx"].sum(axis=0), S["sxx"].sum(axis=0)
        found.append(c + sxx[:, j] + c[j] * sx)  # sum over the level's records of (x - c)
    assert found and np.abs(found[0] - row).max() < 1e-8  # the positive control


def test_a_one_record_level_is_refused_at_setup_naming_the_column_and_no_data(caplog):
    fd = _fd(_frame(rare="zz-Jane Doe, HIV+"))
    rt = fl.InProcessRuntime(fd, record=True)
    with pytest.raises(FederatedFitError, match=r"client 'a': column 'colour' has 1 level\(s\) "
                                                r"held by fewer than min_records_per_block=3 "
                                                r"records .*Merge rare levels") as err:
        _gmm(fl.DisclosurePolicy()).fit(fd, runtime=rt)
    assert {m for _, _, m, _ in rt.log} == {"setup"}  # nothing but the setup was exchanged
    sent = [msg[ERROR_KEY] for d, c, _, msg in rt.log if d == "up" and c == "a"]
    assert sent and not any("Jane" in t or "(1)" in t for t in sent + [str(err.value)])
    # the site's own log names the level (it stays at the site)
    assert any("'zz-Jane Doe, HIV+' (1)" in r.getMessage() for r in caplog.records)


def test_under_secure_aggregation_the_client_still_refuses():
    pytest.importorskip("cryptography")
    fd = _fd(_frame())
    rt = fl.InProcessRuntime(fd, record=True)
    with pytest.raises(FederatedFitError, match=r"client 'a': column 'colour' has 1 level\(s\) "
                                                r"held by fewer than"):
        _gmm(fl.DisclosurePolicy(), secure_aggregation=True).fit(fd, runtime=rt)
    assert {m for _, _, m, _ in rt.log} == {"setup"}


def test_merged_levels_fit():
    df = _frame()
    df["colour"] = df["colour"].replace({"green": "other", "blue": "other"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        est = _gmm(fl.DisclosurePolicy()).fit(_fd(df))
    assert est.means_.shape == (2, 3)


def test_a_latent_class_category_of_one_record_is_refused():
    rng = np.random.default_rng(1)
    data = {c: rng.integers(0, 2, size=(30, 3)).astype(float) for c in ("a", "b")}
    data["a"][4, 0] = 2.0  # category 2 of variable 0: one record in the federation
    fd = fl.FederatedDataset.from_arrays(data)
    with pytest.raises(FederatedFitError, match=r"client 'a': column 'variable 0' has 1 "
                                                r"level\(s\) held by fewer than"):
        fl.LatentClassAnalysis(2, random_state=0, max_rounds=2).fit(fd)
