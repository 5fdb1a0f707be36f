"""Django's ``createsuperuser``; with ``DEBUG`` off the password validators always apply.

Django skips them for ``--noinput`` with ``DJANGO_SUPERUSER_PASSWORD`` and, interactively,
offers "Bypass password validation and create user anyway?". An admin password is the
admin's one defence (docs/security.md), so production refuses such a password on both
paths; with ``DJANGO_DEBUG=1`` the command is Django's own.
"""

from __future__ import annotations

import builtins
import os
from contextlib import contextmanager

from django.conf import settings
from django.contrib.auth.management.commands import createsuperuser
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import CommandError

BYPASS_PROMPT = "Bypass password validation"
REFUSED = "with DJANGO_DEBUG=0 the password must pass every password validator"


class Command(createsuperuser.Command):
    help = (
        createsuperuser.Command.help + " With DJANGO_DEBUG=0 a password that fails the validators is refused."
    )

    def handle(self, *args, **options):
        if settings.DEBUG:
            return super().handle(*args, **options)
        if not options["interactive"]:
            self._validate_environment_password(options)
            return super().handle(*args, **options)
        with self._no_bypass():
            return super().handle(*args, **options)

    def _validate_environment_password(self, options: dict) -> None:
        password = os.environ.get("DJANGO_SUPERUSER_PASSWORD")
        if password is None:
            return  # Django then creates the user with an unusable password
        fields = (self.UserModel.USERNAME_FIELD, *self.UserModel.REQUIRED_FIELDS)
        # The user as it will be, so that the similarity validator sees its attributes.
        attributes = {
            name: options.get(name) or os.environ.get(f"DJANGO_SUPERUSER_{name.upper()}", "")
            for name in fields
            if not self.UserModel._meta.get_field(name).many_to_many
        }
        try:
            validate_password(password, self.UserModel(**attributes))
        except ValidationError as exc:
            raise CommandError(
                f"DJANGO_SUPERUSER_PASSWORD refused ({REFUSED}): {' '.join(exc.messages)}", returncode=2
            ) from None

    @contextmanager
    def _no_bypass(self):
        """Django asks whether to bypass the validators with the builtin ``input()`` and has
        no setting to leave the question out; answer it "no" here (Django then asks for
        another password) and say why."""

        def answer(prompt: str = "") -> str:
            if prompt.startswith(BYPASS_PROMPT):
                self.stderr.write(f"Refused: {REFUSED}; choose another.")
                return "N"
            return builtins.input(prompt)

        createsuperuser.input = answer  # the module's name for input() now finds this first
        try:
            yield
        finally:
            del createsuperuser.input
