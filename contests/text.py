"""The project's text from outside (an API's answer, an exception, a URL from the environment)
made safe to log, store or return: no control character that could forge a log line, no
unbounded length, no credentials (docs/security.md, "What is protected, and by what"). The
locks app keeps its own few helpers (``locks.db``); this is the project's, for contests and config.
"""

from __future__ import annotations

import re
import reprlib
import traceback

# The words for yes and no of every boolean environment variable (config/env.py); the HTTP
# trigger's ?force= reads the same words (locks.views).
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")

# Characters of outside text kept in a log line, a stored error or a JSON answer.
LIMIT = 500
# Characters of a traceback kept on its JobRun: its end, where the exception is raised.
TRACEBACK_LIMIT = 10_000

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = LIMIT
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
_WHITESPACE = re.compile(r"\s+")


def safe_text(value: object, *, limit: int = LIMIT, quote: bool = False) -> str:
    """``value`` with every non-printable character escaped (a newline as ``\\n``, ESC as
    ``\\x1b``), cut to ``limit`` characters followed by "… (N more)".

    ``quote``: in quotes, as ``repr()`` shows a string. A value that is not a string is
    shown by a ``repr()`` whose size is bounded too (``reprlib``)."""
    if not isinstance(value, str):
        return _repr.repr(value)
    head, more = value[:limit], len(value) - limit
    if quote:
        shown = repr(head)
    else:
        shown = "".join(char if char.isprintable() else repr(char)[1:-1] for char in head)
    return f"{shown}… ({more} more)" if more > 0 else shown


def without_userinfo(url: str) -> str:
    """``url`` without its user name and password (``http://user:pw@host/api`` →
    ``http://host/api``), for every URL the project prints or stores.

    The user information ends at the last ``@`` before the first ``/``, ``?`` or ``#``
    after ``://``. A password with an unescaped ``/``, ``?`` or ``#`` leaves its ``@``
    after one of them; then everything up to the last ``@`` goes, which may cut more
    than the credentials but never shows a part of them."""
    scheme, separator, rest = url.partition("://")
    if not (separator and _SCHEME.fullmatch(scheme)):
        scheme, separator, rest = "", "", url  # no scheme: the whole is looked at
    if "@" not in rest:
        return url
    ends = [index for index in (rest.find(char) for char in "/?#") if index >= 0]
    authority = rest[: min(ends)] if ends else rest
    cut = authority.rfind("@") if "@" in authority else rest.rfind("@")
    return f"{scheme}{separator}{rest[cut + 1 :]}"


def error_text(exc: BaseException) -> str:
    """ "OperationalError: no such table: x": on one line, control characters escaped, at
    most ``LIMIT`` characters of the text (it may come from outside)."""
    return f"{type(exc).__name__}: {safe_text(_WHITESPACE.sub(' ', str(exc)).strip()) or 'no details'}"


def traceback_text(exc: BaseException, *, limit: int = TRACEBACK_LIMIT) -> str:
    """``exc``'s formatted traceback, at most ``limit`` characters: when longer, its end
    (the innermost frames and the exception itself), after a line saying how much was cut.
    Control characters other than newlines are escaped (a message may come from outside)."""
    text = "".join(traceback.format_exception(exc))
    text = "\n".join(safe_text(line, limit=len(line)) for line in text.splitlines())
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    tail = text[cut:]
    return f"… ({cut} characters cut)\n{tail[tail.find(chr(10)) + 1 :] if chr(10) in tail else tail}"
