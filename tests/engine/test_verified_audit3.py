

# ---- a site lying for the server: an honest site named the liar with no search ---------------
class NamesAnHonestSite(InProcessRuntime):
    """``LIAR`` (colluding with the server) adds 500 to every entry of its round-``AT``
    reply, so the aggregate really fails; the server runs no group test and names
    ``DROPPED`` (honest) as the liar, excluding it from round ``AT + 1``, which asks round
    ``AT``'s question again. Records the E-step sums (``sums``) and ``DROPPED``'s round-``AT``
    reply (``own``), as :class:`HidesLeaves`."""

    LIAR = "c1"

    def __init__(self, fd, monkeypatch, **kw):
        super().__init__(fd, policies=SitePolicy(public_starts=True), **kw)
        self.sums, self.own = {}, {}
        monkeypatch.setattr(secure_checks, "locate", lambda rounds, plan, S: (DROPPED, "named"))
        total, answer, rt = secure_mod.SecureChannel.sum, secure_checks.answer_secure, self

        def summed(channel, method, msgs, *, round, exchange, weights=None):
            res = total(channel, method, msgs, round=round, exchange=exchange, weights=weights)
            if method == "estep" and exchange == "estep":
                rt.sums[int(round)] = {k: np.asarray(v) for k, v in res["sums"].items()
                                       if k.startswith("delta/")}
            return res

        def answer_secure(node, method, msg):
            out = answer(node, method, msg)
            if method == "estep" and node.client_id == DROPPED and int(msg["round"]) == AT:
                rt.own = {k: np.asarray(v) for k, v in out.items() if k.startswith("delta/")}
            if method == "estep" and node.client_id == rt.LIAR and int(msg["round"]) == AT:
                out = {k: v + 500.0 if k.startswith("delta/") else v for k, v in out.items()}
            return out

        monkeypatch.setattr(secure_mod.SecureChannel, "sum", summed)
        monkeypatch.setattr(secure_checks, "answer_secure", answer_secure)


def test_a_site_named_the_liar_with_no_search_is_not_differenced_out(monkeypatch):
    """Verified: on the code before, every site checked round ``AT``'s aggregate failed and
    answered its question again without ``DROPPED``: the two sums, less the lie the colluder
    knows, differed by ``DROPPED``'s reply (to 5e-9, relative), with no group test spent
    (the docs bound such differences by the fit's group tests). A site that answered no
    group test of a discarded round answers it again only over every neighbour of its sum:
    every other site refuses to reveal, naming ``DROPPED``; no sum of round ``AT + 1``."""
    fd = six_sites(3.0)
    rt = NamesAnHonestSite(fd, monkeypatch, record=True)
    est = fl.FederatedGaussianMixture(
        n_components=3, n_init=1, tol=0.0, max_rounds=AT + 2, random_state=0,
        federation=fl.Federation(secure_aggregation=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(FederatedFitError, match=rf"^round {AT + 1}, exchange 'estep'"):
            est.fit(fd, runtime=rt)
    assert rt.own and AT in rt.sums
    assert AT + 1 not in rt.sums
    refusals = [str(r[ERROR_KEY]) for d, c, meth, r in rt.log
                if d == "up" and meth == "secagg" and ERROR_KEY in r]
    assert len(refusals) == 5 and all(
        f"[{DROPPED!r}] took part in the sum of the exchange before but are not survivors"
        in s for s in refusals), refusals
