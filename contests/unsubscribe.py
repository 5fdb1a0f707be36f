"""One-click unsubscribe from the reminder emails (RFC 8058; docs/reminders.md, "Unsubscribe").

Each reminder carries a link whose token, signed with the project's ``SECRET_KEY`` (Django's
``signing``, salted for this use alone), names the user and what to stop: the reminders of
one contest, or all of them. It does not expire: the link in an old email keeps working, and
using it twice does no harm. Anyone who has the link can use it, as anyone who can read the
email could: it stops reminders, nothing else.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import quote

from django.conf import settings
from django.core import signing
from django.core.exceptions import ValidationError
from django.urls import reverse

from contests.models import Contest, Reminder

logger = logging.getLogger(__name__)

SALT = "contests.unsubscribe"
EVERY_CONTEST = object()  # make_token's contest for "stop all my reminders"
ONE_CLICK = "List-Unsubscribe=One-Click"  # the List-Unsubscribe-Post header's value, and the POST's body


class InvalidToken(ValueError):
    """The link was not made by this site (tampered with, cut short, or signed with another key)."""


@dataclass(frozen=True)
class StopRequest:
    """What a token asks to stop: the reminders of ``user`` for ``contest``, or all of them."""

    user: str  # the user's primary key, as text (an ObjectId on MongoDB)
    contest: str | None = None  # the contest's primary key, as text; None: every contest

    def reminders(self):
        """The reminders to delete: the user's (for the contest) not yet delivered."""
        found = Reminder.objects.filter(user_id=self.user, delivered_at__isnull=True)
        return found if self.contest is None else found.filter(contest_id=self.contest)


def make_token(*, user_pk, contest_pk) -> str:
    """The token that stops ``user_pk``'s reminders for ``contest_pk``, or for every contest
    (``EVERY_CONTEST``)."""
    if user_pk is None or contest_pk is None:  # unsaved rows: never read as "every contest"
        raise ValueError("a token names a saved user, and a saved contest or EVERY_CONTEST")
    contest = None if contest_pk is EVERY_CONTEST else str(contest_pk)
    return signing.Signer(salt=SALT).sign_object({"u": str(user_pk), "c": contest})


def read_token(token: str) -> StopRequest:
    """The request ``token`` carries; ``InvalidToken`` when this site did not sign it."""
    try:
        found = signing.Signer(salt=SALT).unsign_object(token)
    except (signing.BadSignature, ValueError) as exc:  # ValueError: a signed value that is not JSON
        raise InvalidToken("the unsubscribe link is not valid") from exc
    if not (isinstance(found, dict) and set(found) == {"u", "c"}):
        raise InvalidToken("the unsubscribe link is not valid")
    user, contest = found["u"], found["c"]
    try:  # keys as the database stores them: a signed token names a row of this site's kind
        Reminder._meta.get_field("user").target_field.to_python(user)
        if contest is not None:
            Contest._meta.pk.to_python(contest)
    except (ValidationError, TypeError) as exc:
        raise InvalidToken("the unsubscribe link is not valid") from exc
    return StopRequest(user=str(user), contest=None if contest is None else str(contest))


def unsubscribe_url(token: str) -> str:
    """The link's address: ``SITE_URL`` (where the site is served) and the view's path."""
    return settings.SITE_URL.rstrip("/") + reverse("contests:unsubscribe", kwargs={"token": token})


def list_unsubscribe_headers(*, token: str, url: str) -> dict[str, str]:
    """RFC 2369's ``List-Unsubscribe`` (the HTTPS link, and a ``mailto:`` when
    ``SEND_REMINDERS_UNSUBSCRIBE_MAILTO`` names an address) and RFC 8058's one-click POST."""
    targets = [f"<{url}>"]
    if settings.SEND_REMINDERS_UNSUBSCRIBE_MAILTO:
        subject = quote(f"unsubscribe {token}")
        targets.append(f"<mailto:{settings.SEND_REMINDERS_UNSUBSCRIBE_MAILTO}?subject={subject}>")
    return {"List-Unsubscribe": ", ".join(targets), "List-Unsubscribe-Post": ONE_CLICK}


def stop_reminders(*, request: StopRequest) -> int:
    """Delete the reminders ``request`` names that were not delivered yet; how many. A second
    time finds none. A reminder a run is sending right now may still go out once."""
    deleted, _ = request.reminders().delete()
    logger.info("unsubscribe user=%s contest=%s deleted=%d", request.user, request.contest or "all", deleted)
    return deleted
