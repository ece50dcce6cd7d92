"""A site's sovereignty on Flower's simulation engine (issue 21), where every message is answered
by a fresh ClientApp process: each partition's policy file names the site's signing key and the
consortium's roster; a secure and differentially private GMM runs with signed key-agreement
keys verified against the roster, every site's ledger (its anchor signed) records the plan's
releases and composes to ``privacy_spent_``, the site states are signed; then a second fit
whose plan would exceed a site's lifetime budget is refused at its setup, before any release.
"""

import warnings

import numpy as np
import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray")
pytest.importorskip("dp_accounting")
pytest.importorskip("cryptography")

import fedlatent as fl  # noqa: E402
from fedlatent.engine.node.site_state import read_site_state  # noqa: E402
from fedlatent.engine.site import Ledger  # noqa: E402
from fedlatent.engine.site.keys import Roster, SiteKeys  # noqa: E402

pytestmark = [pytest.mark.flower, pytest.mark.slow,
              pytest.mark.usefixtures("one_ray")]  # Ray started once per worker

DELTA = 1e-5


def _gmm(epsilon, seed=3):
    return fl.FederatedGaussianMixture(2, max_rounds=1, random_state=seed, federation=fl.Federation(
        privacy=fl.DifferentialPrivacy(epsilon, DELTA, clip=6.0), secure_aggregation=True))


def test_a_secure_private_fit_with_signed_sites_then_a_fit_beyond_the_lifetime_budget(tmp_path):
    from fedlatent.runtime.flower import simulate

    rng = np.random.default_rng(0)
    fd = fl.FederatedDataset.from_arrays(
        {f"site-{i}": rng.normal(size=(60, 2)) + 3.0 * (i % 2) for i in range(3)})
    keys = {c: SiteKeys.generate() for c in fd.client_ids}
    (tmp_path / "roster.json").write_text(Roster({c: k.public_key for c, k in keys.items()})
                                          .to_json())
    policies = {}
    for i, c in enumerate(fd.client_ids):
        keys[c].save(tmp_path / f"key-{i}.pem")
        policies[c] = tmp_path / f"policy-{i}.toml"
        policies[c].write_text(
            f'[site]\nname = "{c}"\ndirectory = "site-{i}"\nsigning-key = "key-{i}.pem"\n'
            'roster = "roster.json"\n[secure-aggregation]\nrequired = true\n'
            "[privacy]\nrequired = true\nlifetime-epsilon = 2.5\nlifetime-delta = 1e-5\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        est = simulate(_gmm(2.0), fd, workdir=tmp_path / "w1", num_cpus=2, policies=policies)
    assert est.flower_status_["status"] == "ok"
    plan = est.privacy_calibration_.releases
    spent = {}
    for i, c in enumerate(fd.client_ids):
        ledger = Ledger(tmp_path / f"site-{i}", c, keys=keys[c])  # the signed anchor verified
        assert [e["release"] for e in ledger.of("release")] == list(range(1, plan + 1))
        assert len(ledger.of("secagg-keys")) == 1 and ledger.of("refusal") == []
        spent[c] = ledger.lifetime_epsilon(ledger.of("release")[0]["dataset"], DELTA)
        assert spent[c] == pytest.approx(est.privacy_spent_[0], rel=1e-9)
        (where,) = (tmp_path / "w1" / "data").glob(f"*-{c}.site")  # beside the node's file
        state = read_site_state(where, trust=Roster({c: keys[c].public_key}))
        assert state.client_id == c
    # the server asks for a second fit (another run) of epsilon 2: composed, 2.95 > 2.5
    with pytest.raises(Exception, match=r"refused \(privacy.lifetime-epsilon\): this plan "
                                        r"would bring data set '.*' to epsilon="):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fl.ConvergenceWarning)
            simulate(_gmm(2.0, seed=4), fd, workdir=tmp_path / "w2", num_cpus=2,
                     policies=policies)
    for i, c in enumerate(fd.client_ids):
        ledger = Ledger(tmp_path / f"site-{i}", c, keys=keys[c])
        assert len(ledger.of("release")) == plan  # nothing released by the second fit
        assert [e["rule"] for e in ledger.of("refusal")] == ["privacy.lifetime-epsilon"]
