"""Every model on a small federation, shared by the Flower tests (simulation, deployment).

Kept to few messages: on a deployment every message costs seconds (GMM keeps the default
k-means initialization, three queries; FedGMM uses the random one, one query), and two rounds
for the models with a round loop (the second starts from parameters the server computed and
sent).

Each case gives a dataset, a fresh estimator (same seed every time) and the fitted arrays that
must agree between runtimes.
"""

from __future__ import annotations

import warnings

import numpy as np

from fedlatent.engine.contract.registry import estimator_class, estimator_names, example


def _flower_case(name):
    case = example(name).case("flower")
    return lambda: (case.data(), case.make)


#: every registered model's Flower case (its example's "flower" case, fedlatent.models.<name>.
#: example): a new registered model is covered without editing this file
CASES = {name: _flower_case(name) for name in estimator_names()}

#: per model, the fitted arrays that must agree between runtimes
FITTED = {name: example(name).fitted_arrays(estimator_class(name)) for name in CASES}


def fit_inprocess(name):
    fd, make = CASES[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fd, make().fit(fd)


def assert_same_fit(name, a, b, rtol=1e-8):
    """Every fitted array of ``a`` equals ``b``'s to ``rtol`` (relative to the array's scale)."""
    for attr in FITTED[name]:
        x, y = np.asarray(getattr(a, attr), float), np.asarray(getattr(b, attr), float)
        assert x.shape == y.shape, attr
        scale = max(float(np.max(np.abs(x))), 1e-300)
        err = float(np.max(np.abs(x - y))) / scale
        assert err <= rtol, f"{name}.{attr}: relative difference {err:.3g}"
    if name == "sec":  # the learners' models (skops bytes differ by zip timestamps): predictions
        X = np.random.default_rng(0).normal(size=(20, a.n_features_in_))
        for c in a.learner_ids_:
            pa, pb = a.predict(X, learner=c), b.predict(X, learner=c)
            assert np.max(np.abs(pa - pb)) <= rtol * max(float(np.max(np.abs(pa))), 1e-300)
