"""The README, done as a new user does it (issue 38): every ```sh block, in order, in one bash
session (one terminal), on a fresh copy of the checkout (its ``git ls-files``), from a clean
environment; each command must exit 0. ``make setup`` finds the venv installed (the copy's
``.venv`` links to this checkout's, its requirements are older than its stamp): no download.
Only what a test must bound is changed: the stand-in's port and runserver's are free ones,
runserver stops once it answered ``/admin/login/``, ``run_scheduler`` gets SIGTERM after a few
seconds. The section "Use the lock in your own project" runs in a project of its own, made by
``startproject`` from its Python blocks; and ``make run``'s documented offline exit code is run too.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from contextlib import suppress
from pathlib import Path

import pytest

from tests.conftest import ROOT

README = ROOT / "README.md"
OWN_PROJECT = "Use the lock in your own project"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
RUNSERVER_WAIT = 30  # seconds: a hang guard
SCHEDULER_SECONDS = 4
# GET a URL, exit 0 on a 2xx answer (no curl in every CI image).
FETCH = f"{ROOT / '.venv' / 'bin' / 'python'} -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1])'"


def blocks(text: str) -> list[tuple[str, str, str]]:
    """(the ``## `` section it is in, its language, its body) of each fenced block."""
    found = []
    for match in FENCE.finditer(text):
        headings = re.findall(r"^## (.+)$", text[: match.start()], re.M)
        found.append((headings[-1] if headings else "", match.group(1), match.group(2)))
    return found


def commands(body: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", "", body)
    lines = (re.sub(r"(^|\s+)#\s.*$", "", line).strip() for line in joined.splitlines())
    return [line for line in lines if line]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fresh_env(**extra: str) -> dict[str, str]:
    """A new terminal's environment: none of this session's Django, database or API variables."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    return {**env, **extra}


def copy_checkout(to: Path) -> Path:
    files = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)
    (to / ".venv").symlink_to((ROOT / ".venv").resolve())
    for requirements in to.glob("requirements*.txt"):  # older than the venv's stamps: installed
        os.utime(requirements, (0, 0))
    return to


def script(lines: list[str], *, out: Path, ports: dict[str, int]) -> str:
    """One bash script: each command's output to ``out/N``, its exit code appended to ``out/codes``."""
    steps = []
    for n, line in enumerate(lines):
        for written, port in ports.items():
            line = line.replace(f"--port {written}", f"--port {port}").replace(f":{written}/", f":{port}/")
        command = line
        log = f"{out}/{n}"
        if command.endswith("&"):  # a server for the commands after it: wait until it listens
            port = re.search(r"--port (\d+)", command).group(1)
            steps.append(f"{{ {command[:-1]} ; }} >{log} 2>&1 &")
            steps.append(
                f"for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && break; sleep 0.1; done"
            )
            steps.append(f"echo '{n} 0' >>{out}/codes")
        elif re.search(r"manage\.py runserver$", command):
            port = ports["runserver"]
            url = f"http://127.0.0.1:{port}/admin/login/"
            steps += [
                f"{command} 127.0.0.1:{port} --noreload >{log} 2>&1 & server=$!",
                f"for i in $(seq {RUNSERVER_WAIT * 5}); do {FETCH} {url} 2>/dev/null && break; sleep 0.2; done",
                f'{FETCH} {url}; echo "{n} $?" >>{out}/codes; kill $server; wait $server',
            ]
        elif "manage.py run_scheduler" in command:
            steps.append(f"timeout --preserve-status -s TERM {SCHEDULER_SECONDS} {command} >{log} 2>&1")
            steps.append(f'echo "{n} $?" >>{out}/codes')
        else:
            steps.append(f"{{ {command} ; }} >{log} 2>&1")
            steps.append(f'echo "{n} $?" >>{out}/codes')
    return "\n".join(steps) + "\n"


def run(lines: list[str], *, cwd: Path, env: dict[str, str], ports: dict[str, int]) -> tuple[dict, list]:
    """Run ``lines`` in one bash; (their exit codes by line, their outputs). Every process it
    started is stopped on the way out (its process group)."""
    out = cwd.parent / f"{cwd.name}-out"
    out.mkdir()
    proc = subprocess.Popen(
        ["bash", "-c", script(lines, out=out, ports=ports)], cwd=cwd, env=env, start_new_session=True
    )
    try:
        proc.wait(timeout=300)
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
    codes = dict(line.split() for line in (out / "codes").read_text().splitlines())
    outputs = [(out / str(n)).read_text() if (out / str(n)).exists() else "" for n in range(len(lines))]
    return {lines[int(n)]: int(code) for n, code in codes.items()}, outputs


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    if shutil.which("make") is None:
        pytest.skip("needs make (.ci/run installs it)")
    return copy_checkout(tmp_path_factory.mktemp("fresh") / "cf-contest-sync")


def readme_lines(*, own_project: bool) -> list[str]:
    return [
        line
        for section, language, body in blocks(README.read_text())
        if language == "sh" and (section == OWN_PROJECT) == own_project
        for line in commands(body)
    ]


def test_every_readme_command_runs_on_a_fresh_copy(checkout):
    lines = readme_lines(own_project=False)
    assert lines[0] == "make setup" and any(line.startswith("make run") for line in lines)
    ports = {"8765": free_port(), "runserver": free_port()}
    codes, outputs = run(lines, cwd=checkout, env=fresh_env(), ports=ports)

    assert codes == dict.fromkeys(lines, 0), "\n\n".join(
        f"$ {line}\n{out}" for line, out in zip(lines, outputs, strict=True)
    )
    said = dict(zip(lines, outputs, strict=True))
    [make_run] = [line for line in lines if line.startswith("make run")]
    assert "outcome=succeeded" in said[make_run] and "fetched=1758 created=1758" in said[make_run]
    [scheduler] = [line for line in lines if "run_scheduler" in line]
    assert "scheduler: running" in said[scheduler] and "scheduler: stopped" in said[scheduler]


def test_make_run_offline_fails_with_the_documented_exit_codes(checkout):
    """The README: offline, the run fails cleanly, the command exits 1 and make exits 2."""
    closed = free_port()
    env = fresh_env(
        DJANGO_DEBUG="1",
        DATABASE_URL="sqlite:///offline.sqlite3",  # a database whose tick nobody ran
        CODEFORCES_API_URL=f"http://127.0.0.1:{closed}/api",
        CODEFORCES_MAX_ATTEMPTS="1",
    )
    result = subprocess.run(
        ["make", "run"], cwd=checkout, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr
    assert re.search(r"outcome=failed .*error=cannot connect to the Codeforces API", result.stdout)
    assert "Error 1" in result.stderr
    readme = " ".join(README.read_text().split())
    assert "the command exits 1, and `make` says `Error 1` and exits 2" in readme


def test_the_own_project_snippet_runs_in_a_new_project(checkout, tmp_path):
    """startproject, startapp, the README's settings, tasks and urls blocks added as they say,
    then its commands: the job is registered, runs, and logs its line."""
    python = [(ROOT / ".venv" / "bin" / "python").as_posix()]
    project = tmp_path / "mysite"
    project.mkdir()
    subprocess.run([*python, "-m", "django", "startproject", "mysite", "."], cwd=project, check=True)
    subprocess.run([*python, "manage.py", "startapp", "myapp"], cwd=project, check=True)
    python_blocks = [
        body
        for section, language, body in blocks(README.read_text())
        if language == "python" and section == OWN_PROJECT
    ]
    targets = {
        "settings.py": project / "mysite" / "settings.py",
        "myapp/tasks.py": project / "myapp" / "tasks.py",
        "urls.py": project / "mysite" / "urls.py",
    }
    for body in python_blocks:
        name = body.split()[1]  # "# settings.py …"
        with targets[name].open("a") as target:
            target.write("\n" + body)
    env = fresh_env(PATH=f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}", PYTHONPATH=str(checkout))
    # An install step ("pip install …") is the wheel's business (its own test): here the
    # fresh copy of the checkout is on the path instead, and nothing is downloaded.
    lines = [
        line for line in readme_lines(own_project=True) if not re.match(r"(python -m )?pip install", line)
    ]
    codes, outputs = run(lines, cwd=project, env=env, ports={})

    assert codes == dict.fromkeys(lines, 0), "\n\n".join(
        f"$ {line}\n{out}" for line, out in zip(lines, outputs, strict=True)
    )
    [run_job] = [n for n, line in enumerate(lines) if "run_job" in line]
    assert re.search(
        r"job=clear_sessions tick=\S+ holder=\S+ outcome=succeeded token=1 attempt=1/1 deleted=0",
        outputs[run_job],
    )
    assert outputs[run_job].count("outcome=succeeded") == 2  # stdout's line, and the log's (LOGGING)


def variables(text: str) -> set[str]:
    """The environment variables a text names: those docs/deployment.md's tables list."""
    listed = set()
    for row in re.findall(r"^\| (`[A-Z][^|]*)\|", (ROOT / "docs" / "deployment.md").read_text(), re.M):
        listed |= set(re.findall(r"`([A-Z][A-Z0-9_]+)`", row))
    return {name for name in re.findall(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b", text) if name in listed}


def test_the_readme_table_lists_every_variable_the_readme_names():
    text = README.read_text()
    table = re.search(r"^\| Variable \|.*?\n\n", text, re.S | re.M).group(0)
    assert {"LOCKS_METRICS_TOKEN", "DJANGO_DEBUG", "CODEFORCES_API_URL"} <= variables(table)
    assert variables(text) - variables(table) == set()
    assert variables("`LOCKS_METRICS_TOKEN`, `LOCKS_JOBS`, `NOT_A_VARIABLE`") == {"LOCKS_METRICS_TOKEN"}
