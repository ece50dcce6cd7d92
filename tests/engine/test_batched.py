"""Batched in-process clients (issue 13, section 1): the batched path computes what the clients
computed one by one - to a relative 1e-12 (tests/tolerance.py: the two paths group the same
sums differently, so their last bits follow the CPU's kernels) - for every model that has a
batched step, with plain EM and with FedEM (partial participation, quantizer, control
variates), and its reply checks refuse what the per-client checks refuse, with the same
reasons."""

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.contract.model import client_key
from fedlatent.engine.fedem.streams import batch_rows, quantize_flat, stream_keys, stream_uniforms
from fedlatent.engine.node.batched import ClientBatch
from fedlatent.engine.node.client import ClientNode
from fedlatent.engine.transport.inprocess import InProcessRuntime
from tolerance import assert_close, assert_same

FEDEM = fl.Federation(participation=0.5, quantizer=fl.Quantizer(4), control_variates=True,
                      step_size=0.5, random_state=3)
SETTINGS = {"plain": fl.Federation(), "fedem": FEDEM}


def _ragged(n_clients=14, d=3, seed=0, target=None):
    """Clients of unequal sizes (several buckets), each with its own mixture."""
    rng = np.random.default_rng(seed)
    data = {}
    for i in range(n_clients):
        n = int(rng.integers(6, 30))
        X = rng.normal(size=(n, d)) + 3.0 * (i % 3)
        if target == "regression":
            z = rng.integers(0, 2, n)
            y = np.where(z == 0, X @ np.arange(1.0, d + 1) + 1.0, -X.sum(1) - 2.0)
            data[f"c{i:02d}"] = (X, y + 0.1 * rng.normal(size=n))
        elif target == "classes":
            data[f"c{i:02d}"] = (X, (X[:, 0] + rng.normal(size=n) > 3.0).astype(int)
                                 + (X[:, 1] > 3.0))
        else:
            data[f"c{i:02d}"] = X
    return fl.FederatedDataset.from_arrays(data)


def _fit(make, fd, batched):
    rt = InProcessRuntime(fd, batched=batched)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = make().fit(fd, runtime=rt)
    return est, rt


def _fitted_arrays(est):
    return {k: v for k, v in vars(est).items()
            if k.endswith("_") and isinstance(v, np.ndarray) and v.dtype.kind == "f"}


MODELS = {
    "gmm-full": (lambda fed: fl.FederatedGaussianMixture(
        3, max_rounds=7, tol=0.0, random_state=0, federation=fed), None),
    "gmm-diag": (lambda fed: fl.FederatedGaussianMixture(
        3, covariance_type="diag", max_rounds=7, tol=0.0, random_state=0, federation=fed), None),
    "lcr": (lambda fed: fl.LatentClassRegression(
        2, max_rounds=7, tol=0.0, random_state=0, federation=fed), "regression"),
    "fedgmm": (lambda fed: fl.FedGMM(2, 2, max_rounds=5, tol=0.0, random_state=0,
                                     federation=fed), "classes"),
}


@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("model", list(MODELS))
def test_batched_and_per_client_paths_agree(model, setting):
    """The two client paths sum in different orders; the fitted arrays agree to 1e-10
    relative after the fit's rounds (EM's iterations carry the last bits of each round's
    rounding: 2e-12 on LCR's noise variance on one Xeon), the round records to 1e-12, and
    the clients' states (functions of those parameters: FedGMM's reached 1.6e-12 with another
    start) to the parameters' 1e-10."""
    make, target = MODELS[model]
    fd = _ragged(target=target)
    one, rt1 = _fit(lambda: make(SETTINGS[setting]), fd, batched=False)
    many, rtb = _fit(lambda: make(SETTINGS[setting]), fd, batched=True)
    assert rt1.batched_calls == 0 and rtb.batched_calls >= many.n_iter_  # each path ran
    a, b = _fitted_arrays(one), _fitted_arrays(many)
    assert a.keys() == b.keys() and len(a) >= 3
    for k in a:
        assert_close(a[k], b[k], rtol=1e-10, err_msg=k)
    ha, hb = one.history_.to_frame(), many.history_.to_frame()
    for col in ("objective", "participants", "bytes_up", "bytes_down"):  # counts: exact
        assert_close(ha[col], hb[col], err_msg=col)
    if setting == "fedem":
        assert ha["participants"].iloc[1:].lt(fd.n_clients).any()  # some rounds were partial
    # the clients' private states (V_c, pi_c...) are the same, seen through the nodes
    sa, sb = rt1.get_client_states(), rtb.get_client_states()
    assert sa.keys() == sb.keys()
    for c in sa:
        assert sa[c].keys() == sb[c].keys()
        for key in sa[c]:
            assert_close(sa[c][key], sb[c][key], rtol=1e-10, err_msg=f"{c} {key}")


@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.parametrize("fed", [
    fl.Federation(step_size=0.5, batch_size=7, random_state=1),
    fl.Federation(step_size=0.5, variance_reduction=fl.Spider(3, 6), participation=0.6,
                  random_state=1),
    fl.Federation(quantizer=fl.Quantizer(2), step_size=0.3, track_h=True, random_state=1),
], ids=["mini-batch", "spider", "track-h"])
def test_mini_batch_spider_and_h_tracking_agree_to_1e12(fed):
    fd = _ragged(seed=4)

    def make():
        return fl.FederatedGaussianMixture(2, max_rounds=8, tol=0.0, random_state=0,
                                           federation=fed)

    one, _ = _fit(make, fd, batched=False)
    many, rt = _fit(make, fd, batched=True)
    assert rt.batched_calls > 0
    assert_close(one.means_, many.means_)
    assert_close(one.covariances_, many.covariances_)
    cols = ["objective", "h_norm2"] if fed.track_h else ["objective"]
    for col in cols:
        assert_close(one.history_.to_frame()[col], many.history_.to_frame()[col], err_msg=col)


def test_a_client_streams_are_the_slices_of_the_batched_draw():
    keys = stream_keys(7, [client_key(c) for c in ("a", "b", "c17")], 4, 1)
    u = stream_uniforms(keys, 1000)
    assert u.shape == (3, 1000) and u.min() >= 0.0 and u.max() < 1.0
    # exact: one counter-based draw (integer hashing, then one scaling) sliced two ways
    assert_same(stream_uniforms(keys[1:2], 1000)[0], u[1])
    assert_same(stream_uniforms(keys, 10), u[:, :10])  # a prefix of it
    # distinct keys, rounds and purposes give unrelated streams, each uniform
    other = stream_uniforms(stream_keys(7, [client_key("a")], 5, 1), 1000)[0]
    assert abs(np.corrcoef(u[0], other)[0, 1]) < 0.1
    big = stream_uniforms(stream_keys(0, np.arange(50), 1, 2), 4000).ravel()
    assert abs(big.mean() - 0.5) < 0.005
    np.testing.assert_allclose(np.histogram(big, bins=10, range=(0, 1))[0] / big.size, 0.1,
                               atol=0.005)


def test_mini_batches_have_the_size_asked_without_repeats():
    keys = stream_keys(1, np.arange(4), 3, 2)
    mask = batch_rows(keys, np.array([5, 12, 3, 12]), 4)
    assert_same(mask.sum(1), [4, 4, 3, 4])
    assert not mask[0, 5:].any() and not mask[2, 3:].any()
    assert (mask[1] != mask[3]).any()  # two clients of the same size draw different rows


def test_quantize_flat_is_unbiased_and_on_the_grid():
    x = np.array([[3.0, -4.0, 0.0, 1.0, 2.0]])
    xs = np.repeat(x, 4000, axis=0)
    draws = quantize_flat(xs, [3, 2], 4, np.random.default_rng(0).random(xs.shape))
    np.testing.assert_allclose(draws.mean(0), x[0], atol=0.1)
    levels = np.abs(draws[:, :3]) / 5.0 * 4  # first block: norm 5
    np.testing.assert_allclose(levels, np.round(levels), atol=1e-12)
    assert (draws[:, 2] == 0.0).all()
    zero = quantize_flat(np.zeros((1, 3)), [3], 2, np.full((1, 3), 0.5))
    assert (zero == 0.0).all() and zero.shape == (1, 3)


@pytest.mark.usefixtures("saturation_rule_off")
def test_client_node_draws_its_slice_of_the_batched_quantizer():
    """What a Flower client would send (a ClientNode on its own) is the batched row."""
    fd = _ragged(n_clients=5, seed=2)
    est, rt = _fit(lambda: fl.FederatedGaussianMixture(
        2, max_rounds=3, tol=0.0, random_state=0, federation=FEDEM), fd, batched=True)
    model = rt._batch.model
    params = {"weights": est.weights_, "means": est.means_,
              "precisions_cholesky": est.precisions_cholesky_, "center": np.zeros(3)}
    S_hat = {k: np.full(v, 0.25) for k, v in model.stat_shapes(params).items()}
    msg = {"seed": 11, "round": 9, "mode": "full", "control_variates": False, "alpha": 1.0,
           "quant_levels": 3, **{f"params/{k}": v for k, v in params.items()},
           **{f"S_hat/{k}": v for k, v in S_hat.items()}}
    idx = np.arange(fd.n_clients)
    rep = rt.call_batched("estep", idx, msg)
    import json

    for i, c in enumerate(fd.client_ids):
        node = ClientNode(c, fd[c])
        node.handle("setup", {"model": model.name, "model_config": json.dumps(
            model.get_config())})
        got = node.handle("estep", dict(msg))
        flat = np.concatenate([got[f"delta/{k}"].ravel() for k in S_hat])
        assert_close(flat, rep.Q[i], err_msg=c)
        assert got["n"] == rep.n[i]


class TamperBatched(InProcessRuntime):
    """Rewrites the victim's row of the batched E-step replies from round 3 on."""

    def __init__(self, fd, victim, edit):
        super().__init__(fd)
        self.victim, self.edit = fd.client_ids.index(victim), edit

    def call_batched(self, method, idx, msg, resets=None):
        rep = super().call_batched(method, idx, msg, resets)
        if method == "estep" and int(msg["round"]) >= 3 and self.victim in idx:
            r = int(np.flatnonzero(idx == self.victim)[0])
            self.edit(rep, r)
        return rep


class TamperOne(InProcessRuntime):
    """The same lie told through the per-client path."""

    def __init__(self, fd, victim, edit):
        super().__init__(fd)
        self.victim, self.edit_msg = victim, edit

    def call(self, client_ids, method, messages):
        out = super().call(client_ids, method, messages)
        if method == "estep" and self.victim in out and \
                int(messages[self.victim]["round"]) >= 3:
            out[self.victim] = self.edit_msg(dict(out[self.victim]))
        return out


def _neg_count_batched(rep, r):
    rep.Q[r, 0] -= 5.0


def _neg_count_one(reply):
    reply["delta/nk"] = np.array(reply["delta/nk"], copy=True)
    reply["delta/nk"][0] -= 5.0
    return reply


def _nan_batched(rep, r):
    rep.Q[r, 4] = np.nan


def _nan_one(reply):
    reply["delta/sx"] = np.array(reply["delta/sx"], copy=True)
    reply["delta/sx"][0, 1] = np.nan
    return reply


def _shift_batched(rep, r):
    rep.Q[r, 2 + 2 * 3] -= 1e3  # sxx[0, 0, 0] (after nk (2,) and sx (2, 3))


def _shift_one(reply):
    reply["delta/sxx"] = np.array(reply["delta/sxx"], copy=True)
    reply["delta/sxx"][0, 0, 0] -= 1e3
    return reply


@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.parametrize("lie", ["negative-count", "nan", "not-psd"])
def test_batched_replies_are_refused_with_the_per_client_reasons(lie):
    fd = _ragged(n_clients=8, seed=5)
    victim = fd.client_ids[3]
    edit_b, edit_1 = {"negative-count": (_neg_count_batched, _neg_count_one),
                      "nan": (_nan_batched, _nan_one),
                      "not-psd": (_shift_batched, _shift_one)}[lie]

    def make():
        return fl.FederatedGaussianMixture(2, max_rounds=5, tol=0.0, random_state=0)

    rt_b = TamperBatched(fd, victim, edit_b)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        many = make().fit(fd, runtime=rt_b)
        one = make().fit(fd, runtime=TamperOne(fd, victim, edit_1))
    assert rt_b.batched_calls > 0
    rej_b = [r.rejected for r in many.history_]
    rej_1 = [r.rejected for r in one.history_]
    assert rej_b == rej_1
    assert all(victim in r for r in rej_b[2:]) and not rej_b[0] and not rej_b[1]
    reason = rej_b[2][victim]
    want = {"negative-count": "is negative", "nan": "non-finite",
            "not-psd": "not positive semi-definite"}[lie]
    assert want in reason
    assert_close(many.means_, one.means_)
    with pytest.raises(fl.engine.rounds.loop.FederatedFitError,
                       match=rf"round 3: client '{victim}' sent .*{want}.*on_invalid='raise'"):
        fl.FederatedGaussianMixture(2, max_rounds=5, tol=0.0, random_state=0,
                                    federation=fl.Federation(on_invalid="raise")).fit(
            fd, runtime=TamperBatched(fd, victim, edit_b))


def test_buckets_group_clients_by_size_and_pad_beyond_256_sizes():
    from fedlatent.data.dataset import ClientData

    datas = [ClientData(np.ones((n, 2))) for n in (3, 5, 3, 5, 4)]
    b = ClientBatch(datas)
    assert sorted(bk.X.shape[1] for bk in b.buckets) == [3, 4, 5]
    assert sorted(int(c) for bk in b.buckets for c in bk.clients) == list(range(5))
    many = ClientBatch([ClientData(np.ones((n, 1))) for n in range(1, 301)])
    assert len(many.buckets) == 10  # powers of two up to 512
    for bk in many.buckets:
        assert_same(bk.real.sum(1), [n + 1 for n in bk.clients])


def test_a_bucket_of_consecutive_equal_clients_holds_their_rows_as_given():
    """Clients of equal size that are consecutive in the batch are stacked by a reshape (no
    gather, no padding); an interleaved bucket is gathered. Either way each client's rows, in
    order, bit for bit (the same values, copied), and every row real."""
    from fedlatent.data.dataset import ClientData

    rng = np.random.default_rng(3)
    sizes = (4, 4, 4, 6, 4, 6)  # a bucket of 4 and one of 6 rows, interleaved at the end
    Xs = [rng.normal(size=(n, 3)) for n in sizes]
    Xs[1][2, 0] = -0.0
    ys = [rng.normal(size=n) for n in sizes]
    b = ClientBatch([ClientData(x, y) for x, y in zip(Xs, ys)])
    for bk in b.buckets:
        for j, c in enumerate(bk.clients):
            n = sizes[c]
            assert_same(bk.X[j, :n], Xs[c])  # copies of the same values: exact
            assert_same(bk.y[j, :n], ys[c])
            assert_same(bk.real[j], np.arange(bk.X.shape[1]) < n)
    same = ClientBatch([ClientData(x) for x in Xs[:3]])
    (bk,) = same.buckets
    assert bk.X.shape == (3, 4, 3) and bk.real.all()
    assert np.signbit(bk.X[1, 2, 0])  # minus zero kept
