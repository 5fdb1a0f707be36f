#!/usr/bin/env python
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        if settings.configured:
            raise  # the settings loaded: a command's own error keeps Django's report
        # The settings refused the environment (config/env.py): one line, no traceback.
        sys.stderr.write(f"ImproperlyConfigured: {exc}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
