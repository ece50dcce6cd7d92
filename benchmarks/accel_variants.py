"""Which accelerated EM can reach a third of scikit-learn's iterations? A centralized prototype
that counts rounds (issue 23, done-when 1; the evidence behind ``engine/fedem/acceleration.py``).

A *round* is one message exchange: the server sends one or more points of the statistic space,
every client returns, for each point ``x``, its statistic at the parameters ``T(x)`` and its
log-likelihood there; the server sees the sums, i.e. ``F(x)`` (the EM map) and the mean
log-likelihood ``L(x)`` at ``T(x)``. Here the sums are computed on the pooled rows (NumPy, the
same numbers a federation's aggregate gives up to rounding), so only the rounds are counted.

Data and starts: ``rounds_to_tol.py``'s GMM (4 components, 5 dimensions, overlapping, 4,000
rows) from its common random start ("same start") and from scikit-learn's own k-means start
(``sklearn start``, taken from ``GaussianMixture._initialize_parameters``), against
``GaussianMixture(tol=1e-6).n_iter_``; its LCR (3 lines, 3,000 rows) against its flexmix-style
EM; ``rounds_to_tol.py``'s LCA (3 classes, 6 binary items) from a random start, against plain
EM on the pooled rows. Every variant stops by scikit-learn's rule on its accepted path: the
plain EM step from the accepted point changes the mean log-likelihood by less than tol (the
plain rounds equal scikit-learn's iterations exactly, which checks the counting).
``loglik >= central``: the log-likelihood at the returned parameters is at least the
reference's (to 1e-7).

Variants:

- ``plain``: EM, one point per round.
- ``squarem``: the engine's ``Federation(acceleration="squarem")`` state machine (S3 step,
  safeguard, one point per round; a cycle is two rounds, a refused extrapolation one more).
- ``A multi-point SQUAREM``: the extrapolation round also evaluates the plain point and shorter
  steps on the SQUAREM curve (4 points); the best is kept, so a refusal costs no round, but a
  cycle still needs two rounds (``F(F(x))`` cannot be asked before ``F(x)`` is known).
- ``B subspace Newton``: Newton on ``h(s) = F(s) - s`` restricted to the span ``U`` of the
  last two accepted steps and the last residual; the EM map's Jacobian along ``U`` is measured
  in the same round at the proposal (``x + eps u_j``, finite differences, up to 3 points). The
  proposal is ``F(a) + J U c`` with ``c`` the least-squares solution of
  ``(J - I) U c = -h(a)`` (one linearized EM map after the Newton step); the round also
  evaluates the plain point ``F(a)`` and the over-relaxed ``a + 2 h(a)``, ``a + 4 h(a)`` (they
  escape the plateaus where the map expands, eigenvalues above 1, and Newton steps backwards).
  One round per step; up to 7 points per round.
- ``B' secant Newton``: B without the finite-difference points: ``U`` is the span of the
  round's own candidates' differences from its plain point (the proposal and ``a + 3 h(a)``
  minus ``F(a)``) and ``J U`` the differences of their ``F`` values (secants); 3 points per
  round (the proposal, ``a + 3 h(a)``, ``F(a)``).
- ``B'' multi-secant Newton`` (what ``Federation(acceleration="newton")`` runs): B' whose
  subspace also keeps the secant pairs of the last two rounds (newest first, a pair nearly in
  the span of the newer ones dropped: Anderson-type memory at no extra point); 3 points.
- ``B exact Newton`` (``--exact``, slow): the same with ``U`` the whole statistic space (the
  full Jacobian, ``p + 1`` points per round): a reference for what the Jacobian alone gives.

    python benchmarks/accel_variants.py [--seeds 8 | --quick] [--tol 1e-6] [--exact]
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
from rounds_to_tol import flexmix_em, gmm_data, lcr_data
from scipy.linalg import solve_triangular
from sklearn.mixture import GaussianMixture
from threadpoolctl import threadpool_limits

REG = 1e-6  # scikit-learn's reg_covar; flexmix_em's variance floor


class GMMMap:
    """The EM map of a full-covariance Gaussian mixture in its statistic space
    ``s = (N_k, sum r x, sum r x x^T) / n`` (covariances as full ``d x d`` blocks)."""

    def __init__(self, X: np.ndarray, K: int):
        self.X, self.K = X, K
        self.n, self.d = X.shape
        self.XX = np.einsum("ni,nj->nij", X, X).reshape(self.n, -1)
        self.free = K * (1 + self.d + self.d * (self.d + 1) // 2)  # numbers a reply carries

    def params(self, s: np.ndarray):
        K, d = self.K, self.d
        N, m, S = s[:K], s[K:K + K * d].reshape(K, d), s[K + K * d:].reshape(K, d, d)
        if np.any(N <= 1e-12) or not np.all(np.isfinite(s)):
            return None
        mu = m / N[:, None]
        cov = S / N[:, None, None] - np.einsum("ki,kj->kij", mu, mu)
        return N / N.sum(), mu, 0.5 * (cov + cov.transpose(0, 2, 1)) + REG * np.eye(d)

    def estep(self, params):
        """``(statistic, mean log-likelihood)`` at the parameters (None, -inf off the domain)."""
        w, mu, cov = params
        try:
            chol = np.linalg.cholesky(cov)
        except np.linalg.LinAlgError:
            return None, -np.inf
        logp = np.empty((self.n, self.K))
        for k in range(self.K):
            z = solve_triangular(chol[k], (self.X - mu[k]).T, lower=True)
            logp[:, k] = (-0.5 * (z ** 2).sum(0) - np.log(np.diag(chol[k])).sum()
                          - 0.5 * self.d * np.log(2 * np.pi) + np.log(w[k]))
        ll = np.logaddexp.reduce(logp, axis=1)
        r = np.exp(logp - ll[:, None])
        s = np.concatenate([r.mean(0), (r.T @ self.X).ravel() / self.n,
                            (r.T @ self.XX).ravel() / self.n])
        return s, float(ll.mean())

    def basis(self) -> np.ndarray:
        """Orthonormal columns spanning the statistics with symmetric second moments."""
        K, d = self.K, self.d
        cols = list(np.eye(len(self.zero()))[:K + K * d])
        for k in range(K):
            for i in range(d):
                for j in range(i, d):
                    e = self.zero()
                    e[K + K * d + k * d * d + i * d + j] = e[K + K * d + k * d * d + j * d + i] = 1
                    cols.append(e / np.linalg.norm(e))
        return np.array(cols).T

    def zero(self) -> np.ndarray:
        return np.zeros(self.K * (1 + self.d + self.d * self.d))


class LCRMap:
    """The EM map of a mixture of linear regressions (flexmix_em's model) in its statistic
    space ``s = (N_k, sum r x x^T, sum r x y, sum r y^2) / n`` (``x`` with the intercept)."""

    def __init__(self, X: np.ndarray, y: np.ndarray, K: int):
        self.Xt, self.y, self.K = np.hstack([X, np.ones((len(X), 1))]), y, K
        self.n, self.q = self.Xt.shape
        self.XX = np.einsum("ni,nj->nij", self.Xt, self.Xt).reshape(self.n, -1)
        self.free = K * (1 + self.q * (self.q + 1) // 2 + self.q + 1)

    def params(self, s: np.ndarray):
        K, q = self.K, self.q
        N, A = s[:K], s[K:K + K * q * q].reshape(K, q, q)
        b, yy = s[K + K * q * q:K + K * q * q + K * q].reshape(K, q), s[-K:]
        if np.any(N <= 1e-12) or not np.all(np.isfinite(s)) \
                or np.any(np.linalg.eigvalsh(0.5 * (A + A.transpose(0, 2, 1))) <= 0):
            return None
        beta = np.linalg.solve(A, b[..., None])[..., 0]
        var = (yy - 2 * (b * beta).sum(1) + np.einsum("ki,kij,kj->k", beta, A, beta)) / N + REG
        return None if np.any(var <= 0) else (N / N.sum(), beta, var)

    def estep(self, params):
        w, beta, var = params
        logp = (-0.5 * np.log(2 * np.pi * var)
                - 0.5 * (self.y[:, None] - self.Xt @ beta.T) ** 2 / var + np.log(w))
        ll = np.logaddexp.reduce(logp, axis=1)
        r = np.exp(logp - ll[:, None])
        s = np.concatenate([r.mean(0), (r.T @ self.XX).ravel() / self.n,
                            (r.T @ (self.Xt * self.y[:, None])).ravel() / self.n,
                            r.T @ self.y ** 2 / self.n])
        return s, float(ll.mean())


class LCAMap:
    """The EM map of latent class analysis on binary items in its statistic space
    ``s = (N_k, sum r x) / n`` (item probabilities kept in ``[1e-10, 1 - 1e-10]``)."""

    def __init__(self, X: np.ndarray, K: int):
        self.X, self.K = X, K
        self.n, self.d = X.shape
        self.free = K * (1 + self.d)

    def params(self, s: np.ndarray):
        K = self.K
        N, m = s[:K], s[K:].reshape(K, self.d)
        if np.any(N <= 1e-12) or not np.all(np.isfinite(s)):
            return None
        return N / N.sum(), np.clip(m / N[:, None], 1e-10, 1 - 1e-10)

    def estep(self, params):
        w, P = params
        logp = self.X @ np.log(P).T + (1 - self.X) @ np.log1p(-P).T + np.log(w)
        ll = np.logaddexp.reduce(logp, axis=1)
        r = np.exp(logp - ll[:, None])
        return np.concatenate([r.mean(0), (r.T @ self.X).ravel() / self.n]), float(ll.mean())


class Rounds:
    """The federation seen from the server: each call of :meth:`round` is one exchange that
    evaluates ``F`` and ``L`` at every point sent."""

    def __init__(self, em):
        self.em, self.rounds, self.max_points = em, 0, 0
        self.path: list[float] = []  # the accepted points' objectives (B)
        self.plain_change = np.nan  # B: the last plain step's change of the objective

    def start(self, params0):
        """Round 1 (the initialization round): the clients' statistic at the start."""
        self.rounds = 1
        return self.em.estep(params0)

    def round(self, points: list[np.ndarray]) -> list[tuple[np.ndarray | None, float]]:
        self.rounds += 1
        self.max_points = max(self.max_points, len(points))
        out = []
        for x in points:
            p = self.em.params(x)
            out.append((None, -np.inf) if p is None else self.em.estep(p))
        return out


def valid(em, s: np.ndarray) -> bool:
    """Whether ``s`` is in the domain: an M-step with finite weights in (0, 1] and positive
    definite covariances (GMM) or design blocks and positive variances (LCR)."""
    p = em.params(s)
    if p is None or np.any(s[:em.K] < 0):
        return False
    if isinstance(em, GMMMap):
        try:
            np.linalg.cholesky(p[2] - 0.5 * REG * np.eye(em.d))
        except np.linalg.LinAlgError:
            return False
    return True


# ---- the variants: each returns (Rounds, the statistic whose M-step is the fit) ------------

def run_plain(em, params0, tol, max_rounds=5000):
    """EM: round k evaluates F at the last statistic; stop when L changes by < tol."""
    fed = Rounds(em)
    s, last = fed.start(params0)
    while fed.rounds < max_rounds:
        (fs, L), = fed.round([s])
        if abs(L - last) < tol:
            return fed, fs
        s, last = fs, L
    return fed, s


def squarem_step(s0, s1, s2, step_max, em):
    """SQUAREM's S3 extrapolation ``s0 + 2 a r + a^2 v`` (halved towards 1 while it leaves
    the domain): ``(point, a, whether a reached step_max)``; ``(s2, 1, ...)`` for a = 1."""
    r, v = s1 - s0, s2 - 2 * s1 + s0
    nv = np.linalg.norm(v)
    a = 1.0 if nv == 0 else min(max(np.linalg.norm(r) / nv, 1.0), step_max)
    hit = a >= step_max
    for _ in range(5):
        if a <= 1.0:
            break
        y = s0 + 2 * a * r + a * a * v
        if valid(em, y):
            return y, a, hit
        a = 1.0 + 0.5 * (a - 1.0)
    return s2, 1.0, hit


def run_squarem(em, params0, tol, step_max0=4.0, mstep=4.0, max_rounds=5000):
    """The engine's SQUAREM (rounds/accelerate.py's Accelerator), one point per round: a base
    round, its EM step, then the extrapolation, kept if its objective is at least the EM
    step's (else the plain ``s2`` is sent next); the stopping rule is tested only on a round
    sent the EM step of the round before."""
    fed = Rounds(em)
    x, last = fed.start(params0)
    base = pending = None
    sent_plain, step_max = True, step_max0
    while fed.rounds < max_rounds:
        (fx, L), = fed.round([x])
        if sent_plain and abs(L - last) < tol:
            return fed, fx
        last, out, check = L, fx, pending
        pending = None
        if check is not None and L < check[1] - 1e-12 * abs(check[1]):
            step_max, base, out = max(step_max0, step_max / mstep), None, check[0]
        elif base is None:
            base = (x, fx)
        else:
            out, _, hit = squarem_step(base[0], base[1], fx, step_max, em)
            step_max *= mstep if hit else 1.0
            pending = None if out is fx else (fx, L)
            base = None
        sent_plain, x = out is fx, out
    return fed, x


def run_multipoint_squarem(em, params0, tol, fracs=(1.0, 0.5, 0.25), step_max0=4.0,
                           mstep=4.0, max_rounds=5000):
    """A: two rounds per cycle; the extrapolation round evaluates the plain point ``F(F(x))``
    and the steps ``1 + f (a - 1)`` on the SQUAREM curve together and keeps the best (a
    refusal costs no round)."""
    fed = Rounds(em)
    x, last = fed.start(params0)
    (fx, Lx), = fed.round([x])
    if abs(Lx - last) < tol:
        return fed, fx
    step_max = step_max0
    while fed.rounds < max_rounds:
        (ffx, Lfx), = fed.round([fx])  # the plain EM step of the accepted point x
        if abs(Lfx - Lx) < tol:
            return fed, ffx
        _, a, hit = squarem_step(x, fx, ffx, step_max, em)
        step_max *= mstep if hit else 1.0
        r, v = fx - x, ffx - 2 * fx + x
        cands = [ffx] + [y for b in {1 + f * (a - 1) for f in fracs} if b > 1
                         for y in [x + 2 * b * r + b * b * v] if valid(em, y)]
        res = fed.round(cands)
        best = int(np.argmax([q[1] for q in res]))
        if abs(res[0][1] - Lfx) < tol:  # the plain step from fx changed L by < tol
            return fed, res[best][0]
        if best == 0 and len(cands) > 1:
            step_max = max(step_max0, step_max / mstep)
        x, fx, Lx = cands[best], res[best][0], res[best][1]
    return fed, fx


def directions(history: list[np.ndarray], h: np.ndarray, m: int) -> np.ndarray | None:
    """Orthonormal columns spanning the last ``m`` accepted steps and the residual ``h``."""
    cols = [history[i] - history[i - 1] for i in range(max(1, len(history) - m), len(history))]
    cols = [u / np.linalg.norm(u) for u in cols + [h] if np.linalg.norm(u) > 0]
    if not cols:
        return None
    Q, R = np.linalg.qr(np.array(cols).T)
    keep = np.abs(np.diag(R)) > 1e-10 * np.abs(R).max()
    return Q[:, keep] if keep.any() else None


def newton_candidates(em, a, fa, U, J, over) -> list[np.ndarray]:
    """The next round's points: the subspace-Newton proposal ``F(a) + J U c`` (``c`` the
    least-squares solution of ``(J - U) c = -h``, halved towards ``F(a)`` while it leaves the
    domain), the over-relaxed ``a + k h``, and last the plain point ``F(a)``."""
    h, out = fa - a, []
    if J is not None:
        c = np.linalg.lstsq(J - U, -h, rcond=None)[0]
        y = fa + J @ c
        for _ in range(6):
            if valid(em, y):
                out.append(y)
                break
            y = fa + 0.5 * (y - fa)
    out += [y for k in over for y in [a + k * h] if valid(em, y)]
    return out + [fa]


def secant_pairs(cands, res):
    """B': ``(U, J U)`` from the round's own secants only (QR, exactly dependent ones out)."""
    if len(cands) < 2:
        return None, None
    D = np.stack([c - cands[-1] for c in cands[:-1]], 1)
    G = np.stack([q[0] - res[len(cands) - 1][0] for q in res[:len(cands) - 1]], 1)
    Q, R = np.linalg.qr(D)
    keep = np.abs(np.diag(R)) > 1e-10 * np.abs(R).max()
    if not keep.any():
        return None, None
    Q, R, G = Q[:, keep], R[np.ix_(keep, keep)], G[:, keep]
    return Q, np.linalg.solve(R.T, G.T).T


def secants(cands, res, older=(), drop=0.1):
    """``(U, J U)`` from the round's own points: the differences of the candidates from the
    plain point (the last) and of their ``F`` values, orthonormalized (None when fewer than
    two points). ``older``: earlier rounds' pairs ``(D, G)`` (newest first) added as further
    directions (multi-secant); a column whose part outside the span of the columns before it
    is below ``drop`` of its norm is dropped (the oldest go first)."""
    if not older:
        return secant_pairs(cands, res)
    pairs = list(older)
    if len(cands) >= 2:
        D = np.stack([c - cands[-1] for c in cands[:-1]], 1)
        G = np.stack([q[0] - res[len(cands) - 1][0] for q in res[:len(cands) - 1]], 1)
        pairs.insert(0, (D, G))
    if not pairs:
        return None, None
    D, G = np.hstack([p[0] for p in pairs]), np.hstack([p[1] for p in pairs])
    keep, basis = [], []
    for j in range(D.shape[1]):
        v, n0 = D[:, j].copy(), np.linalg.norm(D[:, j])
        for q in basis:
            v -= (q @ v) * q
        if n0 > 0 and np.linalg.norm(v) > drop * n0:
            basis.append(v / np.linalg.norm(v))
            keep.append(j)
    if not keep:
        return None, None
    Q, R = np.linalg.qr(D[:, keep])
    return Q, np.linalg.solve(R.T, G[:, keep].T).T


def run_subspace_newton(em, params0, tol, m=2, over=(2.0, 4.0), exact=False, eps=1e-6,
                        secant=False, memory=0, max_rounds=5000):
    """B: one round per step; each round evaluates the candidates (the first with the
    Jacobian's directions ``x + eps u_j``) and keeps the best; it stops when the plain point's
    objective changed by < tol from the accepted point's (scikit-learn's rule). ``secant``:
    B' (``memory`` earlier rounds' secant pairs kept as further directions: B'')."""
    fed = Rounds(em)
    a, _ = fed.start(params0)
    (fa, La), = fed.round([a])
    basis = em.basis() if exact else None
    history, cands, best, older = [a], [fa], (La, fa), []
    fed.path.append(La)
    while fed.rounds < max_rounds:
        U = basis if exact else None if secant else directions(history, fa - a, m)
        dirs = [] if U is None else [cands[0] + eps * U[:, j] for j in range(U.shape[1])]
        res = fed.round(cands + dirs)
        best = max([best] + [(q[1], q[0]) for q in res], key=lambda t: t[0])
        fed.plain_change = res[len(cands) - 1][1] - La
        if abs(fed.plain_change) < tol:
            return fed, best[1]
        i = int(np.argmax([q[1] for q in res[:len(cands)]]))
        a, fa, La = cands[i], res[i][0], res[i][1]
        history.append(a)
        fed.path.append(La)
        fd = [q[0] for q in res[len(cands):]]
        J = None if not dirs or any(f is None for f in fd) else np.stack(
            [(f - res[0][0]) / eps for f in fd], 1)
        if secant:
            U, J = secants(cands, res, older)
            if memory and len(cands) >= 2:
                older = [(np.stack([c - cands[-1] for c in cands[:-1]], 1),
                          np.stack([q[0] - res[len(cands) - 1][0]
                                    for q in res[:len(cands) - 1]], 1))] + older[:memory - 1]
        cands = newton_candidates(em, a, fa, U, J, over)
    return fed, best[1]


VARIANTS = {
    "plain": (run_plain, "1"),
    "squarem (engine)": (run_squarem, "1"),
    "A multi-point SQUAREM": (run_multipoint_squarem, "up to 4"),
    "B subspace Newton": (run_subspace_newton, "up to 7"),
    "B' secant Newton": (lambda em, p0, tol: run_subspace_newton(em, p0, tol, secant=True,
                                                                 over=(3.0,)), "up to 3"),
    "B'' multi-secant Newton": (lambda em, p0, tol: run_subspace_newton(
        em, p0, tol, secant=True, over=(3.0,), memory=2), "up to 3"),
}


def gmm_cases(seed: int):
    """``[(case, map, start, scikit-learn's n_iter_ and score from that start)]``."""
    X, _, start = gmm_data(seed)
    em = GMMMap(X, 4)
    same = (start["weights_init"], start["means_init"], np.linalg.inv(start["precisions_init"]))
    g = GaussianMixture(4, random_state=seed)
    g._initialize_parameters(X, np.random.RandomState(seed))
    own = (g.weights_, g.means_, g.covariances_)
    out = []
    for label, params0 in (("GMM, same start", same), ("GMM, sklearn start", own)):
        sk = GaussianMixture(4, tol=TOL[0], max_iter=10_000, weights_init=params0[0],
                             means_init=params0[1],
                             precisions_init=np.linalg.inv(params0[2])).fit(X)
        out.append((label, em, params0, sk.n_iter_, sk.score(X)))
    return out


def lcr_cases(seed: int):
    X, y, _, start = lcr_data(seed)
    iters, ll = flexmix_em(X, y, start, TOL[0])
    beta = np.hstack([start["coef_init"], start["intercept_init"][:, None]])
    return [("LCR, same start", LCRMap(X, y, 3),
             (start["weights_init"], beta, start["noise_variance_init"]), iters, ll)]


def lca_cases(seed: int):
    """``rounds_to_tol.py``'s LCA data (3 classes, 6 binary items, 3,000 rows) from a random
    start; its reference is plain EM on the pooled rows (the ``plain`` rounds)."""
    rng = np.random.default_rng(seed)
    P = rng.uniform(0.2, 0.8, size=(3, 6))
    X = (rng.random((3000, 6)) < P[rng.integers(0, 3, 3000)]).astype(float)
    em = LCAMap(X, 3)
    start = (np.full(3, 1 / 3), rng.uniform(0.25, 0.75, size=(3, 6)))
    fed, s = run_plain(em, start, TOL[0])
    return [("LCA, random start", em, start, fed.rounds, em.estep(em.params(s))[1])]


TOL = [1e-6]


def measure(seeds: int, names: list[str]) -> list[tuple]:
    """Rows ``(case, seed, variant, rounds, central iterations, points, loglik ok)``, each
    printed as a Markdown row of the per-seed table."""
    rows = []
    for seed in range(seeds):
        for case, em, params0, iters, ll_c in gmm_cases(seed) + lcr_cases(seed) + lca_cases(seed):
            cells = []
            for name in names:
                if name == "B exact Newton" and not isinstance(em, GMMMap):
                    continue
                fed, s = VARIANTS[name][0](em, params0, TOL[0])
                ll = em.estep(em.params(s))[1]
                rows.append((case, seed, name, fed.rounds, iters, fed.max_points,
                             ll >= ll_c - 1e-7))
                cells.append(f"{name}: {fed.rounds}" + ("" if rows[-1][-1] else
                                                        f" ({ll - ll_c:+.1e})"))
            print(f"| {case} | {seed} | {iters} | {'; '.join(cells)} |", flush=True)
    return rows


def summary(rows: list[tuple], free: dict[str, int]) -> None:
    """The final table: per case and variant, points per round and the free numbers a
    client's reply then carries (what the saturation rule counts; the objectives aside),
    rounds / central iterations (median, range), the seeds ending at a log-likelihood at
    least the reference's."""
    print("\n| case | variant | points per round (free numbers per reply) "
          "| rounds / central: median (range) | loglik >= central |\n|---|---|---|---|---|")
    for case in dict.fromkeys(r[0] for r in rows):
        for name in dict.fromkeys(r[2] for r in rows if r[0] == case):
            sel = [r for r in rows if r[0] == case and r[2] == name]
            v = [r[3] / r[4] for r in sel]
            pts = max(r[5] for r in sel)
            print(f"| {case} | {name} | {VARIANTS[name][1]} ({pts * free[case]}) | "
                  f"{np.median(v):.2f} ({min(v):.2f}-{max(v):.2f}) | "
                  f"{sum(r[6] for r in sel)} of {len(sel)} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="2 seeds")
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--exact", action="store_true", help="also B with the full Jacobian")
    a = ap.parse_args()
    TOL[0] = a.tol
    names = list(VARIANTS)
    if a.exact:
        VARIANTS["B exact Newton"] = (
            lambda em, p0, tol: run_subspace_newton(em, p0, tol, exact=True), "p + 4")
        names.append("B exact Newton")
    print("| case | seed | central iterations | rounds per variant (loglik - central when "
          "below) |\n|---|---|---|---|")
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = measure(2 if a.quick else a.seeds, names)
    em_g, em_l = gmm_cases(0)[0][1], lcr_cases(0)[0][1]
    summary(rows, {"GMM, same start": em_g.free, "GMM, sklearn start": em_g.free,
                   "LCR, same start": em_l.free, "LCA, random start": 3 * (1 + 6)})


if __name__ == "__main__":
    main()
