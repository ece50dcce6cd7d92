"""A masked reply's fields written flat in one pass (``steps.reply_fields``) are the products of
the definition, field by field: ``w_c`` times an E-step's statistic, ``1 / N`` times every other
numeric field, an E-step's objectives times ``1 / N`` in two limbs; text fields left out."""

import numpy as np
import pytest

from fedlatent.engine.protocol.messages import objective_field, statistic_field
from fedlatent.engine.secagg.encoding import Layout
from fedlatent.engine.secagg.steps import _LIMB, reply_fields
from tolerance import assert_same


def by_field(reply: dict, estep: bool, w: float, unit: float):
    """The definition, one field at a time (the layout and the flat vector)."""
    fields = {}
    for k, v in reply.items():
        if isinstance(v, str):
            continue
        a = np.asarray(v, dtype=np.float64)
        a = a.reshape(1) if a.ndim == 0 else a
        fields[k] = a * (w if estep and statistic_field(k) else unit)
    for k in [k for k in fields if estep and objective_field(k)]:
        o = fields.pop(k)
        hi = np.floor(o / _LIMB)
        fields[k + "/hi"], fields[k + "/lo"] = hi, o - hi * _LIMB
    layout = Layout.of(fields)
    return layout, layout.flatten(fields, np.float64)


@pytest.mark.parametrize("estep", [True, False])
def test_the_flat_fields_are_the_definitions_products_bit_for_bit(estep):
    rng = np.random.default_rng(7)
    odd = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e300, -1e-300]
    with np.errstate(invalid="ignore"):
        for t in range(400):
            objective = odd[t] if t < len(odd) else -abs(rng.normal()) * 10.0 ** rng.integers(0, 9)
            reply = {"delta/means": rng.normal(size=(3, 4)) * 10.0 ** rng.integers(-5, 5),
                     "delta/w": rng.random(3), "n": float(rng.integers(1, 500)),
                     "objective": objective, "point1/x": rng.normal(size=2), "note": "text",
                     "objective2": np.array([rng.normal() * 1e6]), "z!": rng.normal(size=(2, 2)),
                     "objective3": rng.normal(size=(2, 1))}
            w, unit = float(rng.random()), 1.0 / float(rng.integers(1000, 10**6))
            layout, x = by_field(reply, estep, w, unit)
            got = reply_fields(reply, estep, w, unit)
            assert got.layout == layout
            # exact: the same IEEE products and limbs, only written in another order
            assert_same(got.x.view(np.uint64), x.view(np.uint64), err_msg=str(objective))
