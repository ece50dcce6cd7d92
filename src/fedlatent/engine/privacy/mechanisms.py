"""The Gaussian mechanism on a collection of named arrays (a ``Stats``-like mapping).

One release is the whole collection: one joint L2 sensitivity ``Delta`` (over every block at
once) and one noise multiplier ``z``. Every entry gets independent ``N(0, (z Delta)^2)`` noise,
so the release is the Gaussian mechanism with multiplier ``z`` whatever the number of blocks.

Blocks on very different scales (a count next to a sum of squares) can be given relative noise
``scales``: the release is then the Gaussian mechanism applied to the rescaled statistic
``{b: s_b / scales[b]}``, whose joint sensitivity :func:`joint_sensitivity` computes; block ``b``
gets standard deviation ``z * Delta_scaled * scales[b]``. Same privacy, noise spent where the
signal is.

Distributed noise: each of ``n`` parties adds standard deviation ``z Delta / sqrt(n)`` to its own
message, so that the *sum* over the ``n`` parties carries ``(z Delta)^2``. That protects a
record only if nobody sees one party's message: use it with secure aggregation. If parties drop
out after adding their share, the sum carries less noise than calibrated; the caller must
re-noise or count the release at the noise actually present.

Matrix blocks get independent noise in every entry (the mechanism on the vectorized matrix,
whose Frobenius norm the sensitivities bound); symmetrizing a noisy ``x x^T`` sum afterwards is
post-processing and costs no privacy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

__all__ = ["gaussian_mechanism", "joint_sensitivity", "noise_stds"]


def joint_sensitivity(block_sensitivities: Mapping[str, float],
                      scales: Mapping[str, float] | None = None) -> float:
    """L2 sensitivity of the whole collection from per-block bounds that hold simultaneously.

    ``sqrt(sum_b (Delta_b / scale_b)^2)``: if adding one record moves block ``b`` by at most
    ``Delta_b`` in L2 (Frobenius) norm, it moves the concatenated (rescaled) vector by at most
    this much.

    Parameters
    ----------
    block_sensitivities : mapping of str to float
    scales : mapping of str to float or None
        Positive relative noise scales (``None``: all 1).
    """
    total = 0.0
    for name, d in block_sensitivities.items():
        d = float(d)
        if not (math.isfinite(d) and d >= 0):
            raise ValueError(f"sensitivity of block {name!r} must be finite and >= 0, got {d!r}")
        s = 1.0 if scales is None else float(scales[name])
        if not (math.isfinite(s) and s > 0):
            raise ValueError(f"noise scale of block {name!r} must be finite and > 0, got {s!r}")
        total += (d / s) ** 2
    return math.sqrt(total)


def noise_stds(names, sensitivity: float, noise_multiplier: float, *, n_parties: int = 1,
               scales: Mapping[str, float] | None = None) -> dict[str, float]:
    """Noise standard deviation each party adds to each block.

    Parameters
    ----------
    names : iterable of str
        The blocks.
    sensitivity : float
        Joint L2 sensitivity of the (rescaled, if ``scales``) collection.
    noise_multiplier : float
        ``z`` from the calibration.
    n_parties : int
        ``1`` for local noise; the number of participants sharing the noise when distributed.
    scales : mapping of str to float or None
        Relative noise scales (see the module docstring).
    """
    if not (math.isfinite(sensitivity) and sensitivity >= 0):
        raise ValueError(f"sensitivity must be finite and >= 0, got {sensitivity!r}")
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise_multiplier must be finite and > 0, got {noise_multiplier!r}")
    if isinstance(n_parties, bool) or not isinstance(n_parties, int) or n_parties < 1:
        raise ValueError(f"n_parties must be a positive integer, got {n_parties!r}")
    base = noise_multiplier * sensitivity / math.sqrt(n_parties)
    out = {}
    for name in names:
        if scales is not None and name not in scales:
            raise ValueError(f"no noise scale for block {name!r}; scales has {sorted(scales)}")
        out[name] = base * (1.0 if scales is None else float(scales[name]))
    return out


def gaussian_mechanism(stats: Mapping[str, np.ndarray], *, sensitivity: float,
                       noise_multiplier: float, rng: np.random.Generator, n_parties: int = 1,
                       scales: Mapping[str, float] | None = None) -> dict[str, np.ndarray]:
    """``stats`` plus Gaussian noise, block by block, drawn from the caller's generator.

    Parameters
    ----------
    stats : mapping of str to array_like
        The release (e.g. a ``Stats``); not modified.
    sensitivity : float
        Joint L2 sensitivity of the release to one record (of the rescaled release if
        ``scales``; see :func:`joint_sensitivity`).
    noise_multiplier : float
        ``z`` from the calibration.
    rng : numpy.random.Generator
        The engine's seeded generator for this client, round and purpose.
    n_parties : int
        ``1``: local noise (this message alone is private). ``n``: this party's share of
        distributed noise (private only under secure aggregation).
    scales : mapping of str to float or None
        Relative noise scales per block.

    Returns
    -------
    dict of str to ndarray
        Same keys, shapes and order; float64.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator (the engine's seeded stream), "
                        f"got {type(rng).__name__}")
    sds = noise_stds(list(stats), sensitivity, noise_multiplier, n_parties=n_parties,
                     scales=scales)
    out = {}
    for name, value in stats.items():
        arr = np.asarray(value, dtype=np.float64)
        out[name] = arr + sds[name] * rng.standard_normal(arr.shape)
    return out
