"""Disclosure control of SEC's learners against real replies (issue 12, part 1): a random
forest sent with leaves of one record carries raw y values (the attack works with the policy
off); under the default policy every leaf holds at least tree_min_leaf records and no y comes
back; learners that store training rows are refused, naming the learner and the candidate."""

from __future__ import annotations

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.rounds.loop import FederatedFitError
from fedlatent.models.sec.disclosure import leaf_sizes
from fedlatent.models.sec.serialize import loads_model

OFF = fl.DisclosurePolicy.off()


def _data():
    fd, _ = fl.datasets.make_sec_simulation1(n_learners=4, n_samples=50, random_state=0)
    return fd


def _fit(policy, candidates=("rf",)):
    fd = _data()
    rt = fl.InProcessRuntime(fd, record=True)
    est = fl.SEC(candidates=list(candidates), n_clusters=2, random_state=0,
                 federation=fl.Federation(disclosure=policy)).fit(fd, runtime=rt)
    return fd, rt.log, est


def _raw_y_in_leaves(log, fd):
    """{client: (number of its raw y values found in the leaves of the forest it sent, the
    smallest leaf)}: leaf values on the learner's scale, turned back with the y scaling sent
    beside the model."""
    out = {}
    for direction, cid, method, msg in log:
        if direction != "up" or method != "query" or "model" not in msg:
            continue
        model = loads_model(np.asarray(msg["model"], dtype=np.uint8))
        values = np.concatenate([t.tree_.value[t.tree_.children_left == -1].ravel()
                                 for t in model.estimators_])
        raw = values * float(msg["y_scale"]) + float(msg["y_mean"])
        y = np.asarray(fd[cid].y, dtype=np.float64)
        hit = np.abs(raw[:, None] - y[None, :]) < 1e-8 * max(1.0, np.abs(y).max())
        out[cid] = (int(hit.any(axis=0).sum()), int(leaf_sizes(model).min()))
    return out


def test_forest_leaves_carry_raw_y_with_the_policy_off():
    fd, log, _ = _fit(OFF)
    found = _raw_y_in_leaves(log, fd)
    assert set(found) == set(fd.client_ids)
    assert all(n >= 10 for n, _ in found.values())  # of 50 y values per learner
    assert min(m for _, m in found.values()) == 1


def test_forest_leaves_hold_tree_min_leaf_records_under_the_default_policy():
    fd, log, est = _fit(fl.DisclosurePolicy())
    found = _raw_y_in_leaves(log, fd)
    assert set(found) == set(fd.client_ids)
    assert all(n == 0 for n, _ in found.values())
    assert min(m for _, m in found.values()) >= fl.DisclosurePolicy().tree_min_leaf
    assert list(est.selected_) == ["rf"] * 4


@pytest.mark.parametrize(("name", "kind"), [("knn", "KNeighborsRegressor"), ("svr", "SVR")])
def test_row_storing_candidates_are_refused_by_default(name, kind):
    fd = _data()
    first = fd.client_ids[0]
    with pytest.raises(FederatedFitError, match=(
            rf"SEC select: client '{first}': candidate '{name}' \({kind}\) stores training rows "
            rf"in its fitted model, so sending it sends them; refused by the disclosure policy "
            rf"\(allow_row_storing_learners=False\)\. Remove it from the candidates, or pass "
            rf"federation=fl\.Federation\(disclosure=fl\.DisclosurePolicy\("
            rf"allow_row_storing_learners=True\)\)")):
        fl.SEC(candidates=["lasso_cv", name], n_clusters=2, random_state=0).fit(fd)


def test_row_storing_candidates_are_allowed_when_the_user_opts_out():
    allow = fl.DisclosurePolicy(allow_row_storing_learners=True)
    _, _, est = _fit(allow, candidates=("knn",))
    assert list(est.selected_) == ["knn"] * 4
