"""A fit's round loop set up and started, no round run: for tests that drive rounds one by
one (``rd.round(k)``) or hand the collectors plans of their own."""

from __future__ import annotations

import warnings

from fedlatent.engine.rounds.loop import LoopOptions, _Rounds


def started_loop(est, fd, rt) -> _Rounds:
    """The loop of estimator ``est`` on ``fd`` through runtime ``rt``: set up, started from
    the estimator's initialization (its warnings silenced), no round run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ctx = est._start(fd, rt)
        params0 = est._initialize(ctx)
    rd = _Rounds(ctx.model, rt, ctx.federation, LoopOptions(seed=ctx.seed), ctx.n_units,
                 ctx.secure, ctx.privacy)
    rd.start(params0)
    return rd
