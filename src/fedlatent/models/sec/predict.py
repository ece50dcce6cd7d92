"""Using SEC's fitted clusters: collaborative prediction (eq. 4), one pooled model per cluster
(Remark 3), new learners placed in the clusters (Section 4). A mixin of :class:`~.estimator.SEC`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...data.dataset import ClientData, DataValidationError, FederatedDataset
from ...data.validation import to_float_target
from ...engine.errors import NotFittedError
from ...engine.estimation.estimator import check_features, check_is_fitted
from ...engine.protocol.exchange import setup_clients
from ...engine.protocol.runtime import Runtime
from ...engine.transport.inprocess import InProcessRuntime
from .candidates import common_spec, make_candidates, select_model
from .clustering import affinity, weighted_prediction
from .model import check_learner
from .protocol import exchange_step, select_step, sender
from .serialize import check_extra_types, loads_model, predict_many

__all__ = ["ClusterUseMixin"]


def _target(cid: str, cd: ClientData, fd: FederatedDataset) -> np.ndarray:
    """A client's target as floats; text, complex, NaN/inf or |y| > 1e150 are refused."""
    if cd.y is None:
        raise DataValidationError(f"client {cid!r} has no target; scoring SEC needs the "
                                  "observed y: build the dataset with target='COLUMN'")
    return to_float_target(cd.y, fd.target_name or "y", where=f"client {cid!r}: ")


class ClusterUseMixin:
    """Prediction, pooled models and new learners, from the fitted attributes of SEC."""

    @property
    def selected_models_(self) -> dict[str, Any]:
        """Each learner's fitted model (loaded from its skops bytes), by learner id."""
        check_is_fitted(self)
        return {c: self._load_learner_model(i) for i, c in enumerate(self.learner_ids_)}

    def _load_learner_model(self, i: int) -> Any:
        """Learner i's fitted model, loaded only if its types are on the allow-list."""
        return loads_model(self.models_[i], source=f"learner {self.learner_ids_[i]!r}'s model",
                           extra_types=check_extra_types(self.extra_trusted_types))

    def clusters(self) -> dict[int, list[str]]:
        """Cluster label -> learner ids."""
        check_is_fitted(self)
        return {int(k): [c for c, lab in zip(self.learner_ids_, self.labels_) if lab == k]
                for k in np.unique(self.labels_)}

    def _raw_predictions(self, X: np.ndarray, members: list[int], scale_of: str | None):
        """Predictions of the members' models on the raw scale: each model with its own
        learner's scaling, or all with learner ``scale_of``'s scaling."""
        models = [self._load_learner_model(i) for i in members]
        if not self.standardize:
            return predict_many(models, X)
        if scale_of is not None:
            xm, xs, ym, ys = self.scalers_[scale_of]
            return ym + ys * predict_many(models, (X - xm) / xs)
        out = np.empty((len(members), X.shape[0]))
        for r, (i, m) in enumerate(zip(members, models)):
            xm, xs, ym, ys = self.scalers_[self.learner_ids_[i]]
            out[r] = ym + ys * predict_many([m], (X - xm) / xs)[0]
        return out

    def predict(self, X, learner: str | None = None, cluster: int | None = None,
                pooled: bool = False) -> np.ndarray:
        """Collaborative prediction within a cluster.

        Parameters
        ----------
        X : array-like or DataFrame of shape (n_samples, n_features)
            A DataFrame must have the fitted columns in the fitted order.
        learner : str, optional
            Predict for this learner: its cluster's models, applied the way the learner applies
            received models (on X standardized with its own constants, back on its y scale);
            its own model alone where its validation said the cluster did worse
            (``collaborates_``).
        cluster : int, optional
            Predict with this cluster's models, each on its own learner's raw scale.
        pooled : bool
            Use the cluster's model refitted on pooled data (:meth:`fit_pooled`) instead of
            eq. (4); only where pooling the learners' data is allowed.

        Returns
        -------
        ndarray of shape (n_samples,)
            Eq. (4): the sample-size weighted average of the cluster's models.
        """
        check_is_fitted(self)
        if (learner is None) == (cluster is None):
            raise ValueError("give exactly one of learner=... or cluster=...")
        X = check_features(self, X)
        if learner is not None:
            learner = str(learner)
            if learner not in self.learner_ids_:
                raise ValueError(f"unknown learner {learner!r}; known: {self.learner_ids_[:5]}...")
            cluster = int(self.labels_[self.learner_ids_.index(learner)])
        cluster = int(cluster)
        if cluster not in set(int(k) for k in self.labels_):
            raise ValueError(f"unknown cluster {cluster}; clusters are 0..{self.n_clusters_ - 1}")
        if pooled:
            if not hasattr(self, "pooled_models_"):
                raise NotFittedError("pooled=True needs fit_pooled(fd) first")
            return np.asarray(self.pooled_models_[cluster].predict(X), dtype=np.float64)
        members = [i for i, lab in enumerate(self.labels_) if lab == cluster]
        if learner is not None and not self._collaborates(learner):  # its own model did better
            members = [self.learner_ids_.index(learner)]
        P = self._raw_predictions(X, members, learner if self.standardize else None)
        return weighted_prediction(P, self.n_samples_[members])

    def _collaborates(self, learner: str) -> bool:
        """Whether ``learner`` predicts with its cluster (``collaborates_``; every learner for
        a model without it)."""
        flags = getattr(self, "collaborates_", None)
        return True if flags is None else bool(flags[self.learner_ids_.index(learner)])

    def _predict_client(self, client: str, data: ClientData) -> np.ndarray:
        """A fitted learner's rows, predicted by its cluster (:meth:`predict` ``learner=``)."""
        if client not in self.learner_ids_:
            raise ValueError(f"client {client!r} is not a fitted learner; place it in a cluster "
                             "with assign(fd) and predict with cluster=...")
        return self.predict(data.X, learner=client)

    def score_dataset(self, fd: FederatedDataset) -> float:
        """Mean squared error of :meth:`predict_dataset` on the targets of ``fd``.

        :meth:`predict_dataset` returns the rows in the user's order (a Series indexed like
        the source DataFrame); the targets are put in the same order before they meet.
        """
        y = fd.to_source_order(np.concatenate([_target(cid, cd, fd) for cid, cd in fd.items()]))
        pred = self.predict_dataset(fd)
        return float(np.mean((pred.to_numpy() - y.to_numpy()) ** 2))

    def fit_pooled(self, fd: FederatedDataset, estimator: Any = None):
        """Fit one model per cluster on the pooled data of its learners (Remark 3, case 2).

        This moves samples to one place: use it only where pooling is allowed. ``estimator``
        None selects among the candidates by half-half cross-validation on the pooled data.
        """
        from sklearn.base import clone

        check_is_fitted(self)
        rng = np.random.default_rng(np.random.SeedSequence(self.seed_, spawn_key=(0x9001,)))
        self.pooled_models_ = {}
        for k, members in self.clusters().items():
            X = np.vstack([fd[c].X for c in members])
            y = np.concatenate([_target(c, fd[c], fd) for c in members])
            if estimator is None:
                cands = make_candidates(common_spec(self.candidates, self.learner_ids_))
                _, model, _, _ = select_model(X, y, cands, rng)
            else:
                model = clone(estimator).fit(X, y)
            self.pooled_models_[k] = model
        return self

    def assign(self, new_fd: FederatedDataset, runtime: Runtime | None = None) -> np.ndarray:
        """Place new learners in the fitted clusters (largest summed similarity, Section 4).

        The new learners run Select with the common candidates and evaluate every fitted
        learner's model on their data (``e_{i->t}``). If ``runtime`` reaches the fitted learners
        (for example ``InProcessRuntime(fd)`` or the runtime given to :meth:`fit`), the new
        models are also sent to them (``e_{t->i}``) and ``v_ti`` is eq. (2); otherwise the
        missing direction is replaced by the available one, ``v_ti = 2 |e_{i->t} - e_t|``.
        Every reply is checked as in :meth:`fit`.

        Parameters
        ----------
        new_fd : FederatedDataset
        runtime : Runtime or None

        Returns
        -------
        labels : ndarray of shape (n_new_learners,)
            In ``new_fd.client_ids`` order. ``assign_similarity_`` holds the (n_new, L)
            similarities to the fitted learners.
        """
        check_is_fitted(self)
        if not isinstance(new_fd, FederatedDataset):
            raise TypeError(f"assign expects a fl.FederatedDataset, got {type(new_fd).__name__}")
        if new_fd.n_features != self.n_features_in_:
            raise DataValidationError(
                f"new learners have {new_fd.n_features} features; the fitted learners had "
                f"{self.n_features_in_}"
            )
        for cid, cd in new_fd.items():
            check_learner(cid, cd.X, cd.y, new_fd.target_name or "y")
        self._check_models(self.learner_ids_, self.models_, "")  # before any is sent
        new_ids = new_fd.client_ids
        rt_new = InProcessRuntime(new_fd)
        setup_clients(rt_new, self._make_model(new_fd), self._federation().disclosure)
        common = make_candidates(common_spec(self.candidates, self.learner_ids_))
        sel = select_step(sender(rt_new), new_ids, {c: common for c in new_ids}, self.seed_ + 1,
                          n_features=int(self.n_features_in_),
                          standardize=bool(self.standardize), n_jobs=self.n_jobs,
                          split=getattr(self, "split", "random"))
        e_new = np.array([float(sel[c]["e"]) for c in new_ids])
        E_to_new = exchange_step(sender(rt_new), new_ids, self.models_, self.seed_,
                                 batch=int(self.exchange_batch), n_jobs=self.n_jobs)  # (L, T)
        D1 = np.abs(E_to_new - e_new[None, :]).T  # (T, L): |e_{i->t} - e_t|
        if runtime is not None:
            blobs = [np.asarray(sel[c]["model"], dtype=np.uint8) for c in new_ids]
            setup_clients(runtime, self._make_model(new_fd),
                          self._federation().disclosure)
            E_from_new = exchange_step(sender(runtime), self.learner_ids_, blobs, self.seed_,
                                       batch=int(self.exchange_batch),
                                       n_jobs=self.n_jobs)  # (T, L)
            V = D1 + np.abs(E_from_new - self.errors_[None, :])
        else:
            V = 2.0 * D1
        S = affinity(V, self.affinity_scale_)
        ks = np.unique(self.labels_)
        score = np.stack([S[:, self.labels_ == k].sum(1) for k in ks], axis=1)
        self.assign_similarity_ = S
        return ks[score.argmax(1)]
