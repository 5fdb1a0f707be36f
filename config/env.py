"""django-environ, strict: a bad value is one ``ImproperlyConfigured`` line that names it."""

from __future__ import annotations

import environ
from django.core.exceptions import ImproperlyConfigured

from locks.auth import FALSE_WORDS as FALSE  # the words for yes and no, as the HTTP trigger reads them
from locks.auth import TRUE_WORDS as TRUE

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
        """``environ.Env.email_url``, with a bad URL named (its password is not shown)."""
        try:
            return super().email_url(var, default=default, backend=backend)
        except (ValueError, ImproperlyConfigured) as exc:
            raise ImproperlyConfigured(
                f"{var}: {exc}; expected e.g. smtp+tls://user:password@host:587 or consolemail://"
            ) from None

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


def log_level(value: str) -> str:
    """A cast for ``Env``: one of the standard logging level names."""
    level = value.strip().upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}")
    return level
