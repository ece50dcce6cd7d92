"""The sites of a fit that chooses a size (``n_components="auto"``...): every candidate is
compared on the same sites, and the chosen size is fitted on every site that admits it.

A site refuses a candidate by a disclosure rule or its own policy when a reply of that size
would determine its records (the saturation rule counts the reply's free numbers, which grow
with the size). The candidates are fitted and scored on the sites that admit every candidate
(their scores then compare); the chosen size is fitted again on every site that admits it when
that is more sites, and the sites it leaves out are named in one warning
(``excluded_clients_``). When the sites admitting every candidate are fewer than the
federation's ``min_clients``, the candidates refused by the most sites are not fitted
(``selection_scores_["error"]`` says why) until they are not.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from fedlatent.data.validation import name_list
from fedlatent.engine.contract.selection import Selection, adopt_candidate
from fedlatent.engine.faults import FederatedFitError
from fedlatent.engine.protocol.runtime import SiteSubset
from fedlatent.engine.rounds.fitsetup import site_refusals, warn_excluded

__all__ = ["SelectionSites", "chosen_sites", "finish_selection", "selection_sites"]


@dataclass
class SelectionSites:
    """The sites of a size selection.

    Attributes
    ----------
    refusals : dict of int to dict of str to str
        Each candidate's refusing sites, and why.
    common : dict of str to str
        The sites left out of every candidate's fit (those refusing a candidate fitted).
    clients : list of str
        Every site of the federation, in client order.
    """

    refusals: dict[int, dict[str, str]] = field(default_factory=dict)
    common: dict[str, str] = field(default_factory=dict)
    clients: list[str] = field(default_factory=list)


def selection_sites(est, fd, runtime, selection: Selection
                    ) -> tuple[Any, Any, Selection, SelectionSites]:
    """``(fd, runtime, selection, sites)`` for fitting the candidates of ``selection``: the
    data or runtime without the sites some candidate fitted is refused by, the selection with
    the candidates not fitted (:attr:`Selection.refused`), and what :func:`finish_selection`
    needs. Each candidate's refusals come from its setup alone (on the part of ``fd`` it would
    be fitted on, when the selection holds rows out)."""
    from sklearn.base import clone

    fed = est._federation()
    ids = list(runtime.client_ids if runtime is not None else fd.client_ids)
    sites = SelectionSites(clients=ids)
    if fed.on_refusal != "exclude":
        return fd, runtime, selection, sites
    remote = getattr(fd, "is_remote", False)
    probe = selection.split(fd)[0] if selection.split is not None and not remote else fd
    for k in selection.candidates:
        cand = clone(est).set_params(**{selection.param: int(k)})
        try:
            ctx = cand._bare_context(probe, runtime)
        except ValueError:  # this size cannot be fitted at all: its fit says why (select)
            sites.refusals[int(k)] = {}
            continue
        sites.refusals[int(k)] = site_refusals(ctx.runtime, ctx.model, fed)
    least = fed.fewest_clients(len(ids))
    fitted = sorted(selection.candidates, key=lambda k: (len(sites.refusals[k]),
                                                         selection.candidates.index(k)))
    refused = {}
    while len(ids) - len(_union(sites.refusals, fitted)) < least and len(fitted) > 1:
        k = fitted.pop()  # the candidate refused by the most sites
        refused[k] = _refused_text(selection.param, k, len(ids) - len(sites.refusals[k]),
                                   least)
    sites.common = _union(sites.refusals, fitted)
    kept = [c for c in ids if c not in sites.common]
    if len(kept) < least:
        raise FederatedFitError(
            f"setup: {len(sites.common)} of {len(ids)} clients refuse every candidate "
            f"{selection.param} by a disclosure rule or their own policy, leaving {len(kept)}, "
            f"fewer than Federation(min_clients={least})", faults=sites.common)
    selection = replace(selection, refused=refused) if refused else selection
    if sites.common:
        fd, runtime = _without(fd, runtime, sites.common, kept)
    return fd, runtime, selection, sites


def chosen_sites(fd, runtime, sites: SelectionSites, k: int):
    """``(fd, runtime)`` of the sites that admit size ``k`` (``fd``/``runtime``: the whole
    federation): where :func:`finish_selection` fits the chosen size."""
    own = sites.refusals.get(int(k), {})
    if not own:
        return fd, runtime
    return _without(fd, runtime, own, [c for c in sites.clients if c not in own])


def finish_selection(est, fd, runtime, sites: SelectionSites, param: str,
                     fit_kwargs: dict[str, Any], refit: bool = True):
    """After the candidates' fits: the chosen size fitted again on every site that admits it
    when that is more sites than the candidates were compared on (``est`` takes that fit's
    attributes, keeping ``selection_scores_``; ``refit=False``: ``est`` already fitted it
    there, :func:`chosen_sites`); ``excluded_clients_`` and the one warning.
    ``fd``/``runtime``: the whole federation. Returns ``est``."""
    from sklearn.base import clone

    chosen = int(getattr(est, f"{param}_"))
    own = sites.refusals.get(chosen, {})
    if refit and set(own) != set(sites.common):  # the chosen size admits more sites: refit
        data, rt = chosen_sites(fd, runtime, sites, chosen)
        best = clone(est).set_params(**{param: chosen})
        best.fit(data, runtime=rt, **fit_kwargs)
        adopt_candidate(est, best, param, est.selection_scores_)
    est.excluded_clients_ = dict(own)
    est.history_.excluded = dict(own)
    if own or sites.common:
        also = {c: why for c, why in sites.common.items() if c not in own}
        note = (f"; {param}={chosen} was chosen on the {len(sites.clients) - len(sites.common)} "
                f"sites every candidate fitted admits (also left out of that comparison: "
                f"{name_list(list(also))})") if also else ""
        if own:
            warn_excluded(own, len(sites.clients) - len(own), note)
        else:
            from fedlatent.engine.warn import SitesExcludedWarning, warn_user

            warn_user(f"{param}={chosen} was chosen on the {len(sites.clients) - len(also)} "
                      f"sites every candidate fitted admits, and fitted on all "
                      f"{len(sites.clients)}: left out of the comparison {name_list(list(also))}"
                      " (their refusals of larger candidates are in the log)",
                      SitesExcludedWarning)
    return est


def _union(refusals: dict[int, dict[str, str]], ks) -> dict[str, str]:
    out: dict[str, str] = {}
    for k in ks:
        for c, why in refusals[k].items():
            out.setdefault(c, why)
    return out


def _without(fd, runtime, gone, kept):
    """The data (in-process) or the runtime without the sites ``gone``."""
    if runtime is not None:
        return fd, SiteSubset(runtime, gone)
    return fd.subset(kept), None


def _refused_text(param: str, k: int, admitting: int, least: int) -> str:
    """Why candidate ``k`` is not fitted: with it, fewer sites than ``min_clients`` would admit
    every candidate."""
    return (f"{param}={k} is not fitted: only {admitting} site(s) admit it (a disclosure rule "
            f"or their own policy refuses it at the others), and the candidates are compared "
            f"on the sites admitting every one, which must be at least "
            f"Federation(min_clients={least})")
