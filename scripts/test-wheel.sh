#!/usr/bin/env bash
# The host project's suite (tests/locks under tests/hostproject) on the installed wheel of
# django-tick-locks, not on this checkout's locks/ (make test-wheel-django52, test-wheel-django61).
#
#   scripts/test-wheel.sh VENV [PYTEST ARG...]
#
# VENV holds the test tools and the wheel's dependencies only (requirements-wheel-django*.txt);
# the wheel in dist/ (make wheel) goes into it here, and `pip check` proves its declared
# dependencies are met. The suite runs from a copy of tests/ and manage.py in VENV/checkout: the
# copy's root is what pytest, pytest-django and the suite's processes put on sys.path, and it
# has no locks/, so every `import locks` finds the wheel's (tests/locks/test_distribution.py
# fails otherwise; LOCKS_WHEEL_SOURCE tells it where the source tree is).
set -euo pipefail
if [ $# -eq 0 ]; then
    echo "usage: $0 VENV [PYTEST ARG...]" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
venv=$(realpath "$1")
shift
wheels=(dist/django_tick_locks-*.whl)
if [ ${#wheels[@]} -ne 1 ] || [ ! -f "${wheels[0]}" ]; then
    echo "$0: expected one wheel in dist/ (make wheel), found: ${wheels[*]}" >&2
    exit 2
fi
"$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps --force-reinstall "${wheels[0]}"
"$venv/bin/python" -m pip check --disable-pip-version-check >/dev/null
checkout=$venv/checkout
rm -rf "$checkout"
mkdir -p "$checkout"
cp -R tests docs manage.py pyproject.toml "$checkout/"  # docs: tests/locks/test_model.py reads the invariants there
find "$checkout" -name __pycache__ -prune -exec rm -rf {} +
cd "$checkout"
export LOCKS_WHEEL_SOURCE="$OLDPWD/locks"
exec "$venv/bin/python" -m pytest --ds tests.hostproject.settings -p no:cacheprovider "$@"
