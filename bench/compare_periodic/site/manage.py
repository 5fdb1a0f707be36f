"""manage.py of the comparison's third-party project, run by each tool's own venv (var/compare/<tool>)."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cmpsite")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
