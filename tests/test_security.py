"""What docs/security.md says about gunicorn and X-Forwarded-Proto, checked on the real server."""

from __future__ import annotations

import secrets

import pytest
import requests

from tests.conftest import gunicorn, project_env

HTTPS_CLAIM = {"X-Forwarded-Proto": "https"}


def production_env(db_url: str, **extra: str) -> dict[str, str]:
    env = {
        name: value
        for name, value in project_env().items()
        if not name.startswith(("DJANGO_", "SYNC_", "HEALTHZ_")) and name != "FORWARDED_ALLOW_IPS"
    }
    env.update(
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DJANGO_ALLOWED_HOSTS="127.0.0.1",
        DATABASE_URL=db_url,
    )
    env.update(extra)
    return env


@pytest.mark.slow
def test_gunicorn_trusts_x_forwarded_proto_from_loopback_unless_told_otherwise(db_url, tmp_path):
    """DJANGO_SECURE_PROXY_SSL_HEADER is off, and still a loopback peer that claims
    HTTPS is believed: gunicorn's own forwarded_allow_ips defaults to 127.0.0.1,::1.
    Only an empty list (--forwarded-allow-ips='' or FORWARDED_ALLOW_IPS='') stops it."""
    answers = {}
    for case, extra in {"default": {}, "empty": {"FORWARDED_ALLOW_IPS": ""}}.items():
        log = tmp_path / f"gunicorn-{case}.log"
        with gunicorn(env=production_env(db_url, **extra), log=log) as base:
            claimed = requests.get(
                base + "/admin/login/", headers=HTTPS_CLAIM, timeout=60, allow_redirects=False
            )
            plain = requests.get(base + "/admin/login/", timeout=60, allow_redirects=False)
        answers[case] = (claimed.status_code, plain.status_code)
        assert "Traceback" not in log.read_text()

    assert answers["default"] == (200, 301)  # the claim made it HTTPS: no redirect
    assert answers["empty"] == (301, 301)  # the claim is ignored
