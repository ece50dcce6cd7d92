"""Declared is evaluated: a node evaluates only parameters of the shapes its setup declared.

A deviating server chooses the parameters each site evaluates. The setup message declares the
model's configuration (its components, features, learners), and the site's disclosure rules
count the numbers a reply of *that* configuration carries (the saturation rule,
:meth:`~fedlatent.engine.contract.model.FederatedModel.reply_numbers`). A round carrying more
components than declared would be answered with more numbers than were counted: a setup of 2
components followed by rounds of 101 "probe" components gave a site's 200 records back in 11
rounds (issue 38). So every round's parameters, and each extra point's, are checked here
against :meth:`~fedlatent.engine.contract.model.FederatedModel.evaluated_shapes` before any
statistic is computed, with or without secure aggregation:

- an array the model declares must have exactly the declared shape;
- an array it does not declare is refused (a scalar, shape ``()`` or ``(1,)`` as some transports
  carry it, such as a step counter or a noise scale, adds no component, feature or learner and
  is let through);
- a model that does not declare its shapes cannot be evaluated at all (fail closed).

This bounds the *shape* of what a site evaluates, not its values: crafted values of the
declared shape (sharp components) are what verified rounds refuse.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedlatent.engine.protocol.messages import unpack

__all__ = ["DeclaredShapeError", "check_message", "check_round", "shape_problem"]


class DeclaredShapeError(ValueError):
    """A round's parameters have another shape than the setup declared (a deviating server)."""


def shape_problem(declared: dict[str, tuple[int, ...]], params: dict[str, Any]) -> str | None:
    """Why ``params`` do not have the ``declared`` shapes (None: they do): the first parameter
    whose shape differs, or that is an array the model does not declare."""
    for name in sorted(params):
        shape = tuple(np.shape(params[name]))
        want = declared.get(name)
        if want is None and shape not in ((), (1,)):  # (a scalar may cross as (1,))
            return (f"parameter {name!r} of shape {shape} is not one the model evaluates "
                    f"(it declares {sorted(declared)})")
        if want is not None and shape != tuple(want):
            return f"parameter {name!r} has shape {shape}, the setup declared {tuple(want)}"
    return None


def check_round(model, data, msg: dict[str, Any], client: str, what: str = "round") -> None:
    """Raise :class:`DeclaredShapeError` naming the client, the round, the point and the
    parameter when the parameters of ``msg`` (``params/`` and each extra point's
    ``params{j}/``, ``j = 1..msg["points"]``) differ in shape from what ``model`` declares
    for ``data``, or when the model declares nothing."""
    rnd = msg.get("round", "?")
    try:
        declared = {k: tuple(int(n) for n in v) for k, v in model.evaluated_shapes(data).items()}
    except NotImplementedError as err:
        raise DeclaredShapeError(f"client {client!r}: {what} {rnd} refused: {err}; a site "
                                 "evaluates only parameters whose shapes its model declares"
                                 ) from None
    m = max(int(msg.get("points", 0) or 0), 0)
    for j, prefix in enumerate(["params"] + [f"params{j}" for j in range(1, m + 1)]):
        why = shape_problem(declared, unpack(msg, prefix))
        if why:
            point = "" if j == 0 else f", extra point {j},"
            raise DeclaredShapeError(
                f"client {client!r}: {what} {rnd}{point} refused: {why} (model "
                f"{model.name!r}: a server may send only parameters of the configuration the "
                "setup declared, which the disclosure rules counted)")


def check_message(node, msg: dict[str, Any]) -> None:
    """:func:`check_round` of the node's round message ``msg``, unless a verified round checked
    this very message (``node.shapes_checked``, set by
    :func:`~fedlatent.engine.node.verify.check_exchange` once it took every parameter, each
    point's too, to be the replay's of its own statistics' shapes, or checked a start's
    against the declaration): read once, and matched by identity, so nothing a server sends
    can set it."""
    checked, node.shapes_checked = node.shapes_checked, None
    if checked is not msg:
        check_round(node.model, node._data, msg, node.client_id)
