"""``fedlatent site check`` says plainly when a policy trusts the server with the site's records
(issue 38): without differential privacy required, a server that crafts the parameters it
sends can rebuild them, and the library does not verify secure rounds yet."""

from __future__ import annotations

from typer.testing import CliRunner

from fedlatent.cli import app
from fedlatent.cli.site import TRUSTS_SERVER
from site_example import example_sites


def test_a_policy_without_required_privacy_is_told_it_trusts_the_server(tmp_path):
    f = tmp_path / "site.toml"
    f.write_text('[site]\ndirectory = "site"\n')
    res = CliRunner().invoke(app, ["site", "check", str(f)])
    assert res.exit_code == 0, res.output
    assert TRUSTS_SERVER in res.output


def test_the_example_policy_requiring_dp_or_verified_is_not(tmp_path):
    example = example_sites(tmp_path, ["c0"])["c0"]
    res = CliRunner().invoke(app, ["site", "check", str(example)])
    assert res.exit_code == 0, res.output
    assert "trusts the server" not in res.output
