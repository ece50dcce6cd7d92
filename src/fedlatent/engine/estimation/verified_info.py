"""The information pass after a verified fit, on the server: asked through the fit's own secure
channel, so each site can check the parameters it is asked at (issue 38).

A fit with verified rounds (:meth:`~fedlatent.engine.fedem.federation.Federation.verifies`)
keeps its :class:`~fedlatent.engine.secagg.secure.SecureChannel` (:func:`keep_channel`). The
information query of :mod:`~fedlatent.engine.estimation.inference` then goes out as one more
exchange on it (:func:`verified_context`), without a new setup: it shows every site the
transcript of the fit's last exchange, from which the site replays the server's final step
and answers only at the parameters that step gives
(:mod:`fedlatent.engine.node.verify_info`). A site whose policy requires differential
privacy or verified rounds (``[privacy] required = "dp-or-verified"``) answers it, as it
answered the rounds; any site refuses a server that asks at other parameters.

Without the channel (a loaded model, or the clients given as ``fd`` / ``runtime``) the
information is asked as before, after a new setup that verifies nothing: a
``"dp-or-verified"`` site refuses it.
"""

from __future__ import annotations

from fedlatent.engine.estimation.fitcontext import FitContext

__all__ = ["keep_channel", "verified_context"]


def keep_channel(est, ctx: FitContext) -> None:
    """Keep the secure channel of ``est``'s fit (``ctx``) when its rounds were verified and
    the sites hold its state: the fit's only start, or the last of several (an earlier
    start's sites were set up again since)."""
    channel = ctx.secure
    starts = getattr(est, "init_scores_", None)
    last = starts is None or getattr(est, "best_start_", None) == len(starts) - 1
    est._verified_info = (channel, ctx.model) if (
        channel is not None and channel.verify and last) else None


def verified_context(est) -> FitContext | None:
    """A context that asks the clients of ``est``'s verified fit through its kept channel
    (None: there is none)."""
    kept = getattr(est, "_verified_info", None)
    if kept is None:
        return None
    channel, model = kept
    return FitContext(channel.runtime, model, est._federation(), int(est.seed_),
                      secure=channel)
