"""Control of the PostgreSQL server that scripts/with-postgres.sh started for this run."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass
class PgServer:
    bin: Path
    data: Path
    runas: str

    @classmethod
    def from_environment(cls) -> PgServer | None:
        try:
            return cls(
                bin=Path(os.environ["WITH_POSTGRES_BIN"]),
                data=Path(os.environ["WITH_POSTGRES_DATA"]),
                runas=os.environ["WITH_POSTGRES_RUNAS"],
            )
        except KeyError:
            return None

    def _pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        argv = [str(self.bin / "pg_ctl"), "-D", str(self.data), *args]
        if os.geteuid() == 0 and self.runas != "root":
            argv = ["runuser", "-u", self.runas, "--", *argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=90, check=check)

    def running(self) -> bool:
        return self._pg_ctl("status", check=False).returncode == 0

    def stop(self, mode: str = "fast") -> None:
        """``fast`` ends every session at once (what an operator's restart does)."""
        self._pg_ctl("-m", mode, "-w", "-t", "60", "stop")

    def start(self) -> None:
        log = self.data.parent / "postgres.log"
        self._pg_ctl("-l", str(log), "-w", "-t", "60", "start")
