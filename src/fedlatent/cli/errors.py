"""The library's messages in the command line's words.

The library says how to fix a refusal in Python (``Federation(disclosure=DisclosurePolicy(
min_records=5))``, ``fit it with privacy=None``, ``raise max_rounds or tol``); on the command line
:func:`cli_words` says it with the options of the option tables (``--min-records 5``, ``fit it
without --privacy``, ``raise --max-rounds or --tol``). Every ``error:`` and ``warning:`` line goes
through it (:func:`fedlatent.cli.common.user_errors`).

A fit that stops naming several clients (a :class:`~fedlatent.engine.faults.FederatedFitError`
with ``faults``) prints one line per client (:func:`fault_lines`: ten, then a count) instead of
joining every reason into one line.
"""

from __future__ import annotations

import functools
import re

__all__ = ["cli_words", "fault_lines", "flag_names"]

_VALUE = r"(?:'[^']*'|\"[^\"]*\"|\.\.\.|[\w.+-]+)"
_PAIR = re.compile(rf"\b([a-z_][a-z0-9_]*)=({_VALUE})")


def flag_names() -> tuple[dict[str, str], dict[str, str], tuple[str, ...]]:
    """``(parameter -> flag, Federation setting -> flag, estimator class names)`` over the
    option tables of the models imported so far (the running command's among them: no other
    model is imported to say one message)."""
    from ..engine.contract.registry import estimator_entries

    return _flag_names(tuple(estimator_entries(discover_all=False).values()))


@functools.cache
def _flag_names(entries) -> tuple[dict[str, str], dict[str, str], tuple[str, ...]]:
    from .options import model_table

    params: dict[str, str] = {}
    federation: dict[str, str] = {}
    classes = []
    for entry in entries:
        classes.append(entry.cls.__name__)
        for row in model_table(entry):
            if row.hidden:
                continue
            (federation if row.goes == "federation" else params).setdefault(row.name, row.flag)
    params.update({"checkpoint": "--checkpoint", "resume": "--resume"})
    return params, federation, tuple(classes)


def _option(name: str, value: str, flags: dict[str, str]) -> str | None:
    """``--flag VALUE`` of ``name=value`` (None: not an option's)."""
    flag = flags.get(name)
    if flag is None:
        return None
    value = value.strip("'\"")
    if value == "True":
        return flag
    if value == "False":
        return f"--no-{flag[2:]}"
    if value == "None":
        return "--acceleration none" if flag == "--acceleration" else f"no {flag}"
    if value == "...":
        return flag
    return f"{flag} {value}"


def _pairs(text: str, flags: dict[str, str]) -> str:
    return _PAIR.sub(lambda m: _option(m.group(1), m.group(2), flags) or m.group(0), text)


_INNER_PAIR = re.compile(r"\b(\w+)=(\([^()]*\)|'[^']*'|\"[^\"]*\"|[^,\s)]+)")


def _privacy(inner: str) -> str:
    extra = []
    for k, v in _INNER_PAIR.findall(inner):
        if v == "..." or k in ("epsilon", "delta", "clip"):
            continue
        v = v.strip("'\"")
        if v.startswith("("):  # a tuple is a JSON list on the command line
            v = "[" + ",".join(x.strip() for x in v[1:-1].split(",")) + "]"
        extra.append(f"{k}={v}")
    return "--privacy " + ",".join(["epsilon=E,delta=D,clip=C", *extra])


def _disclosure(inner: str) -> str:
    pairs = [(k, v.strip("'\"")) for k, v in _PAIR.findall(inner)]
    if len(pairs) == 1 and pairs[0][0] == "min_records" and pairs[0][1] != "...":
        return f"--min-records {pairs[0][1]}"
    if [k for k, _ in pairs] == ["min_records"]:
        return "--min-records N"
    if not pairs or any(v == "..." for _, v in pairs):
        names = ",".join(k for k, _ in pairs) or "KEY"
        return f"--disclosure {names}=VALUE"
    return "--disclosure " + ",".join(f"{k}={v}" for k, v in pairs)


_RULES: list[tuple[re.Pattern, object]] = [
    (re.compile(r"(?:fl\.)?DisclosurePolicy\.off\(\)"), "--disclosure off"),
    (re.compile(r"(?:fl\.)?DifferentialPrivacy\(((?:[^()]|\([^()]*\))*)\)"),
     lambda m: _privacy(m.group(1))),
    (re.compile(r"(?:fl\.)?DisclosurePolicy\(([^()]*)\)"), lambda m: _disclosure(m.group(1))),
    (re.compile(r"\bDisclosurePolicy\b"), "--disclosure"),
    (re.compile(r"(?:fl\.)?Quantizer\([^()]*\)"), "--quantize LEVELS"),
    (re.compile(r"(?:fl\.)?Spider\([^()]*\)"),
     "--variance-reduction inner_rounds=N,batch_size=B"),
    (re.compile(r"\bwith privacy=None\b"), "without --privacy"),
    (re.compile(r"\bprivacy=(--privacy [^\s,;)]*)"), r"\1"),
    (re.compile(r"\bdisclosure=(--(?:disclosure|min-records) [^\s;)]*)"), r"\1"),
    (re.compile(r"\bdisclosure=\.\.\."), "--disclosure KEY=VALUE"),
    (re.compile(r"\bprivacy=\.\.\."), "--privacy epsilon=E,delta=D,clip=C"),
    (re.compile(r"\bvariance_reduction=(--variance-reduction [^\s;)]*)"), r"\1"),
    (re.compile(r"\bquantizer=(--quantize LEVELS)"), r"\1"),
]


def _calls(text: str, classes: tuple[str, ...], params: dict[str, str],
           federation: dict[str, str]) -> str:
    """``Federation(a=1, b=True)`` and ``HLCR(n_clusters=2)`` as their options."""
    def federation_call(m: re.Match) -> str:
        return ", ".join(_pairs(p, federation) for p in m.group(1).split(", "))

    text = re.sub(r"(?:fl\.)?Federation\(([^()]*)\)", federation_call, text)
    if classes:
        names = "|".join(map(re.escape, classes))
        text = re.sub(rf"\b(?:fl\.)?(?:{names})\(([^()]*)\)",
                      lambda m: ", ".join(_pairs(p, params) for p in m.group(1).split(", ")),
                      text)
    return text


def cli_words(text: str) -> str:
    """``text`` (a library message) with its Python spellings of settings replaced by the
    command line's options."""
    if "=" not in text and "(" not in text and "_" not in text:
        return text
    params, federation, classes = flag_names()
    quoted: list[str] = []

    def keep(m: re.Match) -> str:  # an example in quotes ('epsilon=1,delta=1e-5') stays
        quoted.append(m.group(0))
        return f"\0{len(quoted) - 1}\0"

    text = re.sub(r"(?<![=\w])'[^']*'", keep, text)
    for pattern, repl in _RULES:
        text = pattern.sub(repl, text)
    # the KEY=VALUE lists of the options just written are the options' own words
    text = re.sub(r"--(?:privacy|disclosure|variance-reduction) [^\s;)]+", keep, text)
    text = _calls(text, classes, params, federation)
    text = re.sub(r"\bfederation=(?=\0|--)", "", text)
    both = {**federation, **params}
    text = _pairs(text, both)
    # bare names of settings in prose: "raise max_rounds or tol", "give n_categories"
    text = re.sub(r"(?<![\w'\"=-])([a-z]+(?:_[a-z0-9]+)+)(?![\w'\"=(])",
                  lambda m: both.get(m.group(1), m.group(1)), text)
    text = re.sub(r"\b(raise|or) tol\b", r"\1 --tol", text)
    # a count left to the model is 'auto' on the command line (-k auto), None in Python
    text = re.sub(r"(--components\b[^.;]*?) or None\b", r"\1 or auto", text)
    return re.sub("\0(\\d+)\0", lambda m: quoted[int(m.group(1))], text)


def fault_lines(message: str, faults: dict[str, str], limit: int | None = None) -> list[str]:
    """The lines of a fit that stopped naming ``faults`` (client -> reason): the message
    without its joined list of reasons, then one line per reason in the command line's words
    naming its clients (``limit`` names at most, then a count)."""
    from ..data.validation import NAMES_SHOWN, name_list
    from ..engine.protocol.messages import fault_detail

    limit = NAMES_SHOWN if limit is None else limit
    detail = fault_detail(faults)
    n = len(faults)
    noun = "client" if n == 1 else "clients"
    head = message.replace(detail, f"{n} {noun} (below)") if detail in message else message
    groups: dict[str, list[str]] = {}
    for client, why in faults.items():
        groups.setdefault(cli_words(" ".join(str(why).split())), []).append(str(client))
    lines, shown = [cli_words(head)], 0
    for why, clients in groups.items():
        if shown >= limit:
            break
        if len(clients) == 1 and why.startswith(f"site {clients[0]!r}"):
            lines.append(f"  {why}")
        else:
            who = "client" if len(clients) == 1 else "clients"
            lines.append(f"  {who} {name_list(clients)}: {why}")
        shown += 1
    if len(groups) > shown:
        rest = sum(len(c) for c in list(groups.values())[shown:])
        lines.append(f"  ... and {rest} more {'client' if rest == 1 else 'clients'}")
    return lines
