"""Optional PyTorch learner for FedGMM (``pip install fedlatent[torch]``): a small MLP classifier.

Its parameters travel as one flat float64 vector per learner; clients refit it by a few epochs
of mini-batch SGD on the responsibility-weighted cross-entropy, starting from the broadcast
parameters, and the server averages the refits with responsibility weights (the paper's rule,
``learner_update="average"``; Wu et al., ICML 2023, Algorithm 1 lines 8 and 16).
"""

from __future__ import annotations

import numpy as np

__all__ = ["TorchMLPLearner"]


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "learner='torch' needs PyTorch: pip install 'fedlatent[torch]'"
        ) from e
    return torch


class TorchMLPLearner:
    """An MLP ``d -> hidden... -> K`` (ReLU) with flat parameters.

    Parameters
    ----------
    n_features, n_classes : int
    hidden : list of int, default [32]
    lr : float, default 0.1
        SGD learning rate of the local refits.
    epochs : int, default 1
    batch_size : int, default 64
    """

    def __init__(self, n_features: int, n_classes: int, hidden=(32,), lr: float = 0.1,
                 epochs: int = 1, batch_size: int = 64):
        torch = _torch()
        self.sizes = [int(n_features), *[int(h) for h in hidden], int(n_classes)]
        self.lr, self.epochs, self.batch_size = float(lr), int(epochs), int(batch_size)
        layers = []
        for a, b in zip(self.sizes[:-1], self.sizes[1:]):
            layers += [torch.nn.Linear(a, b, dtype=torch.float64), torch.nn.ReLU()]
        self.net = torch.nn.Sequential(*layers[:-1])
        self.n_params = int(sum(p.numel() for p in self.net.parameters()))

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        """Uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) weights and biases, from ``rng``."""
        out = []
        for a, b in zip(self.sizes[:-1], self.sizes[1:]):
            bound = 1.0 / np.sqrt(a)
            out += [rng.uniform(-bound, bound, size=b * a), rng.uniform(-bound, bound, size=b)]
        return np.concatenate(out)

    def _load(self, theta: np.ndarray) -> None:
        torch = _torch()
        # a copy: the parameters become views of this vector and SGD updates them in place
        vec = torch.tensor(np.array(theta, dtype=np.float64, copy=True))
        torch.nn.utils.vector_to_parameters(vec, self.net.parameters())

    def log_proba(self, X: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """Log class probabilities, shape (n_samples, n_classes)."""
        torch = _torch()
        self._load(theta)
        with torch.no_grad():
            out = torch.log_softmax(self.net(torch.as_tensor(X, dtype=torch.float64)), dim=1)
        return out.numpy()

    def refit(self, X, y, w, theta0, l2: float, prox: float, rng: np.random.Generator):
        """Local SGD on ``sum_i w_i CE_i / sum_i w_i + l2/2 |theta|^2 + prox/2 |theta-theta0|^2``.

        Returns
        -------
        ndarray of shape (n_params,)
        """
        torch = _torch()
        self._load(theta0)
        start = torch.tensor(np.array(theta0, dtype=np.float64, copy=True))
        Xt = torch.as_tensor(X, dtype=torch.float64)
        yt = torch.as_tensor(np.asarray(y), dtype=torch.long)
        wt = torch.as_tensor(w, dtype=torch.float64)
        total = float(wt.sum())
        if total <= 0:
            return np.asarray(theta0, np.float64).copy()
        n = X.shape[0]
        opt = torch.optim.SGD(self.net.parameters(), lr=self.lr)
        for _ in range(self.epochs):
            perm = rng.permutation(n)
            for s in range(0, n, self.batch_size):
                idx = torch.as_tensor(perm[s : s + self.batch_size])
                ce = torch.nn.functional.cross_entropy(self.net(Xt[idx]), yt[idx],
                                                       reduction="none")
                loss = (wt[idx] * ce).sum() * (n / idx.numel()) / total
                vec = torch.nn.utils.parameters_to_vector(self.net.parameters())
                loss = loss + 0.5 * l2 * (vec**2).sum() + 0.5 * prox * ((vec - start) ** 2).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
        return torch.nn.utils.parameters_to_vector(self.net.parameters()).detach().numpy().copy()
