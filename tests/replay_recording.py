"""One in-process example fit with every message recorded, rebuilt as a site would see it (for
the replay tests: tests/engine/test_replay.py, test_replay_draws.py)."""

from __future__ import annotations

import json
import warnings

import fedlatent as fl
from fedlatent.engine.contract import registry
from fedlatent.engine.fedem.update import client_weights
from fedlatent.engine.transport.inprocess import InProcessRuntime


def recorded(name: str, *, one_start: bool = False, **params):
    """``name``'s example fit with ``params`` (``one_start``: ``n_init=1`` where the estimator
    has it, so every round continues the one before): the model, the client weights, the total
    units, and per round its message and the clients' replies (the last start's or chain's)."""
    case = registry.estimator_entries()[name].load_example().case()
    fd = case.data()
    rt = InProcessRuntime(fd, record=True)
    est = case.make()
    if one_start and "n_init" in est.get_params():
        est.set_params(n_init=1)
    est.set_params(**params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(fd, runtime=rt)
    down = [(c, m) for d, c, meth, m in rt.log if d == "down" and meth == "estep"]
    up = [(c, m) for d, c, meth, m in rt.log if d == "up" and meth == "estep"]
    msgs: dict[int, dict] = {}
    ups: dict[int, dict] = {}
    for (c, m), (c2, reply) in zip(down, up, strict=True):
        assert c == c2
        k = int(m["round"])
        if msgs and k < max(msgs):  # another start or chain: keep the last one's rounds
            msgs, ups = {}, {}
        msgs.setdefault(k, m)
        ups.setdefault(k, {})[c] = reply
    setup = next(m for d, c, meth, m in rt.log if d == "down" and meth == "setup")
    model = registry.model_from_config(setup["model"], json.loads(setup["model_config"]))
    units = {c: float(m["n_units"]) for d, c, meth, m in rt.log if d == "up" and meth == "setup"}
    fed = est.federation if getattr(est, "federation", None) is not None else fl.Federation()
    return model, client_weights(fed, units), sum(units.values()), msgs, ups
