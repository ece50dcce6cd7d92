"""``[verification] public-starts`` (issue 38): a site that verifies rounds refuses a start it
cannot replay unless this key says otherwise; ``fedlatent site check`` validates the key and
warns when it is on."""

import pytest
from typer.testing import CliRunner

from fedlatent.cli import app
from fedlatent.engine.site.policy import PolicyError, SitePolicy


def test_public_starts_is_off_by_default_and_read_from_the_file():
    assert SitePolicy().public_starts is False
    assert SitePolicy.from_dict({}).public_starts is False
    pol = SitePolicy.from_dict({"verification": {"public-starts": True}})
    assert pol.public_starts is True
    assert ("verification.public-starts", "True") in pol.describe()


def test_a_value_that_is_not_a_bool_or_another_key_is_refused():
    with pytest.raises(PolicyError, match=r"^site policy: verification\.public_starts must be "
                                          r"true or false, got 'yes'$"):
        SitePolicy.from_dict({"verification": {"public-starts": "yes"}})
    with pytest.raises(PolicyError, match=r"unknown key"):
        SitePolicy.from_dict({"verification": {"public-start": True}})


def test_site_check_warns_that_the_server_then_chooses_the_first_round(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text("[verification]\npublic-starts = true\n")
    out = CliRunner().invoke(app, ["site", "check", str(path)])
    assert out.exit_code == 0, out.output
    assert "verification.public-starts = true: a start the site cannot replay" in " ".join(
        out.output.split())
    path.write_text("[verification]\npublic-starts = 1\n")
    bad = CliRunner().invoke(app, ["site", "check", str(path)])
    assert bad.exit_code != 0
    assert "verification.public_starts must be true or false, got 1" in " ".join(
        bad.output.split())
