"""Prediction and scores of a fitted model, without scikit-learn: what a fitted estimator and a
saved model read for prediction alone (:mod:`fedlatent.engine.estimation.saved`) share.

:class:`DatasetPrediction` puts each client's predictions in the user's order and scores on
federated data through the model's ``loglik`` query (only two sums come back);
:class:`MixturePrediction` gives a mixture's ``predict``, ``predict_proba``, ``score_samples``,
``score``, ``bic`` and ``aic`` from one hook, ``_estimate_weighted_log_prob``. Neither imports
scikit-learn (``import sklearn`` alone costs about a second of CPU, most of ``fedlatent predict``
on 200 rows); the estimators add scikit-learn's ``BaseEstimator`` on top
(:mod:`fedlatent.engine.estimation.estimator`).
"""

from __future__ import annotations

import numpy as np

from fedlatent.data.dataset import ClientData, FederatedDataset
from fedlatent.engine.estimation.checks import check_features, check_is_fitted
from fedlatent.engine.estimation.fitcontext import FitContext
from fedlatent.engine.fedem.federation import Federation
from fedlatent.engine.protocol.exchange import number, setup_clients
from fedlatent.engine.protocol.numerics import logsumexp
from fedlatent.engine.protocol.runtime import Runtime

__all__ = ["DatasetPrediction", "MixturePrediction"]


class DatasetPrediction:
    """Predictions and scores on federated data, each client's part computed where its rows
    are. Needs ``feature_names_in_``, ``_make_model(fd)``, ``_fitted_params()`` and, for
    :meth:`predict_dataset`, ``predict(X)`` or ``_predict_client``."""

    def _federation(self) -> Federation:
        fed = getattr(self, "federation", None)
        fed = Federation() if fed is None else fed
        fed.validate()
        return fed

    def _federated_loglik(self, fd, runtime: Runtime | None = None) -> tuple[float, int]:
        """Sum of the log-likelihoods and the number of rows over the clients of ``fd``, computed
        where the rows are (the model's ``loglik`` query; only the two sums come back, checked).

        Parameters
        ----------
        fd : FederatedDataset
            Must have the columns of the fit, in the same order.
        runtime : Runtime or None
            Transport to the clients; default: in-process clients built from ``fd``.

        Returns
        -------
        (float, int)
            The summed log-likelihood and the number of rows.
        """
        from fedlatent.engine.transport.inprocess import InProcessRuntime

        check_is_fitted(self)
        fitted = [str(f) for f in self.feature_names_in_]
        if list(fd.feature_names) != fitted:
            raise ValueError(f"the dataset has features {list(fd.feature_names)}, but this "
                             f"{type(self).__name__} was fitted with {fitted}")
        model = self._make_model(fd)
        rt = runtime if runtime is not None else InProcessRuntime(fd)
        setup_clients(rt, model, self._federation().disclosure)
        payload = {f"params/{k}": v for k, v in self._fitted_params().items()}
        rep = FitContext(rt, model, None, 0).ask(
            "loglik", payload, expect={"n": number(low=0), "loglik": number()}, what="scoring")
        return (sum(float(r["loglik"]) for r in rep.values()),
                sum(float(r["n"]) for r in rep.values()))

    def _predict_client(self, client: str, data: ClientData) -> np.ndarray:
        """Predictions for one client's rows (default: ``predict(data.X)``)."""
        return np.asarray(self.predict(data.X))

    def predict_dataset(self, fd: FederatedDataset):
        """Predictions for every row of ``fd``, each client's part computed where its data are
        (``_predict_client``), as a pandas Series in the user's order: indexed by
        ``fd.row_index`` (a DataFrame's index, in its row order, for a dataset made with
        ``from_pandas``; a RangeIndex over the rows in client order for one made from arrays).

        A model with its own prediction path returns ``fd.to_source_order(values)`` with
        ``values`` in client order (the order of ``fd.items()``), as this does.
        """
        check_is_fitted(self)
        self._note_left_out(fd)
        parts = [np.asarray(self._predict_client(cid, cd)) for cid, cd in fd.items()]
        return fd.to_source_order(np.concatenate(parts) if parts else np.zeros(0),
                                  name="prediction")

    def _note_left_out(self, fd) -> None:
        """Say (a SitesExcludedWarning) when ``fd`` holds sites the fit left out: their
        predictions use the population-level model, as for sites not seen in training."""
        out = [c for c in fd.client_ids if c in (getattr(self, "excluded_clients_", None) or {})]
        if out:
            from fedlatent.data.validation import name_list
            from fedlatent.engine.warn import SitesExcludedWarning, warn_user

            warn_user(f"site(s) {name_list(out)} were left out of the fit (excluded_clients_): "
                      "their predictions use the population-level model, as for a site not "
                      "seen in training", SitesExcludedWarning)


class MixturePrediction(DatasetPrediction):
    """A finite mixture's prediction and scores (scikit-learn's ``BaseMixture`` interface) from
    ``_estimate_weighted_log_prob(X)`` (``log p(x_i | k) + log pi_k``, shape (n_samples,
    n_components)) and ``_n_parameters()``."""

    _score_name = "mean log-likelihood"

    def _check_X(self, X) -> np.ndarray:
        """X as the rows the model scores, or a ValueError naming the column (default:
        :func:`~fedlatent.engine.estimation.checks.check_features`)."""
        return check_features(self, X)

    def score_samples(self, X) -> np.ndarray:
        """Log-likelihood of each sample, shape (n_samples,)."""
        return logsumexp(self._estimate_weighted_log_prob(self._check_X(X)), axis=1)

    def score(self, X, y=None) -> float:
        """Mean per-sample log-likelihood. X may be an array or a FederatedDataset (computed on
        the clients; only sums come back)."""
        if isinstance(X, FederatedDataset):
            tot, n = self._federated_loglik(X)
            return tot / n
        return float(self.score_samples(X).mean())

    def score_dataset(self, fd: FederatedDataset) -> float:
        """Mean per-sample log-likelihood over the clients of ``fd``."""
        return self.score(fd)

    def predict_proba(self, X) -> np.ndarray:
        """Posterior probability of each component, shape (n_samples, n_components)."""
        wlp = self._estimate_weighted_log_prob(self._check_X(X))
        return np.exp(wlp - logsumexp(wlp, axis=1)[:, None])

    def predict(self, X) -> np.ndarray:
        """Most probable component of each sample."""
        return self._estimate_weighted_log_prob(self._check_X(X)).argmax(axis=1)

    def _n_rows(self, X) -> int:
        return X.total_weight if isinstance(X, FederatedDataset) else self._check_X(X).shape[0]

    def bic(self, X) -> float:
        """Bayesian information criterion (lower is better). X: array or FederatedDataset."""
        n = self._n_rows(X)
        return -2 * self.score(X) * n + self._n_parameters() * np.log(n)

    def aic(self, X) -> float:
        """Akaike information criterion (lower is better). X: array or FederatedDataset."""
        n = self._n_rows(X)
        return -2 * self.score(X) * n + 2 * self._n_parameters()
