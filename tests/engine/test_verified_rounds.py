"""Verified rounds (issue 38), wired: under secure aggregation every site checks its own reply is
in the sum the server used (the sum tree of the exchange before) and replays the server's
step; a server that moves one coordinate by 1e-6 (relative), adds a component, adds or drops
a parameter after steady rounds, or shows a transcript without a site's own vector is refused
at that round by every site, for GMM, LCR, LCA, FedGMM and HLCR; verified and unverified
secure fits agree to 1e-10."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.contract import registry
from fedlatent.engine.faults import FederatedFitError
from fedlatent.engine.protocol.messages import ERROR_KEY, pack, unpack
from fedlatent.engine.transport.inprocess import InProcessRuntime
from verified_doubles import moved

MODELS = ["gmm", "lcr", "lca", "fedgmm", "hlcr"]
#: the round the deviating server deviates in (after the start and the initialization round)
K = 3


def _case(name: str):
    case = registry.estimator_entries()[name].load_example().case()
    return case, case.data()


def _fit(name: str, runtime=None, **fed):
    case, fd = _case(name)
    est = case.make()
    if "n_init" in est.get_params():
        est.set_params(n_init=1)
    if "tol" in est.get_params():
        est.set_params(tol=0.0)
    est.set_params(max_rounds=4, federation=fl.Federation(secure_aggregation=True, **fed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(fd, runtime=runtime or InProcessRuntime(fd))


class Deviating(InProcessRuntime):
    """A server that changes round ``K``'s E-step messages by ``change(client, message)``
    (each client's own copy), after the channel built them."""

    def __init__(self, fd, change, at: int = K, **kw):
        super().__init__(fd, **kw)
        self.change, self.at = change, at

    def call(self, client_ids, method, messages):
        if method == "estep" and any(int(m.get("secagg/round", 0)) == self.at
                                     and m.get("secagg/exchange") == "estep"
                                     for m in messages.values()):
            messages = {c: self.change(c, dict(m)) for c, m in messages.items()}
            self.replies = super().call(client_ids, method, messages)
            return self.replies
        return super().call(client_ids, method, messages)


def _moved(c, msg):
    """One coordinate of the parameters moved by 1e-6 relative: the largest entry of the
    largest parameter."""
    return moved(msg)


def _added_component(c, msg):
    """One more component in every parameter with one row per component (K: the shortest
    vector of more than one entry, the mixing weights)."""
    params = unpack(msg, "params")
    lead = min(np.size(v) for v in params.values() if np.ndim(v) == 1 and np.size(v) > 1)
    for k, v in params.items():
        if np.ndim(v) and np.shape(v)[0] == lead:
            msg[f"params/{k}"] = np.concatenate([v, v[:1]])
    return msg


def _extra_point(c, msg):
    """An extra point (accelerated EM's) the history does not give: the parameters, moved."""
    msg["points"] = 1
    for k, v in unpack(msg, "params").items():
        msg[f"params1/{k}"] = np.asarray(v, dtype=np.float64) * 1.01
    return msg


def _no_transcript(c, msg):
    return {k: v for k, v in msg.items() if not k.startswith("verify/")}


def _other_sum(c, msg):
    """The transcript of a sum with one word changed (the site's own vector left out)."""
    a = np.array(msg["verify/A"], dtype=np.uint64)
    a[0] += np.uint64(12345)
    msg["verify/A"] = a
    return msg


@pytest.mark.parametrize("name", MODELS)
def test_verified_and_unverified_secure_fits_agree(name):
    a, b = _fit(name, verified=True), _fit(name, verified=False)
    assert len(a.history_) == len(b.history_) >= 3
    compared = 0
    for k, v in vars(a).items():
        if k.endswith("_") and isinstance(v, np.ndarray) and v.dtype.kind == "f":
            assert np.allclose(v, vars(b)[k], rtol=1e-10, atol=1e-10, equal_nan=True), k
            compared += 1
    assert compared >= 2


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(("change", "why"), [
    (_moved, r"differs from the replay of the verified aggregate by [0-9.e-]+ at"),
    (_added_component, r"has shape \([\d, ]+\), the setup declared"),
    (_extra_point, r"it asks for extra points \(accelerated EM\), which this site cannot "
                   r"replay"),
    (_no_transcript, r"carries no transcript of the exchange before"),
    (_other_sum, r"is not in the committed sum|is not the sum the tree commits to"),
], ids=["moved-1e-6", "added-component", "extra-point", "no-transcript", "another-sum"])
def test_a_deviating_server_is_refused_at_that_round_by_every_site(name, change, why):
    case, fd = _case(name)
    rt = Deviating(fd, change)
    with pytest.raises(FederatedFitError) as got:
        _fit(name, rt)
    assert str(got.value).startswith(f"round {K}, exchange 'estep': 0 of "), str(got.value)
    assert sorted(rt.replies) == sorted(fd.client_ids)
    for c, reply in rt.replies.items():  # every site, each naming the round and what it refused
        text = reply[ERROR_KEY]
        assert re.match(rf"client {c!r}: round {K} refused: .*({why})", text), (c, text)


def _extra_parameter(c, msg):
    """A parameter the model does not evaluate, added."""
    msg["params/zz_extra"] = np.ones(2)
    return msg


def _dropped_parameter(c, msg):
    """The last parameter (by name) left out."""
    del msg[max(k for k in msg if k.startswith("params/"))]
    return msg


def _retyped_parameter(c, msg):
    """The first parameter (by name) sent as float32 (its values rounded)."""
    k = min(k for k in msg if k.startswith("params/"))
    msg[k] = np.asarray(msg[k], dtype=np.float32)
    return msg


#: a round after steady ones: round 3 is the first with S_hat kept (the initialization round,
#: 2, changes what the site keeps), round 4 the first whose message's fields the site reads by
#: name, as the last one's (verify._sent), and whose aggregate it decodes by its kept span
STEADY = 5


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(("change", "why"), [
    (_moved, r"differs from the replay of the verified aggregate by [0-9.e-]+ at"),
    (_extra_parameter, r"parameter 'zz_extra' of shape \(2,\) is not one the model evaluates"),
    (_dropped_parameter, r"its parameters lacks '\w+', unlike the server's replayed M-step"),
    (_retyped_parameter, r"differs from the replay of the verified aggregate by [0-9.e-]+ at"),
], ids=["moved-1e-6", "extra-parameter", "dropped-parameter", "float32-parameter"])
def test_a_parameter_changed_after_steady_rounds_is_refused_by_every_site(name, change, why):
    """What a steady round keeps to read a message faster (its fields, the aggregate's
    layout) serves no message that differs: a parameter moved, added, dropped or retyped in
    round STEADY is refused by every site, as in round K."""
    case, fd = _case(name)
    rt = Deviating(fd, change, at=STEADY)
    est = case.make()
    est.set_params(**{k: v for k, v in (("n_init", 1), ("tol", 0.0)) if k in est.get_params()})
    est.set_params(max_rounds=STEADY + 1, federation=fl.Federation(secure_aggregation=True))
    with warnings.catch_warnings(), pytest.raises(FederatedFitError) as got:
        warnings.simplefilter("ignore")
        est.fit(fd, runtime=rt)
    assert str(got.value).startswith(f"round {STEADY}, exchange 'estep': 0 of "), str(got.value)
    assert sorted(rt.replies) == sorted(fd.client_ids)
    for c, reply in rt.replies.items():
        assert re.match(rf"client {c!r}: round {STEADY} refused: .*({why})",
                        reply[ERROR_KEY]), (c, reply[ERROR_KEY])


@pytest.mark.parametrize("change", [_moved, _extra_point, _no_transcript],
                         ids=["moved", "extra-point", "no-transcript"])
def test_the_same_server_is_answered_with_verification_off(change):
    """The positive control of the tests above: the deviation passes unverified (each test
    fails on code that does not verify)."""
    case, fd = _case("gmm")
    est = _fit("gmm", Deviating(fd, change), verified=False)
    assert len(est.history_) == 4


def test_a_site_refuses_to_reveal_when_a_neighbour_was_shown_another_transcript():
    """Equivocation: each site binds the digest of the transcript it verified into the
    exchange's pair keystreams (SecAggClient.bind_digest); a neighbour shown another one
    computes other tokens, so its confirmation is refused and nothing is revealed, while
    neighbours shown the same transcript reveal as before."""
    from fedlatent.engine.secagg import FixedPoint, SecAggConfig, SecureAggregationError, setup

    ids = [f"c{i}" for i in range(5)]
    server, clients = setup(ids, SecAggConfig(3, FixedPoint(scale=2.0**20, bound=100.0),
                                              slots=2), run="equivocation")
    P = server.announce(1, "e", ids)
    for c in ids:  # c4 is shown another transcript than the others
        clients[c].bind_digest(1, "e", (b"\x02" if c == "c4" else b"\x01") * 32)
        clients[c].mask({"s": np.ones(3)}, 1, "e", P, slot=server.slot)
    words = {c: clients[c].consistency(1, "e", ids, [])["confirm"].view("<u8") for c in ids}

    def relayed(holder):
        return np.array([words[o][ids.index(holder)] for o in ids if o != holder], np.uint64)

    with pytest.raises(SecureAggregationError, match="'c4' did not confirm 'c0' as a survivor.*"
                       r"or showed them different transcripts of the exchange before \(or, "
                       r"in a verified fit, told them different setups, units or seeds\); "
                       "refusing to reveal anything"):
        clients["c0"].reveal(1, "e", confirmations=relayed("c0"))
    with pytest.raises(SecureAggregationError, match="'c0' did not confirm 'c4'"):
        clients["c4"].reveal(1, "e", confirmations=relayed("c4"))
    # the same transcript everywhere: every confirmation holds
    server, clients = setup(ids, SecAggConfig(3, FixedPoint(scale=2.0**20, bound=100.0),
                                              slots=2), run="same")
    P = server.announce(1, "e", ids)
    for c in ids:
        clients[c].bind_digest(1, "e", b"\x01" * 32)
        clients[c].mask({"s": np.ones(3)}, 1, "e", P, slot=server.slot)
    words = {c: clients[c].consistency(1, "e", ids, [])["confirm"].view("<u8") for c in ids}
    assert "self" in clients["c0"].reveal(1, "e", confirmations=relayed("c0"))


@pytest.mark.parametrize("name", MODELS)
def test_sites_with_their_own_policy_replay_the_start_and_every_round(name):
    """A site with the library's default policy (no public starts) replays the start from
    the committed seed and the start's verified sums, then every round: the fit runs, the
    same as the simulation's."""
    from fedlatent.engine.site.policy import SitePolicy

    case, fd = _case(name)
    own = _fit(name, InProcessRuntime(fd, policies=SitePolicy()))
    ref = _fit(name)
    assert len(own.history_) == len(ref.history_)
    for k, v in vars(ref).items():
        if k.endswith("_") and isinstance(v, np.ndarray) and v.dtype.kind == "f":
            assert np.allclose(vars(own)[k], v, rtol=1e-10, atol=1e-10, equal_nan=True), k


def test_an_analyst_start_is_refused_unless_the_policy_allows_public_starts():
    from fedlatent.engine.site.policy import SitePolicy

    case, fd = _case("gmm")
    est = case.make()
    means = np.zeros((est.n_components, fd.n_features))
    means[:, 0] = np.arange(est.n_components)
    fed = fl.Federation(secure_aggregation=True)
    with pytest.raises(FederatedFitError) as got, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.set_params(means_init=means, federation=fed, max_rounds=3)
        est.fit(fd, runtime=InProcessRuntime(fd, policies=SitePolicy()))
    assert re.search(r"client 'c\d+': round 1 refused: .*public-starts = true", str(got.value))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(fd, runtime=InProcessRuntime(fd, policies=SitePolicy(public_starts=True)))
    assert len(est.history_) == 3


def test_a_verifying_site_refuses_an_exchange_outside_secure_aggregation():
    case, fd = _case("gmm")
    rt = InProcessRuntime(fd)
    model = case.make()
    node = rt.nodes[fd.client_ids[0]]
    setup = {"model": "gmm", "model_config": "{}", "verify": '{"federation": {}}'}
    node.state["verify/on"] = np.array(1.0)
    reply = node.handle("estep", {"round": 2, "seed": 0, **pack("params", {})})
    assert "round 2 refused: the setup set up verified rounds, and this 'estep' is not a " \
        "secure exchange" in reply[ERROR_KEY]
    del model, setup


def test_verification_is_on_by_default_under_secure_aggregation_where_sites_can_replay():
    assert fl.Federation(secure_aggregation=True).verifies
    assert not fl.Federation().verifies  # (a site's aggregate needs the others' replies)
    assert not fl.Federation(secure_aggregation=True, verified=False).verifies
    assert not fl.Federation(secure_aggregation=True, participation=0.5).verifies
    with pytest.raises(ValueError, match=r"Federation\(verified=True\): the sites cannot replay "
                                         r"participation=0.5 \(a site that missed an exchange"):
        fl.Federation(secure_aggregation=True, participation=0.5, verified=True).validate()
    with pytest.raises(ValueError, match=r"verified=True\) needs secure_aggregation=True"):
        fl.Federation(verified=True).validate()


def test_sec_is_refused_under_verification_with_the_reason():
    case, fd = _case("sec")
    est = case.make()
    est.set_params(federation=fl.Federation(secure_aggregation=True, verified=True))
    with pytest.raises(ValueError, match=r"SEC refuses Federation\(secure_aggregation=True\): "
                                         r"SEC's replies are fitted local models and per-pair "
                                         r"losses, not sums"):
        est.fit(fd)


def test_a_dp_or_verified_site_admits_a_verified_secure_fit_without_dp():
    """The example policy's ``[privacy] required = "dp-or-verified"``: a verified secure fit is
    answered without DP, the same fit with verification off is refused at its setup."""
    from fedlatent.engine.site.policy import SitePolicy

    case, fd = _case("gmm")
    policy = SitePolicy(privacy_required=True, verified_suffices=True)
    est = _fit("gmm", InProcessRuntime(fd, policies=policy))
    assert len(est.history_) == 4
    with pytest.raises(FederatedFitError, match=r"\(privacy.required\): the fit is not "
                                                r"differentially private"):
        _fit("gmm", InProcessRuntime(fd, policies=policy), verified=False)


@pytest.mark.parametrize("name", MODELS)
def test_a_crafted_start_is_refused_by_every_site_at_round_1(name):
    """The start moved by 1e-6 (one coordinate): sites with their own policy (no public
    starts) replay the start from its verified sums and the committed seed, and refuse it."""
    from fedlatent.engine.site.policy import SitePolicy

    case, fd = _case(name)
    rt = Deviating(fd, _moved, at=1, policies=SitePolicy())
    with pytest.raises(FederatedFitError):
        _fit(name, rt)
    assert sorted(rt.replies) == sorted(fd.client_ids)
    for c, reply in rt.replies.items():
        assert re.match(rf"client {c!r}: round 1 refused: .*differs from the replay",
                        reply[ERROR_KEY]), (c, reply[ERROR_KEY])


def test_a_secure_fit_the_sites_cannot_replay_says_so_once_at_setup(caplog):
    """Secure aggregation that runs unverified (participation below 1, or verified=False) is
    named at setup with the reason; a verified one is silent."""
    with caplog.at_level("WARNING", logger="fedlatent.engine.rounds.fitsetup"):
        _fit("gmm", participation=1.0)
    assert not [r for r in caplog.records if "without verified rounds" in r.getMessage()]
    for fed, why in (({"verified": False}, "verification turned off"),
                     ({"participation": 0.8}, "participation=0.8 (a site that missed")):
        caplog.clear()
        with caplog.at_level("WARNING", logger="fedlatent.engine.rounds.fitsetup"):
            _fit("gmm", **fed)
        said = [r.getMessage() for r in caplog.records
                if "without verified rounds" in r.getMessage()]
        assert len(said) == 1 and why in said[0], said
        assert "trust it with the parameters they evaluate" in said[0]
