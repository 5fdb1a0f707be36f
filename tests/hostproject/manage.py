#!/usr/bin/env python
"""The host project's manage.py (the crontab lines name it)."""

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: locks and tests
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.hostproject.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
