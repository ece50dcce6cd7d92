"""The site's side of sovereignty: its own policy, its privacy ledger, the guard between them.

- :mod:`.policy`: :class:`SitePolicy`, the floors a site operator writes in a TOML file;
- :mod:`.ledger`: :class:`Ledger`, the append-only, hash-chained record of what left the site
  (every differential-privacy release written before its reply leaves), composed across fits
  against the lifetime budget of each data set;
- :mod:`.guard`: :class:`SiteGuard`, what a :class:`~fedlatent.engine.node.client.ClientNode`
  consults before it answers (a refused message gets a one-line reason: site, rule, fix;
  :func:`parse_refusal` reads ``(site, rule)`` back from what the server recorded);
- :mod:`.report`: the ledger as tables (``fedlatent site ledger`` / ``site report``).
"""

from fedlatent.engine.site.guard import SiteGuard, SiteRefused, parse_refusal
from fedlatent.engine.site.ledger import Ledger, LedgerError
from fedlatent.engine.site.policy import SitePolicy

__all__ = ["Ledger", "LedgerError", "SiteGuard", "SitePolicy", "SiteRefused", "parse_refusal"]
