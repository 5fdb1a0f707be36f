"""Show the guarantee offline: five copies of sync_contests at once, one sync.

Starts a local Codeforces stand-in serving the bundled real contest list, runs
five copies of ``manage.py sync_contests`` at the same moment against a fresh
SQLite database (var/demo.sqlite3, so your own db.sqlite3 and its ticks are left
alone), then prints what each copy did, how many API calls the stand-in saw, and
``manage.py locks status``.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.standin import Standin, serve  # noqa: E402

COPIES = 5


def main() -> int:
    database = ROOT / "var" / "demo.sqlite3"
    for path in database.parent.glob(database.name + "*"):
        path.unlink()
    standin = Standin()
    server = serve(standin)
    env = {
        **os.environ,
        "DJANGO_DEBUG": os.environ.get("DJANGO_DEBUG", "1"),
        "DATABASE_URL": f"sqlite:///{database}",
        "CODEFORCES_API_URL": f"http://127.0.0.1:{server.server_port}/api",
    }
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v", "0"], env=env, check=True)
    print(f"Codeforces stand-in on {env['CODEFORCES_API_URL']} serving 1,758 real contests")
    print(f"Starting {COPIES} copies of `manage.py sync_contests` at the same moment…\n")

    copies = [
        subprocess.Popen(
            [*manage, "sync_contests"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(COPIES)
    ]
    synced = 0
    for number, copy in enumerate(copies, 1):
        out, err = copy.communicate(timeout=120)
        line = out.strip() or err.strip().splitlines()[-1]
        outcome = line.split(" outcome=")[1].split()[0] if " outcome=" in line else "?"
        synced += outcome == "succeeded"
        detail = line.split(" reason=")[1] if " reason=" in line else line.split(f"outcome={outcome} ")[-1]
        print(f"copy {number} (exit {copy.returncode}): {outcome:<9} {detail}")

    print(f"\nCopies that synced: {synced}. contest.list calls the stand-in received: {standin.calls}\n")
    subprocess.run([*manage, "locks", "status"], env=env, check=True)
    server.shutdown()
    return 0 if synced == 1 and standin.calls == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
