"""Data of the FedGMM paper: its synthetic mixture, the non-Gaussian settings, and 8x8 digits.

References
----------
Wu et al., "Personalized Federated Learning under Mixture of Distributions", ICML 2023:
section 4.1 (synthetic data), Table 3 (non-Gaussian settings), section 4.5 and Appendix C.3
(transformed images for novelty detection).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .dataset import ClientData, FederatedDataset
from .partition import partition_by_labels

__all__ = [
    "FederatedSplits",
    "make_fedgmm_synthetic",
    "fedgmm_bayes_proba",
    "label_skew_partition",
    "make_fedgmm_nongaussian",
    "make_fedgmm_digits",
    "transform_digits",
    "federated_pca",
    "split_clients",
]


@dataclass
class FederatedSplits:
    """Per-client train / validation / test splits of one federation, and the generating truth."""

    train: FederatedDataset
    val: FederatedDataset
    test: FederatedDataset
    info: dict = field(default_factory=dict)


def split_clients(
    clients: dict[str, ClientData],
    fractions=(0.6, 0.2, 0.2),
    rng: np.random.Generator | None = None,
    feature_names=None,
) -> FederatedSplits:
    """Split every client's rows at random into train / val / test (paper: 60/20/20).

    A split with fraction 0 is None.
    """
    rng = np.random.default_rng(rng)
    fr = np.asarray(fractions, dtype=float)
    if fr.shape != (3,) or np.any(fr < 0) or not np.isclose(fr.sum(), 1.0):
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {fr}")
    parts: list[dict[str, ClientData]] = [{}, {}, {}]
    for cid, cd in clients.items():
        perm = rng.permutation(cd.n_samples)
        cuts = np.round(np.cumsum(fr)[:2] * cd.n_samples).astype(int)
        for j, idx in enumerate(np.split(perm, cuts)):
            parts[j][cid] = cd.take(np.sort(idx))
    d = next(iter(clients.values())).n_features
    names = list(feature_names) if feature_names is not None else [f"x{j}" for j in range(d)]
    fds = [FederatedDataset(p, names, target_name="y") if f > 0 else None
           for p, f in zip(parts, fr)]
    return FederatedSplits(*fds)


def _client_sizes(rng, n_clients, n_per_client):
    return np.maximum(20, rng.poisson(n_per_client, size=n_clients))


def make_fedgmm_synthetic(
    n_clients: int = 300,
    n_samples_per_client: int | None = None,
    n_components: int = 3,
    n_features: int = 32,
    alpha: float = 0.4,
    mean_scale: float = 1.0,
    fractions=(0.6, 0.2, 0.2),
    random_state=None,
    generator: str = "paper",
    n_test: int = 5000,
) -> FederatedSplits:
    """The synthetic federation of section 4.1, as the paper's text or its public code has it.

    ``generator="paper"`` (the text): ``M`` components ``N(mu_m, I_d)`` with labelling
    functions ``y = 1{(x - mu_m)^T v_m > 0}``; client ``c`` draws ``pi_c ~ Dir(alpha)``, then
    for each of its ``N_c ~ Poisson(n_samples_per_client)`` samples ``z ~ pi_c``,
    ``x ~ N(mu_z, I)``, ``y = F_z(x)``. ``mu_m ~ N(0, mean_scale^2 I)`` and ``v_m`` uniform on
    the sphere, drawn once; each client's rows are split ``fractions`` (train / val / test).

    ``generator="reference"``: the authors' public script (``data/gmsynthetic/generate_data.py``
    of the FedGMM repository), which produced Table 2: ``theta_m, mu_m ~ U[-1, 1]^d``,
    ``x ~ N(mu_z, I / sqrt(d))``, labels drawn ``y ~ Bernoulli(sigmoid((x - mu_z)^T theta_z))``
    (so no model reaches 100%; see :func:`fedgmm_bayes_proba`), ``min(int(LogNormal(4, 2)) + 50,
    n_samples_per_client)`` training rows per client (the script's cap is 1,000; that is the
    default here) and ``n_test`` test rows per client drawn separately (no validation split;
    ``fractions`` and ``mean_scale`` are not used).

    ``generator="reference-as-published"``: the same script as published, which never advances
    its write index: every component writes its ``n_m`` draws into rows ``0..n_m - 1``, so a
    row keeps the last component that reached it and rows past ``max_m n_m`` stay
    ``x = 0, y = 0`` (about a quarter of the rows with ``alpha = 0.4``). Only for comparing with
    the paper's published numbers.

    Returns
    -------
    FederatedSplits
        ``info``: ``generator``, ``pi`` (n_clients, M), ``means`` (M, d), ``directions`` (M, d)
        (``v_m``, or ``theta_m`` for the reference generators); for the reference generators
        also ``covariance_scale`` (``1 / sqrt(d)``) and ``test_counts`` (n_clients, M), the
        multinomial component counts of each client's test draw.
    """
    if generator != "paper":
        return _make_reference(generator, n_clients, n_samples_per_client, n_components,
                               n_features, alpha, n_test, random_state)
    rng = np.random.default_rng(random_state)
    M, d = int(n_components), int(n_features)
    means = mean_scale * rng.standard_normal((M, d))
    v = rng.standard_normal((M, d))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    sizes = _client_sizes(rng, n_clients, 3000 if n_samples_per_client is None
                          else n_samples_per_client)
    width = max(3, len(str(n_clients - 1)))
    clients, pis = {}, []
    for c in range(n_clients):
        pi = rng.dirichlet(np.full(M, alpha))
        z = rng.choice(M, size=sizes[c], p=pi)
        X = means[z] + rng.standard_normal((sizes[c], d))
        y = (np.einsum("ij,ij->i", X - means[z], v[z]) > 0).astype(int)
        clients[f"client{c:0{width}d}"] = ClientData(X, y)
        pis.append(pi)
    out = split_clients(clients, fractions, rng)
    out.info = {"generator": "paper", "pi": np.array(pis), "means": means, "directions": v}
    return out


_GENERATORS = ("paper", "reference", "reference-as-published")


def _reference_draw(rng, counts, means, theta, scale, as_published):
    """One draw of the reference script: ``counts[m]`` rows of component ``m``.

    Returns X (n, d), y (n,) and the component of each row (-1 for the script's zero rows).
    """
    n, d = int(counts.sum()), means.shape[1]
    X, y, z = np.zeros((n, d)), np.zeros(n, dtype=int), np.full(n, -1)
    start = 0
    for m, k in enumerate(counts):  # a loop over the M components, not over rows
        Xm = means[m] + np.sqrt(scale) * rng.standard_normal((k, d))
        ym = (rng.random(k) < _sigmoid((Xm - means[m]) @ theta[m])).astype(int)
        rows = slice(0, k) if as_published else slice(start, start + k)
        X[rows], y[rows], z[rows] = Xm, ym, m
        start += k
    perm = rng.permutation(n)  # the script's sklearn.utils.shuffle
    return X[perm], y[perm], z[perm]


def _sigmoid(t):
    return 0.5 * (1.0 + np.tanh(0.5 * t))


def _make_reference(generator, n_clients, cap, n_components, n_features, alpha, n_test,
                    random_state) -> FederatedSplits:
    if generator not in _GENERATORS:
        raise ValueError(f"generator must be one of {list(_GENERATORS)}, got {generator!r}")
    rng = np.random.default_rng(random_state)
    M, d = int(n_components), int(n_features)
    cap = 1000 if cap is None else int(cap)
    as_published = generator == "reference-as-published"
    pis = rng.dirichlet(np.full(M, alpha), size=n_clients)
    sizes = np.minimum(rng.lognormal(4.0, 2.0, size=n_clients).astype(int) + 50, cap)
    theta = rng.uniform(-1.0, 1.0, size=(M, d))
    means = rng.uniform(-1.0, 1.0, size=(M, d))
    scale = 1.0 / np.sqrt(d)
    width = max(3, len(str(n_clients - 1)))
    train, test, test_counts = {}, {}, np.zeros((n_clients, M), dtype=int)
    for c in range(n_clients):
        cid = f"client{c:0{width}d}"
        X, y, _ = _reference_draw(rng, rng.multinomial(sizes[c], pis[c]), means, theta, scale,
                                  as_published)
        train[cid] = ClientData(X, y)
        test_counts[c] = rng.multinomial(int(n_test), pis[c])
        X, y, _ = _reference_draw(rng, test_counts[c], means, theta, scale, as_published)
        test[cid] = ClientData(X, y)
    names = [f"x{j}" for j in range(d)]
    out = FederatedSplits(FederatedDataset(train, names, target_name="y"), None,
                          FederatedDataset(test, names, target_name="y"))
    out.info = {"generator": generator, "pi": pis, "means": means, "directions": theta,
                "covariance_scale": scale, "test_counts": test_counts}
    return out


def fedgmm_bayes_proba(X: np.ndarray, info: dict, client: int, counts=None) -> np.ndarray:
    """The generator's true ``P(y = 1 | x)`` for client number ``client`` (its ``pi_c``).

    Thresholding it at 1/2 is the Bayes-optimal classifier of that client: its accuracy is the
    ceiling no method can beat in expectation.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    info : the ``info`` of :func:`make_fedgmm_synthetic`
    client : int
        Position of the client (``info["pi"][client]``).
    counts : ndarray of shape (M,) or None
        For ``"reference-as-published"``: the component counts of the draw ``X`` came from
        (``info["test_counts"][client]`` for the test rows). A row keeps the last component
        that wrote it, so component ``m`` owns ``max(0, n_m - max_{m' > m} n_m')`` rows; those
        shares replace ``pi_c``, and the rows ``x = 0`` (the script's unwritten rows) have
        ``y = 0``.

    Returns
    -------
    ndarray of shape (n_samples,)
    """
    X = np.asarray(X, dtype=np.float64)
    gen, means, dirs = info["generator"], info["means"], info["directions"]
    w = np.asarray(info["pi"][client], dtype=np.float64)
    if gen == "reference-as-published":
        counts = np.asarray(info["test_counts"][client] if counts is None else counts)
        later = np.r_[np.maximum.accumulate(counts[::-1])[::-1][1:], 0]
        w = np.maximum(counts - later, 0).astype(float)
        w /= w.sum()
    var = info.get("covariance_scale", 1.0)
    diff = X[:, None, :] - means[None]  # (n, M, d)
    proj = np.einsum("nmd,md->nm", diff, dirs)
    if gen == "paper":
        p_m = (proj > 0).astype(float)
    else:
        p_m = _sigmoid(proj)
    with np.errstate(divide="ignore"):
        logw = np.log(w)
    lj = logw[None] - 0.5 * np.einsum("nmd,nmd->nm", diff, diff) / var
    lj -= lj.max(axis=1, keepdims=True)
    post = np.exp(lj)
    post /= post.sum(axis=1, keepdims=True)
    proba = np.einsum("nm,nm->n", post, p_m)
    if gen == "reference-as-published":
        proba[~X.any(axis=1)] = 0.0
    return proba


def label_skew_partition(y: np.ndarray, n_clients: int, alpha: float,
                         random_state=None) -> list[np.ndarray]:
    """Label skew as federated benchmarks draw it: client ``c``'s class proportions
    ``q_c ~ Dir(alpha 1_K)``; the rows of class ``k`` are dealt to the clients in proportion to
    ``q_c(k)``. Small ``alpha`` (0.05) leaves many clients with a single class.

    Returns
    -------
    list of ``n_clients`` sorted index arrays partitioning ``range(len(y))`` (some may be
    empty when ``alpha`` is small and the data few).
    """
    rng = np.random.default_rng(random_state)
    y = np.asarray(y)
    classes = np.unique(y)
    q = rng.dirichlet(np.full(classes.size, float(alpha)), size=int(n_clients))
    parts: list[list[np.ndarray]] = [[] for _ in range(int(n_clients))]
    for k, label in enumerate(classes):
        idx = rng.permutation(np.flatnonzero(y == label))
        share = q[:, k] / q[:, k].sum()
        cuts = np.round(np.cumsum(share)[:-1] * idx.size).astype(int)
        for c, chunk in enumerate(np.split(idx, cuts)):
            parts[c].append(chunk)
    return [np.sort(np.concatenate(p)) for p in parts]


def _family_sampler(family: str, M: int, d: int, rng: np.random.Generator):
    """Components of one family: returns (sample(m, n) -> X, mean of component m)."""
    if family == "gaussian":
        mus = rng.standard_normal((M, d))
        return (lambda m, n: mus[m] + rng.standard_normal((n, d))), mus
    if family == "laplace":
        mus = rng.standard_normal((M, d))
        return (lambda m, n: rng.laplace(mus[m], 1.0, size=(n, d))), mus
    if family == "beta":
        a = rng.uniform(1.0, 10.0, size=(M, d))
        b = rng.uniform(1.0, 10.0, size=(M, d))
        return (lambda m, n: rng.beta(a[m], b[m], size=(n, d))), a / (a + b)
    raise ValueError(f"family must be 'gaussian', 'laplace' or 'beta', got {family!r}")


def make_fedgmm_nongaussian(
    family: str = "beta",
    partial: bool = False,
    n_clients: int = 30,
    n_samples_per_client: int = 3000,
    n_components: int = 3,
    n_features: int = 32,
    alpha: float = 0.4,
    fractions=(0.6, 0.2, 0.2),
    random_state=None,
) -> FederatedSplits:
    """The non-Gaussian settings of Table 3.

    Setting 1 (``partial=False``): ``M`` components of ``family`` ("beta": independent
    ``Beta(a_mj, b_mj)`` coordinates; "laplace": ``Laplace(mu_mj, 1)``), labels
    ``y = 1{(x - E x_m)^T v_m > 0}``, client weights ``Dir(alpha)``.
    Setting 2 (``partial=True``): the first two thirds of the clients draw from ``M`` Gaussian
    components, the others from ``M`` components of ``family`` (each with its own labelling).
    """
    rng = np.random.default_rng(random_state)
    M, d = int(n_components), int(n_features)
    fams = ["gaussian", family] if partial else [family]
    samplers = [_family_sampler(f, M, d, rng) for f in fams]
    dirs = [rng.standard_normal((M, d)) for _ in fams]
    dirs = [v / np.linalg.norm(v, axis=1, keepdims=True) for v in dirs]
    sizes = _client_sizes(rng, n_clients, n_samples_per_client)
    n_first = int(round(2 * n_clients / 3)) if partial else n_clients
    width = max(3, len(str(n_clients - 1)))
    clients = {}
    for c in range(n_clients):
        f = 0 if c < n_first else 1
        sample, centre = samplers[f]
        pi = rng.dirichlet(np.full(M, alpha))
        z = rng.choice(M, size=sizes[c], p=pi)
        X = np.empty((sizes[c], d))
        for m in range(M):
            rows = np.flatnonzero(z == m)
            X[rows] = sample(m, rows.size)
        y = (np.einsum("ij,ij->i", X - centre[z], dirs[f][z]) > 0).astype(int)
        clients[f"client{c:0{width}d}"] = ClientData(X, y)
    out = split_clients(clients, fractions, rng)
    out.info = {"family": family, "partial": partial}
    return out


# ---------------------------------------------------------------------------------------------
# 8x8 digits
# ---------------------------------------------------------------------------------------------
def transform_digits(images: np.ndarray, kind: str) -> np.ndarray:
    """Image transforms of section 4.5 / Appendix C.3 on (n, 8, 8) images in [0, 16].

    kind : "rotate" (90 degrees), "flip" (horizontal), "invert" (16 - x), "scale" (factor 0.5:
    the image shrunk to 4x4 by 2x2 averaging and centred on a blank 8x8 canvas), or a "+"-joined
    composition such as "scale+rotate+flip" (the paper's out-of-domain set).
    """
    out = np.asarray(images, dtype=np.float64)
    for k in kind.split("+"):
        if k == "rotate":
            out = np.rot90(out, k=1, axes=(1, 2))
        elif k == "flip":
            out = out[:, :, ::-1]
        elif k == "invert":
            out = 16.0 - out
        elif k == "scale":
            small = out.reshape(out.shape[0], 4, 2, 4, 2).mean(axis=(2, 4))
            canvas = np.zeros_like(out)
            canvas[:, 2:6, 2:6] = small
            out = canvas
        else:
            raise ValueError(
                f"unknown transform {k!r}; use rotate, flip, invert, scale or a '+' composition"
            )
    return np.ascontiguousarray(out)


def federated_pca(fd: FederatedDataset, n_components: int):
    """PCA from summed client statistics (``n``, ``sum x``, ``sum x x^T``; no rows move).

    Returns
    -------
    mean : ndarray of shape (d,)
    components : ndarray of shape (n_components, d)
        Leading eigenvectors of the pooled covariance (rows).
    """
    n = 0.0
    sx = sxx = None
    for _, cd in fd.items():  # each term is what one client would send
        n += cd.n_samples
        sx = cd.X.sum(0) if sx is None else sx + cd.X.sum(0)
        sxx = cd.X.T @ cd.X if sxx is None else sxx + cd.X.T @ cd.X
    mean = sx / n
    cov = sxx / n - np.outer(mean, mean)
    w, V = np.linalg.eigh(0.5 * (cov + cov.T))
    order = np.argsort(w)[::-1][: int(n_components)]
    comps = V[:, order].T
    comps *= np.sign(comps[np.arange(comps.shape[0]), np.abs(comps).argmax(1)])[:, None]
    return mean, comps


def make_fedgmm_digits(
    n_clients: int = 20,
    alpha: float = 0.4,
    transformed_fraction: float = 0.5,
    transforms: tuple[str, ...] = ("rotate", "flip", "invert"),
    permute_labels: bool = True,
    holdout_class: int | None = None,
    fractions=(0.6, 0.2, 0.2),
    random_state=None,
) -> FederatedSplits:
    """The scikit-learn 8x8 digits as a federation with joint-distribution heterogeneity.

    Labels are spread over clients by Dirichlet(``alpha``). A fraction ``transformed_fraction``
    of the images gets one of ``transforms`` (P_c(x) shift, section 4.1) and, when
    ``permute_labels``, the labels of those images go through one random permutation
    (P_c(y|x) shift). ``holdout_class`` removes that digit from every client (it is returned in
    ``info["holdout"]`` as raw images for novelty tests). Features are the 64 pixel values.

    Returns
    -------
    FederatedSplits with ``info``: ``holdout`` (X, y) or None, ``permutation``.
    """
    from sklearn.datasets import load_digits

    rng = np.random.default_rng(random_state)
    digits = load_digits()
    imgs, y = digits.images.astype(np.float64), digits.target.astype(int)
    holdout = None
    if holdout_class is not None:
        keep = y != holdout_class
        holdout = (imgs[~keep].reshape(-1, 64), y[~keep])
        imgs, y = imgs[keep], y[keep]
    n = y.size
    perm_labels = rng.permutation(10)
    tmask = rng.random(n) < transformed_fraction
    kinds = rng.integers(0, len(transforms), size=n)
    X = imgs.copy()
    for j, kname in enumerate(transforms):
        rows = np.flatnonzero(tmask & (kinds == j))
        X[rows] = transform_digits(imgs[rows], kname)
    y_obs = y.copy()
    if permute_labels:
        y_obs[tmask] = perm_labels[y[tmask]]
    parts = partition_by_labels(y, n_clients, alpha, rng, min_samples=30)
    width = max(3, len(str(n_clients - 1)))
    clients = {
        f"client{c:0{width}d}": ClientData(X[idx].reshape(-1, 64), y_obs[idx])
        for c, idx in enumerate(parts)
    }
    out = split_clients(clients, fractions, rng, [f"px{j}" for j in range(64)])
    out.info = {"holdout": holdout, "permutation": perm_labels}
    return out
