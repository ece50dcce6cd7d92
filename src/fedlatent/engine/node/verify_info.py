"""The information pass after a verified fit, at a site: standard errors at parameters the site
checked (issue 38).

After a fit with verified rounds (:mod:`~fedlatent.engine.node.verify`) the server asks each
site for its observed information (the ``"information"`` query of
:mod:`fedlatent.engine.estimation.inference`) through the fit's own secure channel, as one
more exchange. Its message shows the transcript of the fit's last exchange, as a round's
would; :func:`~fedlatent.engine.node.verify.check_exchange` checks it (the site's own leaf
in the sum, the roster's tree) and hands the decoded aggregate to :func:`after_rounds`,
which

1. replays the server's final step from it: the FedEM update of the last round and the
   model's M-step (:func:`~fedlatent.engine.node.replay.replay`, the replay the rounds use;
   after a discarded last round, the parameters that round evaluated);
2. answers only if the parameters asked are those, within
   :data:`~fedlatent.engine.node.replay.REPLAY_RTOL` of each parameter's largest entry, and
   the message asks nothing but them; otherwise it refuses naming the parameter, the
   largest difference and the fix;
3. keeps the verified parameters: a later information query of the same fit (its
   transcript, that of the information exchange, checked the same way) is answered only at
   them.

Any other query after the rounds is refused, as before: the site cannot replay it.

Accelerated fits: SQUAREM ends on the last round's plain EM step, which is what is replayed
(so does subspace Newton for a model whose clients keep a state, FedGMM); subspace Newton
otherwise ends on ``F`` of the best point it evaluated, which is the statistic the next round
would be sent (:func:`~fedlatent.engine.node.verify_points.accelerated_state`, replayed)
unless an earlier round evaluated a better point than every point of the last: the site does
not keep that one, and refuses (named as any other difference).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedlatent.engine.node.verify_kept import fedem_step, groups, units
from fedlatent.engine.node.verify_kept import num as _num
from fedlatent.engine.protocol.messages import unpack

__all__ = ["INFORMATION", "after_rounds"]

#: the query name (``fedlatent.engine.estimation.inference.INFORMATION_QUERY``: the client
#: side does not import the estimators)
INFORMATION = "information"
_FINAL = "verify/final/"
#: the fields an information query carries besides its parameters
_ASKED = ("query", "seed", "round")


def after_rounds(node, msg: dict[str, Any], total: dict | None, who: str) -> str | None:
    """Why ``node`` refuses ``msg``, a query after the fit's rounds whose transcript was
    checked (``total``: the decoded aggregate it shows; None: that exchange was discarded, or
    it was the information exchange), or None: its parameters are the verified ones."""
    if str(msg.get("query", "")) != INFORMATION:
        return f"{who}: a query after the rounds began cannot be replayed by this site"
    extra = sorted(k for k in msg if not k.startswith(("params/", "secagg/")) and k not in _ASKED)
    if extra:
        return (f"{who}: the information query carries {', '.join(map(repr, extra[:10]))}, "
                "which it does not take (only the parameters to evaluate it at)")
    k = _num(node.state["verify/round"])
    if bytes(node.state["verify/last"]).decode() == "estep":
        final = _final_params(node, total)
        for name in [name for name in node.state if name.startswith(_FINAL)]:
            del node.state[name]
        node.state.update({_FINAL + n: np.asarray(v) for n, v in final.items()})
        node.state["verify/last"] = np.frombuffer(INFORMATION.encode(), np.uint8).copy()
    final = {n[len(_FINAL):]: np.asarray(v) for n, v in node.state.items()
             if n.startswith(_FINAL)}
    return _refusal(unpack(msg, "params"), final, k, node.client_id)


def _final_params(node, total: dict | None) -> dict[str, np.ndarray]:
    """The parameters the server's step after the last verified round gives: the FedEM update
    of ``total`` (that round's decoded aggregate) and the model's M-step; the parameters the
    last round evaluated when its aggregate was discarded (``total`` None)."""
    import json

    from fedlatent.engine.fedem.federation import Federation

    kept = groups(node)
    prev = kept["params"]
    if total is None:
        return prev
    fed = Federation.from_config(json.loads(
        bytes(node.state["verify/federation"]).decode())["federation"])
    n_total = units(node)[0]
    state, new, k_prev = fedem_step(node, fed, kept, total)  # (the round's own update)
    if state.S_hat is not None and _ends_on_best(node, fed):  # the accelerator's next state
        from fedlatent.engine.node.verify_points import accelerated_state

        new = accelerated_state(node, fed, state, new, prev, total, k_prev, n_total)[1]
    return node.model.inference_params(new.S_hat, prev, n_total)  # (the server's M-step)


def _ends_on_best(node, fed) -> bool:
    """Whether the fit ends on the accelerator's best point rather than its last plain step:
    subspace Newton without client states (its best is, but for a rare path, the point the
    next round would be sent, which the site replays)."""
    from fedlatent.engine.fedem.acceleration import SubspaceNewton, resolve_acceleration

    return isinstance(resolve_acceleration(fed.acceleration), SubspaceNewton) and not bool(
        getattr(node.model, "point_state", False))


def _refusal(sent: dict, final: dict, k: int, client: str) -> str | None:
    """Why the information query's parameters ``sent`` are not the verified ``final`` ones
    (None: each is, within the replay's tolerance), naming the fix."""
    from fedlatent.engine.node.replay import params_refusal

    fix = ("; fix: ask the information at the fitted parameters, those the verified aggregate "
           f"of round {k} gives (the fitted estimator's summary() and cov_params() do)")
    unknown = sorted(set(sent) - set(final))
    if unknown or not sent:
        what = (f"carries {', '.join(map(repr, unknown[:10]))}, which the fit's M-step does "
                "not give" if unknown else "carries no parameters")
        return f"client {client!r}: the information query after round {k} refused: it {what}{fix}"
    why = params_refusal(sent, {n: final[n] for n in sent}, k, client)
    if why is None:
        return None
    why = why.replace(f"round {k} refused", f"the information query after round {k} refused", 1)
    return why.replace("from the replay of the verified aggregate",
                       f"from the replay of round {k}'s verified aggregate", 1) + fix
