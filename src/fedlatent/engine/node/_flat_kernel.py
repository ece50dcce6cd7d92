"""The compiled form of a verifying site's steady FedEM step
(:func:`~fedlatent.engine.node.verify_kept.flat_step`): the aggregate's words decoded and added
to the kept ``S_hat`` and ``V`` in one pass, where NumPy takes five calls.

Each entry is computed by the IEEE operations the server's
:meth:`~fedlatent.engine.fedem.update.FedEMState.advance` applies to it, in its order, and
numba compiles them without contraction (no fused multiply-add unless asked: a product and a
sum stay two roundings), so the result is the server's to the last bit. Used only where numba
pays (:mod:`~fedlatent.engine.protocol.compiled`); cached on disk (``cache=True``).
"""

from __future__ import annotations

from numba import njit


@njit(cache=True)
def step_kernel(kept, words, scale, s0, v0, gamma, alpha, out):  # pragma: no cover (compiled)
    """``out[s0 + i] = (kept[s0 + i] + gamma a_i) + gamma kept[v0 + i]`` and ``out[v0 + i] =
    kept[v0 + i] + alpha a_i`` with ``a_i = float(words[i]) / scale`` (the encoding's decode
    of an int64 word); ``v0 < 0``: no ``V``, ``out[s0 + i] = kept[s0 + i] + gamma a_i``.
    ``gamma = 1`` gives ``S + a + V`` exactly (``1.0 * a`` is ``a``)."""
    for i in range(words.shape[0]):
        a = float(words[i]) / scale
        x = kept[s0 + i] + gamma * a
        if v0 >= 0:
            x = x + gamma * kept[v0 + i]
            out[v0 + i] = kept[v0 + i] + alpha * a
        out[s0 + i] = x
