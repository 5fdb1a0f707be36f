"""Who is asking: the bearer token and the client address."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress

from django.conf import settings
from django.http import HttpRequest


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


def client_address(request: HttpRequest) -> str:
    """The address of the client, not spoofable by default.

    With ``TRUSTED_PROXY_COUNT = 0`` it is the TCP peer (``REMOTE_ADDR``) and
    X-Forwarded-For is ignored. With N trusted proxies, each appends the address
    it saw, so the client is the N-th entry from the right; entries further left
    were written by the client and are never used.
    """
    remote = request.META.get("REMOTE_ADDR", "")
    proxies = getattr(settings, "TRUSTED_PROXY_COUNT", 0)
    if proxies > 0:
        hops = [hop.strip() for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
        hops = [hop for hop in hops if hop]
        if hops:
            candidate = hops[-min(proxies, len(hops))]
            if _is_ip(candidate):
                return candidate
    return remote


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True
