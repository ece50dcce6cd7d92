"""The one checked protocol: replies are validated, a missing or invalid client is named."""

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine import FederatedFitError, InProcessRuntime, Runtime
from fedlatent.engine.contract.params import Integer, Options, Real, validate_params
from fedlatent.engine.protocol.exchange import array, ask, number
from fedlatent.engine.protocol.messages import ClientReplyError, check_fields


class Canned(Runtime):
    """Replies given in advance (None: the client does not answer)."""

    def __init__(self, replies):
        self.replies = replies

    @property
    def client_ids(self):
        return sorted(self.replies)

    def call(self, client_ids, method, messages):
        return {c: self.replies[c] for c in client_ids if self.replies[c] is not None}


GOOD = {"n": 3, "sx": np.ones(2)}
EXPECT = {"n": number(low=1), "sx": array(2)}


def test_all_good_replies_pass_through():
    r = ask(Canned({"a": GOOD, "b": GOOD}), "query", {}, what="moments", expect=EXPECT)
    assert sorted(r) == ["a", "b"] and r.faults == {}


@pytest.mark.parametrize(
    "bad, reason",
    [
        (None, "no reply"),
        ({"n": 3}, r"missing value\(s\) \['sx'\]"),
        ({"n": 3, "sx": np.ones(3)}, r"'sx' has shape \(3,\), expected \(2,\)"),
        ({"n": 3, "sx": np.array([1.0, np.nan])}, "'sx' has non-finite values"),
        ({"n": -1, "sx": np.ones(2)}, "'n' has values below 1"),
        ({"n": float("inf"), "sx": np.ones(2)}, "'n' is not finite"),
        ({"n": "three", "sx": np.ones(2)}, "'n' is not a number"),
    ],
)
def test_a_bad_client_stops_a_required_exchange_naming_it(bad, reason):
    rt = Canned({"a": GOOD, "b": bad})
    with pytest.raises(FederatedFitError, match=f"^moments: client 'b': (value )?{reason}"):
        ask(rt, "query", {}, what="moments", expect=EXPECT)


def test_a_bad_client_is_left_out_and_recorded_when_not_required():
    rt = Canned({"a": GOOD, "b": {"n": 3, "sx": np.full(2, np.inf)}, "c": None})
    r = ask(rt, "query", {}, what="scoring", expect=EXPECT, required=False)
    assert sorted(r) == ["a"]
    assert r.faults == {"b": "value 'sx' has non-finite values", "c": "no reply"}


@pytest.mark.usefixtures("saturation_rule_off")
def test_free_dimensions_and_per_client_messages():
    check_fields("a", {"c": np.zeros((0, 3))}, {"c": array(None, 3)})
    with pytest.raises(ClientReplyError, match=r"expected \('any', 3\)"):
        check_fields("a", {"c": np.zeros((2, 4))}, {"c": array(None, 3)})
    fd = fl.FederatedDataset.from_arrays({"x": np.ones((3, 1)), "y": np.ones((4, 1))})
    rt = InProcessRuntime(fd, record=True)
    ask(rt, "setup", {"x": {"model": "gmm", "model_config": '{"n_components": 1}'}},
        what="setup", per_client=True, expect={"n_units": number(low=1)})
    assert [(d, c, m) for d, c, m, _ in rt.log] == [("down", "x", "setup"), ("up", "x", "setup")]


def test_declarative_parameter_checks():
    table = {"k": [Integer(1)], "tol": [Real(0)], "kind": [Options("a", "b")],
             "w": [None, "array-like"], "seed": ["random_state"]}
    validate_params({"k": 2, "tol": 0.0, "kind": "a", "w": None, "seed": 3}, table)
    for params, msg in [
        ({"k": 0}, "k must be an integer >= 1, got 0"),
        ({"k": True}, "k must be an integer >= 1, got True"),
        ({"tol": -1e-9}, "tol must be >= 0, got -1e-09"),
        ({"tol": float("nan")}, "tol must be >= 0, got nan"),
        ({"kind": "c"}, "kind must be 'a' or 'b', got 'c'"),
        ({"w": [1.0, np.nan]}, r"w must be None or an array of finite numbers"),
        ({"seed": -1}, "seed must be None, an integer or a numpy Generator, got -1"),
    ]:
        with pytest.raises(ValueError, match=msg):
            validate_params(params, table)
