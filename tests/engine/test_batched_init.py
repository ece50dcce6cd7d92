"""Setup and initialization batched like the rounds (issue 23, item 3): in-process clients answer
the setup message and the Gaussian mixture's initialization queries (moments, hard-assignment
sums) at once, as rows checked row-wise, with the same numbers (to 1e-10) and the same refusals,
with the same reasons, as client by client."""

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.faults import FederatedFitError
from fedlatent.engine.protocol.exchange import Replies, ask, number
from fedlatent.engine.protocol.messages import ClientReplyError, array, check_fields
from fedlatent.engine.protocol.runtime import Runtime
from fedlatent.engine.transport.inprocess import InProcessRuntime
from fedlatent.models.gmm.model import hard_labels
from tolerance import assert_close, assert_same  # exact: hard labels are integers


def _clients(n_clients=40, d=3, seed=0):
    """Clients of unequal sizes (several buckets), each its own mixture of three blobs."""
    rng = np.random.default_rng(seed)
    data = {}
    for i in range(n_clients):
        n = int(rng.integers(4, 16))
        z = rng.integers(0, 3, n)
        data[f"c{i:02d}"] = rng.normal(size=(n, d)) + 4.0 * z[:, None] + 0.5 * (i % 2)
    return fl.FederatedDataset.from_arrays(data)


# small clients (4 to 15 rows): the saturation rule (tested in test_rules_saturation.py, and
# below for the batched setup) would refuse them
@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.parametrize("ct", ["full", "tied", "diag", "spherical"])
def test_batched_start_equals_one_by_one(ct):
    fd = _clients()
    starts, runtimes = {}, {}
    for batched in (False, True):
        rt = InProcessRuntime(fd, batched=batched)
        est = fl.FederatedGaussianMixture(3, covariance_type=ct, random_state=1)
        starts[batched], runtimes[batched] = est.initial_parameters(fd, runtime=rt), rt
    assert runtimes[False].batched_calls == 0
    # setup, moments, the candidates' sums and two Lloyd steps: each one batched call
    assert runtimes[True].batched_calls == 5
    for k, v in starts[False].items():
        assert_close(starts[True][k], v, rtol=1e-10, err_msg=k)


# small clients (4 to 15 rows): the saturation rule (tested in test_rules_saturation.py, and
# below for the batched setup) would refuse them
@pytest.mark.usefixtures("saturation_rule_off")
def test_batched_fit_equals_one_by_one_and_keeps_states():
    """The whole fit (setup, start, rounds) and the clients' states afterwards (what a
    checkpoint holds) are those of the clients called one by one."""
    fd = _clients(seed=3)
    fits, states = {}, {}
    for batched in (False, True):
        rt = InProcessRuntime(fd, batched=batched)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fits[batched] = fl.FederatedGaussianMixture(3, max_rounds=6, tol=0.0,
                                                        random_state=2).fit(fd, runtime=rt)
        states[batched] = rt.get_client_states()
    for k in ("weights_", "means_", "covariances_"):
        assert_close(getattr(fits[True], k), getattr(fits[False], k), rtol=1e-10, err_msg=k)
    assert states[True].keys() == states[False].keys()
    for c in states[False]:
        assert states[True][c].keys() == states[False][c].keys()
        for k, v in states[False][c].items():
            assert_close(states[True][c][k], v, rtol=1e-10, err_msg=f"{c} {k}")


#: the refusals stop the fit (so their texts compare); left out by default
STOP = fl.Federation(on_refusal="stop")


# small clients (4 to 15 rows): the saturation rule (tested in test_rules_saturation.py, and
# below for the batched setup) would refuse them
@pytest.mark.usefixtures("saturation_rule_off")
def test_batched_setup_refuses_a_small_client_as_one_by_one():
    data = {f"c{i}": np.random.default_rng(i).normal(size=(8, 2)) for i in range(5)}
    data["c2"] = data["c2"][:2]  # 2 records < min_records=3
    fd = fl.FederatedDataset.from_arrays(data)
    errors = {}
    for batched in (False, True):
        with pytest.raises(FederatedFitError, match=r"setup: client 'c2': refused by the "
                           r"disclosure policy: min_records=3 \(it holds fewer records") as err:
            fl.FederatedGaussianMixture(2, random_state=0, federation=STOP).fit(
                fd, runtime=InProcessRuntime(fd, batched=batched))
        errors[batched] = str(err.value)
    assert errors[True] == errors[False]


def test_batched_setup_refuses_saturated_clients_as_one_by_one():
    """The saturation rule at a batched setup: the same clients refused, in the same words, as
    each client's own setup check (6 numbers about 8 rows of 2 values: 12 > 0.33 * 16 does not
    pass either way; the 40-row clients pass)."""
    data = {f"c{i}": np.random.default_rng(i).normal(size=(40, 2)) for i in range(5)}
    data["c1"], data["c3"] = data["c1"][:8], data["c3"][:9]
    fd = fl.FederatedDataset.from_arrays(data)
    errors = {}
    for batched in (False, True):
        rt = InProcessRuntime(fd, batched=batched)
        with pytest.raises(FederatedFitError, match=r"setup: client 'c1': the round statistic "
                           r"carries 12 free numbers about 8 record\(s\)") as err:
            fl.FederatedGaussianMixture(2, random_state=0, federation=STOP).fit(fd,
                                                                                runtime=rt)
        errors[batched] = str(err.value)
        assert "client 'c3'" in errors[batched] and "'c0'" not in errors[batched]
    assert errors[True] == errors[False]
    assert rt.batched_calls >= 1  # the batched setup answered


# small clients (4 to 15 rows): the saturation rule (tested in test_rules_saturation.py, and
# below for the batched setup) would refuse them
@pytest.mark.usefixtures("saturation_rule_off")
def test_nodes_catch_up_with_a_batched_setup():
    """A client called on its own after a setup made at once has been set up with the same
    message (its model and policy), and answers as it would have."""
    fd = _clients(n_clients=6)
    rt = InProcessRuntime(fd)
    est = fl.FederatedGaussianMixture(2, random_state=0)
    est.initial_parameters(fd, runtime=rt)
    node = rt.nodes["c03"]
    assert node.model is not None and node.model.name == "gmm"
    assert node.state["engine/initialized"] == 1.0
    reply = rt.call(["c03"], "query", {"c03": {"query": "moments", "seed": 0}})["c03"]
    X = fd["c03"].X
    assert_close(reply["sxx"], X.T @ X)


@pytest.mark.parametrize("need", [1, 3, 5])
def test_hard_labels_batched_equals_each_client(need):
    from fedlatent.models.gmm.batched import hard_labels_batched

    rng = np.random.default_rng(need)
    C, m, M = 200, 9, 12
    d2 = rng.random((C, m, M))
    real = np.ones((C, m), dtype=bool)
    sizes = rng.integers(1, m + 1, C)
    real[np.arange(m)[None, :] >= sizes[:, None]] = False  # padding rows
    got = hard_labels_batched(d2, real, need)
    policy = fl.DisclosurePolicy(min_records_per_block=need)
    for c in range(C):
        want = hard_labels(d2[c, :sizes[c]], policy)
        assert_same(got[c, :sizes[c]], want, err_msg=f"client {c}")


def _expect():
    def units(n, reply, c):
        return None if float(n) == 5.0 else f"claims {float(n):g} samples, 5 at setup"

    def positive(v, reply, c):
        return None if np.all(np.asarray(v) > -1) else "holds a value <= -1"

    return {"n": number(low=1, check=units,
                        rows=lambda n, f, cl: np.asarray(n) != 5.0),
            "s": array(2, 2, check=positive, rows=lambda v, f, cl: np.any(v <= -1, axis=(1, 2))),
            "t": array(None, low=0)}


def _rows():
    n = np.full(7, 5.0)
    s = np.zeros((7, 2, 2))
    t = np.ones((7, 3))
    n[1] = 4.0             # the units check
    s[2, 0, 1] = np.nan    # non-finite
    t[3, 2] = -1.0         # below the bound
    s[4, 1, 1] = -2.0      # the meaning check
    n[5] = 0.0             # below low (before the units check)
    n[6] = np.inf          # non-finite number
    return {"n": n, "s": s, "t": t}


def test_check_rows_gives_check_fields_reasons():
    from fedlatent.engine.protocol.messages import check_rows

    ids = [f"c{i}" for i in range(7)]
    rows = _rows()
    want = {}
    for i, c in enumerate(ids):
        try:
            check_fields(c, {k: v[i] for k, v in rows.items()}, _expect())
        except ClientReplyError as err:
            want[i] = err.reason
    assert sorted(want) == [1, 2, 3, 4, 5, 6]
    assert check_rows(ids, rows, _expect()) == want
    assert check_rows(ids, {"n": rows["n"]}, _expect()) == dict.fromkeys(
        range(7), "missing value(s) ['s', 't']")


class _Rows(Runtime):
    """A runtime whose clients answer at once (rows), or one by one (``rows=False``)."""

    def __init__(self, rows: bool):
        self.rows = rows

    @property
    def client_ids(self):
        return [f"c{i}" for i in range(7)]

    def call(self, client_ids, method, messages):
        r = _rows()
        pos = {c: i for i, c in enumerate(self.client_ids)}
        return {c: {k: v[pos[c]] for k, v in r.items()} for c in client_ids}

    def call_rows(self, model, client_ids, method, message):
        if not self.rows:
            return None
        r = _rows()
        half = [(np.arange(0, 3), {k: v[:3] for k, v in r.items()}, {}),
                (np.arange(3, 7), {k: v[3:] for k, v in r.items()}, {1: "client 'c4': busy"})]
        return iter(half)


def test_rows_faults_as_one_by_one():
    from fedlatent.engine.protocol.exchange import RowReplies

    msgs = {}
    for rows in (False, True):
        with pytest.raises(FederatedFitError) as err:
            ask(_Rows(rows), "query", {"query": "x"}, what="a test", expect=_expect(),
                model=object())
        msgs[rows] = err.value.faults
    msgs[False]["c4"] = "busy"  # (the declined client of the batched answer)
    assert msgs[True] == msgs[False]
    got = ask(_Rows(True), "query", {"query": "x"}, what="a test", expect=_expect(),
              model=object(), required=False)
    assert isinstance(got, RowReplies) and list(got) == ["c0"]
    assert float(got["c0"]["n"]) == 5.0


def test_row_totals_equal_reply_totals():
    from fedlatent.engine.protocol.exchange import RowReplies

    rng = np.random.default_rng(0)
    a = rng.normal(size=(50, 3, 3)) * 10.0 ** rng.integers(-8, 8, (50, 1, 1))
    b = rng.normal(size=50)
    ids = [f"c{i}" for i in range(50)]
    rep = Replies({c: {"a": a[i], "b": float(b[i])} for i, c in enumerate(ids)})
    rows = RowReplies(ids, {"a": a, "b": b})
    assert_close(rows.total("a"), rep.total("a"), rtol=1e-15)
    assert_close(rows.total("b"), rep.total("b"), rtol=1e-15)
    assert rows["c7"]["b"] == b[7]
