"""A verifying site's steady rounds on cached inputs (issue 38's cost): what it keeps between
rounds to check a round in fewer steps (the message's field names, the binding's bytes, the
settings compared by type and value first) is never served for another input: a field
changed, added or retyped in a later round is refused as on the first, and a binding input
replaced gives another binding."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.fedem.update import round_message
from fedlatent.engine.node.verify_fields import bound, fields_of, round_refusal, scale_refusal
from tolerance import assert_same

FED = fl.Federation(secure_aggregation=True)
SEED, WHO = 7, "client 'c0': round 4 refused"


def _steady(rnd: int) -> dict:
    """An honest steady E-step message of round ``rnd`` (its settings, its scale, the fields
    a verified round carries)."""
    msg = round_message(FED, SEED, rnd, False, FED.alpha_for({}))
    msg.update({"params/weights": np.ones(3) / 3, "secagg/slot": rnd, "secagg/round": rnd,
                "secagg/exchange": "estep", "secagg/unit": 1 / 4000, "secagg/weight": 0.05,
                "verify/A": np.zeros(8, np.uint8), "verify/path": np.zeros(8, np.uint8)})
    return msg


def _node(units=(4000.0, 20.0), seed=b"7"):
    state = {"verify/setup": np.frombuffer(bytes(range(32)), np.uint8).copy(),
             "verify/units": np.array(units), "verify/seed": np.frombuffer(seed, np.uint8)}
    model = SimpleNamespace(n_units=lambda data: 200)
    return SimpleNamespace(state=state, model=model, _data=None)


def _refusal(msg: dict, rnd: int = 4) -> str | None:
    return round_refusal(None, FED, msg, rnd, SEED, False, WHO)


#: a later round's change -> words of its refusal (values of another type that == the
#: honest one, moved values, other kinds: each declined by the type-and-value comparison and
#: refused by the full one)
LATER = {
    "control_variates as 1": ({"control_variates": 1}, "'control_variates' is 1"),
    "mode other": ({"mode": "batch"}, "'mode' is 'batch'"),
    "alpha as a list": ({"alpha": [1.0, 1.0]}, "'alpha' is [1.0, 1.0]"),
    "alpha moved": ({"alpha": 1.0 + 1e-9}, "'alpha' is 1.000000001"),
    "quant_levels as True": ({"quant_levels": True}, "'quant_levels' is True"),
    "seed another": ({"seed": SEED + 1}, "'seed' is 8"),
    "seed as a float": ({"seed": SEED + 0.5}, "'seed' is 7.5"),
    "round another": ({"round": 5}, "'round' (5)"),
    "batch_size added": ({"batch_size": 1}, "'batch_size'"),
    "V_reset added": ({"V_reset/nk": np.zeros(3)}, "V_reset"),
}


@pytest.mark.parametrize("name", LATER)
def test_a_field_changed_in_a_later_round_is_refused_after_steady_rounds(name):
    """Three honest rounds fill the caches (the message's field names, of the same tuple as
    the changed one's where no field is added); the fourth round's change is refused naming
    the field, as it is without any round before (a fresh cache)."""
    change, words = LATER[name]
    for rnd in (1, 2, 3):
        assert _refusal(_steady(rnd), rnd) is None
    changed = {**_steady(4), **change}
    why = _refusal(changed)
    assert why is not None and words in why, why
    fields_of.cache_clear()
    assert _refusal(changed) == why  # (the same words without the cache)


def test_what_the_first_comparison_accepts_the_full_one_accepts():
    """``_exact`` (type and value) accepts nothing ``_judged`` (the full comparison) refuses,
    over settings of every kind and values of other types that compare equal."""
    from fedlatent.engine.node.verify_fields import _exact, _judged

    wants = [True, False, "full", "batch", 0, 1, 7, 2 ** 53, 2 ** 53 + 1, -(2 ** 60), 0.0,
             -0.0, 1.0, 0.5, 1e300, float("nan"), float("inf")]
    gots = wants + [np.float64(1.0), np.int64(7), np.bool_(True), 1 + 0j, "1.0", None,
                    [1.0], np.array(1.0), np.array([7]), 1.0 + 1e-15]
    accepted = 0
    for want in wants:
        for got in gots:
            if _exact(got, want):
                accepted += 1
                assert _judged(got, want), (got, want)
    # each want by itself but NaN, 2^53 + 1 and -2^60 (no float holds them), and 0.0, -0.0
    # each other's (== and _judged alike)
    assert accepted == len(wants) - 3 + 2


def test_the_honest_steady_message_passes_and_its_field_names_are_read_once():
    fields_of.cache_clear()
    for rnd in (2, 3, 4, 5):
        assert _refusal(_steady(rnd), rnd) is None
    info = fields_of.cache_info()
    assert (info.misses, info.hits) == (1, 3)
    f = fields_of(tuple(_steady(2)))
    assert not any(k.startswith("verify/") for k in f.kept) and len(f.kept) == len(
        _steady(2)) - 2
    assert (f.reset, f.shown, f.secure, f.extra) == (False, False, True, ())


def test_the_same_field_names_in_another_order_keep_the_messages_order():
    msg = _steady(3)
    other = dict(reversed(list(msg.items())))
    assert fields_of(tuple(other)).kept == tuple(k for k in other if not k.startswith("verify"))
    assert fields_of(tuple(msg)).kept == tuple(k for k in msg if not k.startswith("verify"))


@pytest.mark.parametrize("key, value", [("secagg/unit", 2 / 4000), ("secagg/weight", 0.0),
                                        ("secagg/weight", 0.1), ("secagg/unit", None)])
def test_a_scale_changed_in_a_later_round_is_refused(key, value):
    node = _node()
    for rnd in (2, 3):
        assert scale_refusal(node, _steady(rnd), "estep", (4000.0, 20.0), "samples",
                             WHO) is None
    why = scale_refusal(node, {**_steady(4), key: value}, "estep", (4000.0, 20.0), "samples",
                        WHO)
    assert why is not None and f"its {key!r} is {value!r}" in why


def _bound_by_hand(node, digest: bytes) -> bytes:
    """The binding as documented: tag, digest, then each input's length and bytes."""
    parts = [b"fedlatent/verify/bound\x00", digest]
    for k in ("verify/setup", "verify/units", "verify/seed"):
        raw = b"" if k not in node.state else np.ascontiguousarray(node.state[k]).tobytes()
        parts += [len(raw).to_bytes(4, "little"), raw]
    return hashlib.sha256(b"".join(parts)).digest()


def test_the_binding_follows_every_input_replaced_between_rounds():
    node, digest = _node(), bytes(range(1, 33))
    first = bound(node, digest)
    assert first == _bound_by_hand(node, digest) == bound(node, digest)
    for key, value in [("verify/units", np.array([8000.0, 20.0])),
                       ("verify/seed", np.frombuffer(b"8", np.uint8)),
                       ("verify/setup", np.frombuffer(bytes(32), np.uint8))]:
        before = bound(node, digest)
        node.state[key] = value
        after = bound(node, digest)
        assert after != before and after == _bound_by_hand(node, digest), key
    node.state.pop("verify/seed")
    assert bound(node, digest) == _bound_by_hand(node, digest)
    assert bound(node, bytes(32)) == _bound_by_hand(node, bytes(32)) != bound(node, digest)


def test_the_bindings_inputs_a_site_keeps_cannot_be_written_in_place():
    """The binding's bytes are kept by the arrays' identity: the arrays the site stores
    (units, seed, setup) are read-only, so none can change under the same identity."""
    from fedlatent.engine.node.verify import _frozen

    a = _frozen(np.array([4000.0, 20.0]))
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 8000.0


# ---- the steady round's decode of the aggregate (verify._delta) --------------------------------
SCALE = 2.0 ** 20
#: the kept S_hat of a GMM site (K = 3, d = 2), in the order the site keeps it
S_HAT = {"nk": (3,), "sx": (3, 2), "sxx": (3, 2, 2)}


def _kept_node():
    """A node keeping parameters, ``S_hat`` and ``V`` (one packed vector) and the encoding's
    scale, as a verifying site does after the initialization round."""
    from fedlatent.engine.node.verify_kept import store

    node = SimpleNamespace(state={}, secagg=SimpleNamespace(config=SimpleNamespace(
        encoding=SimpleNamespace(scale=SCALE))))
    S = {k: np.ones(s) for k, s in S_HAT.items()}
    store(node, {"params": {"weights": np.ones(3) / 3}, "S_hat": S, "V": S})
    return node


def _sum(shapes: tuple, seed: int) -> np.ndarray:
    """Ring words of a sum of the layout ``shapes`` (signed values, negative ones wrapped)."""
    m = sum(int(np.prod(s)) for _, s in shapes)
    return np.random.default_rng(seed).integers(-2 ** 40, 2 ** 40, m).view(np.uint64)


def _by_field(words: np.ndarray, shapes: tuple) -> np.ndarray:
    """The S_hat fields' int64 words in the full layout (every field, then S_hat's picked in
    its order)."""
    from fedlatent.engine.secagg.encoding import Layout

    fields = Layout.of_shapes(shapes).unflatten(words.view(np.int64))
    return np.concatenate([fields["delta/" + k].ravel() for k in S_HAT])


#: layouts of a round's sum: the site's own reply's (sorted names: delta/ first), one with a
#: field before them, one whose S_hat fields come in another order, one without one of them
PLAIN = tuple(("delta/" + k, s) for k, s in S_HAT.items()) + (("n", (1,)), ("objective", (1,)))
SHIFTED = (("a", (5,)),) + PLAIN
SWAPPED = (PLAIN[1], PLAIN[0], *PLAIN[2:])
SHORT = PLAIN[1:]


def test_the_steady_decode_is_the_full_decodes_for_every_layout_in_turn():
    """The aggregate's S_hat fields taken as one run of words (the steady rounds': the flat
    step decodes them, as the encoding does, test_replay_flat) are the full layout's words of
    those fields in S_hat's order, and where they lie is found
    again for each other layout (kept by plan and layout: a span found for one layout is
    never used for another), a field missing giving None (the general replay)."""
    from fedlatent.engine.node.verify import _delta
    from fedlatent.engine.node.verify_kept import plan

    node = _kept_node()
    at = plan(node)
    for i, shapes in enumerate([PLAIN, PLAIN, SHIFTED, SWAPPED, PLAIN, SHIFTED]):
        words = _sum(shapes, i)
        # word for word: the S_hat fields' words, in S_hat's order
        assert_same(_delta(at, words, shapes), _by_field(words, shapes), err_msg=str(i))
    assert _delta(at, _sum(SHORT, 9), SHORT) is None
