"""django-environ, strict: a bad value is one ``ImproperlyConfigured`` line that names it."""

from __future__ import annotations

import environ
from django.core.exceptions import ImproperlyConfigured

from contests.text import FALSE_WORDS as FALSE  # the words for yes and no, as the HTTP trigger reads them
from contests.text import TRUE_WORDS as TRUE
from contests.text import without_userinfo

EXPECTED = {
    bool: "use 1/0, true/false, yes/no or on/off",
    int: "expected an integer",
    float: "expected a number",
}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class Env(environ.Env):
    """``environ.Env`` read literally and strictly.

    - A value that does not parse raises ``ImproperlyConfigured`` naming the
      variable (``environ.Env`` lets ``int()``'s ``ValueError`` escape).
    - A boolean is one of ``TRUE`` or ``FALSE`` (``environ.Env`` reads any other
      word as False); a float goes through ``float()`` (``environ.Env`` drops
      every character but digits, dots and commas, so ``1e3`` would be 13).
    - List items are stripped of spaces.
    - Set but empty means unset: the default applies.
    - A value that starts with ``$`` is taken as it is (``environ.Env`` would
      read it as the name of another variable; a secret key may start with ``$``).
    """

    def get_value(self, var, cast=None, default=environ.Env.NOTSET, parse_default=False):
        value = self.ENVIRON.get(var, "")
        if value == "":
            if default is self.NOTSET:
                raise ImproperlyConfigured(f"Set the {var} environment variable")
            return default
        try:
            return self.parse_value(value, cast)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{var}={value!r}: {EXPECTED.get(cast) or exc}") from None

    def email_url(self, var="EMAIL_URL", default=environ.Env.NOTSET, backend=None) -> dict:
        """``environ.Env.email_url``; a bad URL is named, and no part of its user name or
        password is shown (``check_userinfo``, ``url_error``)."""
        url = self.str(var, default)
        example = "expected e.g. smtp+tls://user:password@host:587 or consolemail://"
        check_userinfo(var, url)
        try:
            return self.email_url_config(url, backend=backend)
        except (ValueError, ImproperlyConfigured) as exc:
            raise url_error(var, url, exc, self.email_url_config, hint=example) from None

    @classmethod
    def parse_value(cls, value, cast):
        if cast is bool:
            word = value.strip().lower()
            if word not in TRUE + FALSE:
                raise ValueError(value)
            return word in TRUE
        if cast is float:
            return float(value)
        if cast is list:
            return [item.strip() for item in value.split(",") if item.strip()]
        return super().parse_value(value, cast)


# What a user name or password must percent-encode in a URL.
ENCODE = "/ as %2F, ? as %3F, # as %23, @ as %40, : as %3A, % as %25"


def check_userinfo(var: str, url: str) -> None:
    """Refuse a URL whose user name or password holds an unescaped ``/``, ``?`` or ``#``.

    Such a URL is split in the wrong place (``smtp://user:pa/ss@host`` has the host
    ``user`` and the port ``pa``), so a parser's message would quote a part of the
    password, and a password of digits would even pass as a port. The sign: an ``@``
    after the first ``/``, ``?`` or ``#`` that follows ``://``. Nothing of the URL is shown.
    """
    _scheme, separator, rest = url.partition("://")
    ends = [index for index in (rest.find(char) for char in "/?#") if index >= 0]
    if separator and ends and min(ends) > 0 and "@" in rest[min(ends) :]:
        raise ImproperlyConfigured(
            f"{var} is not a valid URL: an '@' follows a '/', '?' or '#', so a user name or password "
            f"holds one of them unescaped (or the path or query an '@'). Percent-encode them ({ENCODE}). "
            "The URL is not shown: it holds credentials."
        )


def url_error(
    var: str,
    url: str,
    exc: Exception,
    parse,
    *,
    hint: str,
    errors: tuple = (ValueError, ImproperlyConfigured),
) -> ImproperlyConfigured:
    """The error for a URL that ``parse`` refused with ``exc``, without any part of its
    user name or password: the message is the one ``parse`` gives for the URL without
    them (which quotes no credential), or, when that URL parses, a plain statement."""
    if without_userinfo(url) == url:
        return ImproperlyConfigured(f"{var}: {exc}; {hint}")
    try:
        parse(without_userinfo(url))
    except errors as public:
        return ImproperlyConfigured(f"{var}: {public}; {hint} (user name and password not shown)")
    return ImproperlyConfigured(
        f"{var}: the user name or password is not valid; percent-encode special characters in "
        f"them ({ENCODE}); {hint}"
    )


def log_level(value: str) -> str:
    """A cast for ``Env``: one of the standard logging level names."""
    level = value.strip().upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}")
    return level
