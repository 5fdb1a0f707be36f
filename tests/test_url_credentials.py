"""A bad EMAIL_URL or DATABASE_URL is refused without showing any part of its user name or
password (issue 21, item 1), in manage.py's one line and in the exception itself."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from tests.conftest import manage, project_env
from tests.test_deploy_settings import load_settings

# Canary pieces: each may appear in the user name or the password, split by the
# characters that break a URL's user information when left unescaped.
USER, PASSWORD = ("USRCANA", "USRCANB"), ("PWDCANA", "PWDCANB")
CANARIES = (*USER, *PASSWORD)
BREAKERS = ("/", "?", "#")


def _userinfos() -> list[str]:
    infos = []
    for char in BREAKERS:
        infos.append(f"{USER[0]}{USER[1]}:{PASSWORD[0]}{char}{PASSWORD[1]}")  # in the password
        infos.append(f"{USER[0]}{char}{USER[1]}:{PASSWORD[0]}{PASSWORD[1]}")  # in the user name
    infos.append(f"{USER[0]}:1234/{PASSWORD[1]}")  # digits before the '/' even parsed as a port
    return infos


BAD_EMAIL = [
    *(f"smtp://{info}@mail.example:587" for info in _userinfos()),
    f"smtp://{USER[0]}:{PASSWORD[0]}@mail.example:abc",  # a bad port after good credentials
    f"smtp://{USER[0]}:{PASSWORD[0]}#{PASSWORD[1]}@mail.example:587",
    f"bogus://{USER[0]}:{PASSWORD[0]}@mail.example",
]
BAD_DATABASE = [
    *(
        f"postgres://{info}@db.example:5432/contests"
        for info in _userinfos()
        if "%zz" not in info and "@" not in info
    ),
    f"postgres://{USER[0]}:{PASSWORD[0]}@db.example:abc/contests",
    f"{USER[0]}:{PASSWORD[0]}@db.example/contests",  # no scheme: "USRCANA" would pass for one
    f"mongodb://{USER[0]}:{PASSWORD[0]}@{PASSWORD[1]}@db.example/contests",  # '@' unescaped
    f"mongodb://{USER[0]}:{PASSWORD[0]}/{PASSWORD[1]}@db.example/contests",
    f"mongodb://{USER[0]}:{PASSWORD[0]}@db.example:abc/contests",
    f"mongodb+srv://{USER[0]}:{PASSWORD[0]}@a.example,b.example/contests",
]


def _assert_no_canary(text: str) -> None:
    leaked = [canary for canary in CANARIES if canary in text]
    assert not leaked, text


@pytest.mark.parametrize(
    ("name", "url"),
    [*(("EMAIL_URL", url) for url in BAD_EMAIL), *(("DATABASE_URL", url) for url in BAD_DATABASE)],
)
def test_a_bad_url_never_shows_its_credentials(monkeypatch, name, url):
    with pytest.raises(ImproperlyConfigured) as excinfo:
        load_settings(monkeypatch, DJANGO_DEBUG="1", **{name: url})

    assert str(excinfo.value).startswith(name)
    _assert_no_canary(str(excinfo.value))
    _assert_no_canary(repr(excinfo.value.__cause__) + repr(excinfo.value.__context__))


@pytest.mark.parametrize(
    ("name", "url"),
    [
        ("EMAIL_URL", f"smtp://{USER[0]}:hunter2/{PASSWORD[1]}@mail.example:587"),  # the case
        ("EMAIL_URL", f"smtp+tls://{USER[0]}:1234/{PASSWORD[1]}@mail.example:587"),
        ("DATABASE_URL", f"postgres://{USER[0]}:{PASSWORD[0]}?{PASSWORD[1]}@db.example/contests"),
        ("DATABASE_URL", f"mongodb://{USER[0]}:{PASSWORD[0]}@db.example:abc/contests"),
    ],
)
def test_manage_py_refuses_in_one_line_without_the_credentials(name, url):
    result = manage("check", env=project_env(**{name: url}))

    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith(f"ImproperlyConfigured: {name}")
    _assert_no_canary(result.stderr + result.stdout)
    assert "hunter2" not in result.stderr


def test_the_message_says_what_to_percent_encode(monkeypatch):
    with pytest.raises(ImproperlyConfigured, match=r"/ as %2F, \? as %3F, # as %23, @ as %40"):
        load_settings(monkeypatch, DJANGO_DEBUG="1", EMAIL_URL="smtp://user:pa/ss@mail.example:587")


@pytest.mark.parametrize(
    ("name", "url", "setting", "expected"),
    [
        ("EMAIL_URL", "smtp+tls://u%40x:pa%2Fss%3F%23@mail.example:587", "EMAIL_HOST_PASSWORD", "pa/ss?#"),
        ("EMAIL_URL", "smtp+tls://u%40x:pa%2Fss%3F%23@mail.example:587", "EMAIL_HOST_USER", "u@x"),
        ("EMAIL_URL", "smtp://mail.example:25", "EMAIL_HOST", "mail.example"),
        ("DATABASE_URL", "postgres://app:pa%2Fss%40@db.example:5432/contests", "PASSWORD", "pa/ss@"),
        ("DATABASE_URL", "sqlite:////tmp/odd@name.sqlite3", "NAME", "/tmp/odd@name.sqlite3"),
    ],
)
def test_percent_encoded_credentials_and_plain_urls_still_work(monkeypatch, name, url, setting, expected):
    ns = load_settings(monkeypatch, DJANGO_DEBUG="1", **{name: url})
    value = ns["DATABASES"]["default"][setting] if name == "DATABASE_URL" else ns[setting]
    assert value == expected
