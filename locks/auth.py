"""Who is asking, and what a flag they send means: the bearer token, the client address,
yes or no. Imports nothing that needs settings: the project's settings use ``boolean``."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from typing import TYPE_CHECKING

from django.conf import settings

if TYPE_CHECKING:
    from django.http import HttpRequest


# The words for yes and no: a trigger's ?force= here, every boolean variable in config/env.py.
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def boolean(word: str) -> bool | None:
    """``word`` as yes (True) or no (False), case and spaces aside; None when it is neither."""
    word = word.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    return None


def bearer_token_matches(request: HttpRequest, expected: str) -> bool:
    """``Authorization: Bearer <expected>``, compared in constant time.

    Both sides are hashed first so neither the content nor the length of the
    token shows in the timing. An empty ``expected`` never matches.
    """
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        given = ""
    match = hmac.compare_digest(_digest(given.strip()), _digest(expected))
    return match and bool(expected)


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


# The longest textual IPv6 address is 45 characters; a zone id adds a few. Anything
# longer is not an address (and would not fit the rate limit's key).
MAX_ADDRESS_LENGTH = 64


def client_address(request: HttpRequest) -> str:
    """The address of the client, not spoofable by default.

    With ``LOCKS_TRUSTED_PROXY_COUNT = 0`` it is the TCP peer (``REMOTE_ADDR``) and
    X-Forwarded-For is ignored. With N trusted proxies, each appends the address
    it saw, so the client is the N-th entry from the right; entries further left
    were written by the client and are never used. That entry is parsed and
    written in one canonical form, so one client is one rate-limit key; anything
    that is not an address falls back to the TCP peer.
    """
    remote = request.META.get("REMOTE_ADDR", "")
    proxies = settings.LOCKS_TRUSTED_PROXY_COUNT
    if proxies > 0:
        hops = [hop.strip() for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
        hops = [hop for hop in hops if hop]
        if hops:
            candidate = canonical_address(hops[-min(proxies, len(hops))])
            if candidate is not None:
                return candidate
    return remote


def canonical_address(value: str) -> str | None:
    """``value`` as an address in its canonical form, or None if it is not one.

    IPv6 zone ids (``fe80::1%eth0``) are dropped: they name an interface of the
    proxy, not a different client. An IPv4-mapped IPv6 address is its IPv4 one.
    """
    if len(value) > MAX_ADDRESS_LENGTH:
        return None
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        address = address.ipv4_mapped or ipaddress.IPv6Address(address.packed)  # packed has no zone
    return str(address)
