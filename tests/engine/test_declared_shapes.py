"""Declared is evaluated (issue 38): a node refuses a round whose parameters have another shape
than the setup declared, with or without secure aggregation, so the saturation rule (which
counts the setup's configuration) counts what is evaluated.

The attack this closes (issue 38, measured there): a setup declaring ``n_components=2``
followed by rounds carrying 101 probe components gave a site's 200 records back in 11 rounds.
Each test plays the deviating server against real :class:`ClientNode` objects; on the code
before the hook every tampered round below was answered with statistics.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.contract import registry
from fedlatent.engine.contract.model import FederatedModel
from fedlatent.engine.node.declared import DeclaredShapeError, check_round, shape_problem
from fedlatent.engine.protocol.messages import ERROR_KEY, pack, unpack
from fedlatent.engine.rounds.loop import FederatedFitError
from fedlatent.engine.site import SitePolicy
from fedlatent.engine.transport.inprocess import InProcessRuntime
from fedlatent.models.gmm.math import compute_precision_cholesky

#: the parameters that carry one row per component (cluster, class, input component)
COMPONENT_KEYS = {
    "gmm": ("weights", "means", "precisions_cholesky"),
    "lcr": ("weights", "beta", "noise_variance"),
    "lca": ("weights", "probs"),
    "fedgmm": ("weights_x", "means", "precisions_cholesky"),
    "hlcr": ("D", "c", "coef", "counts"),
}


def _with_extra_component(params: dict, keys) -> dict:
    """``params`` with one more component: the first row of each of ``keys`` repeated."""
    out = dict(params)
    for k in keys:
        a = np.asarray(params[k])
        out[k] = np.concatenate([a, a[:1]], axis=0)
    return out


def _fitted(name: str, **runtime):
    """An example fit of estimator ``name`` with every message recorded: the runtime and the
    last round's E-step message to its first client."""
    case = registry.estimator_entries()[name].load_example().case()
    fd = case.data()
    rt = InProcessRuntime(fd, record=True, **runtime)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        case.make().fit(fd, runtime=rt)
    cid = fd.client_ids[0]
    last = [m for d, c, meth, m in rt.log if d == "down" and c == cid and meth == "estep"][-1]
    return rt, cid, dict(last)


@pytest.mark.parametrize("name", sorted(COMPONENT_KEYS))
def test_a_round_with_an_extra_component_is_refused_without_secure_aggregation(name):
    rt, cid, msg = _fitted(name)
    node = rt.nodes[cid]
    rnd = int(msg["round"])
    honest = node.handle("estep", {**msg, "round": rnd + 1})  # positive control
    assert ERROR_KEY not in honest and any(k.startswith("delta/") for k in honest)
    params = unpack(msg, "params")
    crafted = _with_extra_component(params, COMPONENT_KEYS[name])
    tampered = {k: v for k, v in msg.items() if not k.startswith("params/")}
    tampered.update(pack("params", crafted), round=rnd + 2)
    reply = node.handle("estep", tampered)
    assert not any(k.startswith("delta/") for k in reply)
    key = sorted(COMPONENT_KEYS[name])[0]
    want = tuple(np.shape(params[key]))
    assert (f"client {cid!r}: round {rnd + 2} refused: parameter {key!r} has shape "
            f"{(want[0] + 1,) + want[1:]}, the setup declared {want}") in reply[ERROR_KEY]


def _gmm_fd(n=200, seed=0):
    rng = np.random.default_rng(seed)
    return fl.FederatedDataset.from_arrays({"site": rng.normal(size=(n, 2))})


def _probe_params(K: int) -> dict:
    """The issue's probe round: one broad component and ``K - 1`` sharp ones (tiny
    covariances) at the records' scale."""
    rng = np.random.default_rng(1)
    cov = np.repeat(np.eye(2)[None] * 1e-4, K, 0)
    cov[0] = np.eye(2) * 4.0
    return {"weights": np.full(K, 1.0 / K), "means": rng.normal(size=(K, 2)),
            "precisions_cholesky": compute_precision_cholesky(cov, "full"),
            "center": np.zeros(2)}


def test_a_setup_of_2_components_then_a_round_of_101_is_refused_by_a_default_site():
    """The issue's second attack, against a site holding the library's default policy."""
    fd = _gmm_fd()
    rt = InProcessRuntime(fd, batched=False, policies=SitePolicy())
    est = fl.FederatedGaussianMixture(2, max_rounds=2, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(fd, runtime=rt)
    node = rt.nodes["site"]
    msg = {"seed": 0, "round": 50, "mode": "full", **pack("params", _probe_params(101))}
    reply = node.handle("estep", msg)
    assert not any(k.startswith("delta/") for k in reply)
    assert "parameter 'means' has shape (101, 2), the setup declared (2, 2)" in reply[ERROR_KEY]
    ok = node.handle("estep", {**msg, "round": 51, **pack("params", _probe_params(2))})
    assert ERROR_KEY not in ok and ok["delta/nk"].shape == (2,)


def test_an_extra_point_of_another_shape_is_refused_naming_the_point():
    rt, cid, msg = _fitted("gmm")
    node = rt.nodes[cid]
    params = unpack(msg, "params")
    crafted = _with_extra_component(params, COMPONENT_KEYS["gmm"])
    reply = node.handle("estep", {**msg, "round": int(msg["round"]) + 1, "points": 1,
                                  **pack("params1", crafted)})
    assert "extra point 1, refused: parameter 'means' has shape" in reply[ERROR_KEY]
    assert not any(k.startswith(("delta/", "point1/")) for k in reply)


def test_only_the_very_message_a_verified_round_checked_skips_the_shape_check():
    """A verified round's check marks the one message it checked (``shapes_checked``, which
    its E-step reads once): an equal message that is not that one, or any message after, is
    checked as without verification."""
    rt, cid, msg = _fitted("gmm")
    node = rt.nodes[cid]
    tampered = {k: v for k, v in msg.items() if not k.startswith("params/")}
    tampered.update(pack("params", _with_extra_component(unpack(msg, "params"),
                                                         COMPONENT_KEYS["gmm"])),
                    round=int(msg["round"]) + 1)
    node.shapes_checked = dict(tampered)  # equal, not the same object
    assert "the setup declared (3, 4)" in node.handle("estep", tampered)[ERROR_KEY]
    assert node.shapes_checked is None  # read once, whatever it held
    assert "the setup declared (3, 4)" in node.handle("estep", tampered)[ERROR_KEY]


@pytest.mark.parametrize("change, why", [
    (lambda p: {**p, "means": np.zeros((p["means"].shape[0], p["means"].shape[1] + 1))},
     "parameter 'means' has shape (3, 5), the setup declared (3, 4)"),
    (lambda p: {**p, "probe": np.zeros((50, 4))},
     "parameter 'probe' of shape (50, 4) is not one the model evaluates"),
])
def test_another_feature_count_or_an_undeclared_array_is_refused(change, why):
    rt, cid, msg = _fitted("gmm")
    tampered = {k: v for k, v in msg.items() if not k.startswith("params/")}
    tampered.update(pack("params", change(unpack(msg, "params"))), round=int(msg["round"]) + 1)
    assert why in rt.nodes[cid].handle("estep", tampered)[ERROR_KEY]


def test_the_evaluation_pass_is_checked_too():
    rt, cid, msg = _fitted("gmm")
    crafted = _with_extra_component(unpack(msg, "params"), COMPONENT_KEYS["gmm"])
    reply = rt.nodes[cid].handle("evaluate", {"seed": 0, "round": 1,
                                              **pack("params", crafted)})
    assert "evaluation of round 1 refused: parameter 'means' has shape" in reply[ERROR_KEY]


class _Tampering(InProcessRuntime):
    """A server whose round ``at`` carries one more component than the setup declared; it
    keeps every client's reply to that round."""

    def __init__(self, fd, at: int, **kw):
        super().__init__(fd, **kw)
        self.at, self.seen = at, {}

    def call(self, client_ids, method, messages):
        if method == "estep":
            messages = {c: self._tamper(m) for c, m in messages.items()}
        replies = super().call(client_ids, method, messages)
        if method == "estep" and any(int(m["round"]) == self.at for m in messages.values()):
            self.seen.update(replies)
        return replies

    def _tamper(self, msg):
        if int(msg["round"]) != self.at:
            return msg
        out = {k: v for k, v in msg.items() if not k.startswith("params/")}
        out.update(pack("params", _with_extra_component(unpack(msg, "params"),
                                                        COMPONENT_KEYS["gmm"])))
        return out


@pytest.mark.parametrize("secure", [False, True])
def test_every_site_refuses_the_round_with_or_without_secure_aggregation(secure):
    rng = np.random.default_rng(3)
    fd = fl.FederatedDataset.from_arrays({f"c{i}": rng.normal(size=(60, 2)) + i
                                          for i in range(6)})
    rt = _Tampering(fd, at=3)
    est = fl.FederatedGaussianMixture(
        2, max_rounds=5, tol=0.0, random_state=0,
        federation=fl.Federation(secure_aggregation=secure))
    with warnings.catch_warnings():  # (the fit goes on or stops: either way, no reply)
        warnings.simplefilter("ignore")
        try:
            est.fit(fd, runtime=rt)
        except FederatedFitError:
            pass
    assert sorted(rt.seen) == fd.client_ids
    for cid, reply in rt.seen.items():
        assert not any(k.startswith("delta/") for k in reply)
        assert (f"client {cid!r}: round 3 refused: parameter 'means' has shape (3, 2), the "
                "setup declared (2, 2)") in str(reply.get(ERROR_KEY, ""))


def test_a_model_that_declares_no_shapes_is_refused_by_the_registry_and_the_node():
    class Undeclared(FederatedModel):
        name = "test-undeclared-shapes"

        def client_stats(self, params, data, state, rng, rows=None):  # pragma: no cover
            raise NotImplementedError

        def stat_shapes(self, params):  # pragma: no cover
            return {"s": (1,)}

        def reply_numbers(self, data):
            return 1

        def m_step(self, S, params, n_total):  # pragma: no cover
            return {}

    with pytest.raises(TypeError, match=r"model 'test-undeclared-shapes' \(Undeclared\) does "
                                         r"not declare evaluated_shapes\(data\)"):
        registry.register_model(Undeclared)
    assert "test-undeclared-shapes" not in registry._MODELS
    data = _gmm_fd()["site"]
    with pytest.raises(DeclaredShapeError, match=r"round 4 refused: model "
                       r"'test-undeclared-shapes' does not declare the shapes"):
        check_round(Undeclared(), data, {"round": 4, "params/s": np.zeros(1)}, "site")


def test_every_model_of_the_library_declares_its_evaluated_shapes():
    registry.discover()
    names = [n for n in registry._MODELS if not n.startswith("test-")]
    assert {"gmm", "lcr", "lca", "hlcr", "fedgmm", "sec", "lcr_glm"} <= set(names)
    for n in names:
        assert not getattr(registry.model_class(n).evaluated_shapes, "undeclared", False), n


def test_scalars_pass_and_arrays_must_match():
    declared = {"means": (2, 3)}
    assert shape_problem(declared, {"means": np.zeros((2, 3)), "step": np.array(4.0),
                                    "seed": np.array([7.0])}) is None  # (Flower's scalars)
    assert "'probe' of shape (2,) is not one" in shape_problem(declared, {"probe": np.zeros(2)})
    assert shape_problem(declared, {"means": np.zeros((3, 2))}) == (
        "parameter 'means' has shape (3, 2), the setup declared (2, 3)")
