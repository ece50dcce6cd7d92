"""FedGMM's client-side half: each client's mixture weights ``pi_c`` (read on its side, saved
and loaded by it, or learned by a client unseen in training). Mixed into :class:`FedGMM`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...data.dataset import ClientData
from ...engine.estimation.estimator import check_is_fitted
from .math import fedgmm_log_components, fedgmm_responsibilities
from .personalized import PersonalizedFedGMM

__all__ = ["ClientWeights"]


class ClientWeights:
    """:meth:`personalize`, :meth:`save_client_weights`, :meth:`load_client_weights`,
    :meth:`load_site_state` and :meth:`adapt` of :class:`~fedlatent.models.fedgmm.FedGMM`
    (the estimator's fitted parameters, ``_check_X``, ``_encode`` and ``_learner``)."""

    def personalize(self, client: str) -> PersonalizedFedGMM:
        """The predictor of a client seen in training, built on the client's side.

        After an in-process fit, the client's ``pi_c`` is read from its own node object (this
        is the client's half of the library: nothing crosses the runtime). After :meth:`load`,
        use :meth:`load_client_weights` with the file the client kept.
        """
        check_is_fitted(self)
        client = str(client)
        pis = getattr(self, "_client_pi", {})
        if client in pis:
            return PersonalizedFedGMM(self, pis[client], client)
        rt = getattr(self, "_runtime", None)
        nodes = getattr(rt, "nodes", None)
        if nodes is None or client not in nodes:
            known = self.client_ids_ or sorted(pis)
            raise KeyError(
                f"unknown client {client!r}: its mixture weights are not available here "
                f"(clients of this fit: {known[:5]}{'...' if len(known) > 5 else ''}); for a "
                "new client use adapt(ClientData(X, y))"
            )
        return PersonalizedFedGMM(self, nodes[client].state["model/pi"], client)

    def save_client_weights(self, directory: str | Path) -> list[Path]:
        """Write each client's ``pi_c`` into ``directory`` (what it keeps), one ``.npz`` each.

        Client ids are data, never paths: a plain id (letters, digits, ``_.-``) names its file
        ``<client>.npz``, any other id (``../x``, ``a/b``, unicode...) an index, ``_000003.npz``;
        ``manifest.json``, written last, maps every id to its file
        (:func:`fedlatent.data.files.client_file_names`). Every weight vector is gathered before
        anything is written. Read them back with :meth:`load_client_weights`, by client and
        directory.
        """
        from ...data.files import client_file_names, write_client_manifest

        check_is_fitted(self)
        names = client_file_names([str(c) for c in self.client_ids_])
        pis = {cid: self.personalize(cid).pi for cid in names}
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        paths = []
        for cid, name in names.items():
            np.savez(directory / name, pi=pis[cid])
            paths.append(directory / name)
        write_client_manifest(directory, names)
        return paths

    def load_client_weights(self, client: str, path: str | Path) -> PersonalizedFedGMM:
        """Attach a client's saved ``pi_c`` (from :meth:`save_client_weights`).

        ``path`` is the client's file, or the directory :meth:`save_client_weights` wrote: the
        client is then looked up in its manifest (never turned into a path).
        """
        from ...data.files import client_files

        if Path(path).is_dir():
            files = client_files(path)
            if str(client) not in files:
                raise KeyError(f"client {str(client)!r} has no weights file in {path} (its "
                               f"manifest lists {len(files)} clients)")
            path = files[str(client)]
        with np.load(path, allow_pickle=False) as z:
            pi = np.asarray(z["pi"], dtype=np.float64)
        return self._attach_pi(str(client), pi, path)

    def load_site_state(self, directory: str | Path) -> PersonalizedFedGMM:
        """Attach the ``pi_c`` a site kept in its site directory after a deployed fit
        (:mod:`fedlatent.engine.node.site_state`: the node config's ``site-dir``, by default
        ``<data file stem>.site`` beside its data file); refused if another fit wrote it."""
        from ...engine.contract.registry import estimator_config
        from ...engine.node.site_state import check_run, read_site_state

        check_is_fitted(self)
        site = read_site_state(directory)
        check_run(site, *estimator_config(self))
        if "model/pi" not in site.state:
            raise ValueError(f"site state {site.path} holds no mixture weights 'model/pi'")
        return self._attach_pi(site.client_id, site.state["model/pi"], site.path)

    def _attach_pi(self, client: str, pi, path) -> PersonalizedFedGMM:
        pi = np.asarray(pi, dtype=np.float64)
        M = (len(self.weights_x_), len(self.weights_y_))
        if pi.shape != M:
            raise ValueError(f"{path}: pi has shape {pi.shape}, this model needs {M}")
        if not (np.all(np.isfinite(pi)) and np.all(pi >= 0) and abs(pi.sum() - 1.0) <= 1e-6):
            raise ValueError(f"{path}: pi must be finite, non-negative weights summing to 1 "
                             f"(sum {pi.sum()!r}, min {pi.min()!r}); the file is damaged or "
                             "was edited: save the client's weights again")
        if not hasattr(self, "_client_pi"):
            self._client_pi = {}
        self._client_pi[str(client)] = pi
        return PersonalizedFedGMM(self, pi, str(client))

    def adapt(self, client_data: ClientData, n_rounds: int = 20) -> PersonalizedFedGMM:
        """Learn the mixture weights of a client unseen in training (shared parameters frozen).

        Runs ``n_rounds`` E-steps and ``pi`` updates (lines 6 and 8 of Algorithm 1) on the new
        client's labelled samples only; nothing is sent.

        Parameters
        ----------
        client_data : ClientData with X and y, or a tuple (X, y)
        n_rounds : int

        Returns
        -------
        PersonalizedFedGMM
        """
        check_is_fitted(self)
        if isinstance(client_data, tuple):
            if len(client_data) != 2:
                raise ValueError(f"adapt takes (X, y) or ClientData, got a tuple of "
                                 f"{len(client_data)} items")
            client_data = ClientData(client_data[0], np.asarray(client_data[1]))
        if client_data.y is None:
            raise ValueError("adapt needs labelled samples: client_data.y is None")
        if int(n_rounds) < 1:
            raise ValueError(f"n_rounds must be >= 1, got {n_rounds!r}")
        X = self._check_X(client_data.X)  # names the column of a text/NaN/huge value
        y = np.asarray(client_data.y).ravel()
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"adapt: X has {X.shape[0]} rows but y has {y.shape[0]}; pass one "
                             "label per row")
        y = self._encode(y)
        if np.isnan(X).any():  # each input component's completion (.missing)
            from .missing import missing_components

            lg, lp = missing_components(X, self.params_, self.covariance_type,
                                        self._learner())[:2]
            lpy = lp[np.arange(X.shape[0]), :, :, y]  # (n, M1, M2)
        else:
            lg, lp = fedgmm_log_components(X, self.params_, self.covariance_type,
                                           self._learner())
            lpy = lp[np.arange(X.shape[0]), :, y]
        M1, M2 = len(self.weights_x_), len(self.weights_y_)
        pi = np.full((M1, M2), 1.0 / (M1 * M2))
        for _ in range(int(n_rounds)):
            q, _ = fedgmm_responsibilities(lg, lpy, pi)
            pi = q.mean(axis=0)
        return PersonalizedFedGMM(self, pi, None)
