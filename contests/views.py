"""The page a reminder's unsubscribe link opens (docs/reminders.md, "Unsubscribe")."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from contests.models import Contest
from contests.unsubscribe import ONE_CLICK, InvalidToken, read_token, stop_reminders

TEMPLATE = "contests/unsubscribe.html"


# RFC 8058: a mailbox provider POSTs the link with no cookie and no CSRF token; the signed
# token is what proves the request, and all it can do is stop reminders.
@csrf_exempt
@never_cache
@require_http_methods(["GET", "HEAD", "POST"])
def unsubscribe(request: HttpRequest, token: str) -> HttpResponse:
    """GET: a page with one button, changing nothing (mail scanners follow links); POST (the
    button, or the mailbox provider's one click): the reminders are deleted. A link this site
    did not sign: 400, nothing changed."""
    try:
        wanted = read_token(token)
    except InvalidToken:
        return render(request, TEMPLATE, {"state": "invalid"}, status=400)
    contest = Contest.objects.filter(pk=wanted.contest).first() if wanted.contest is not None else None
    context = {"contest": contest, "every": wanted.contest is None, "one_click": ONE_CLICK.split("=")}
    if request.method == "POST":
        stop_reminders(request=wanted)
        return render(request, TEMPLATE, {**context, "state": "done"})
    return render(request, TEMPLATE, {**context, "state": "confirm"})
