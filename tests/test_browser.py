"""End to end in a real browser: headless Chromium driven by Selenium against
a live server. An operator logs in, sees a held lock and its holder,
force-releases it, and sees it free; reads a job's tick strip, each cell coloured by
its outcome from the admin's CSS variables, in light and in dark mode; and the locks list
fits a 1,400 px window with the navigation sidebar open (issue 38).

Uses Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs
them); nothing is downloaded. Screenshots of the locks list and the run
history go to a temporary directory, or to ``ADMIN_SCREENSHOTS_DIR`` when set:

    ADMIN_SCREENSHOTS_DIR=docs .venv/bin/python -m pytest tests/test_browser.py
"""

from __future__ import annotations

import os
import shutil
import tempfile
import unittest
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.staticfiles.testing import StaticLiveServerTestCase
from django.test import override_settings
from django.utils import timezone

from locks.lease import LockLost, acquire, release, renew
from locks.models import JobPause, JobRun, Outcome, SyncLock, now_plus

CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
HOLDER = "web-1:4242:a1b2c3"
WAIT = 20  # seconds; a hang guard, not a timing assertion
HISTORY = 22  # hours of sync runs before the current one (and a slot 23 hours ago that nobody ran)
PNG = b"\x89PNG\r\n\x1a\n"
WIDTH, HEIGHT = 1400, 900  # a laptop's window: the admin fits it (issue 38)

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # pragma: no cover - selenium is pinned in requirements-dev.txt
    webdriver = None

MISSING = (
    "selenium is not installed (make test installs requirements-dev.txt)"
    if webdriver is None
    else "needs Debian's chromium and chromium-driver at /usr/bin (apt-get install chromium "
    "chromium-driver; .ci/run does this as root)"
)


def chromium_options(profile: str) -> Options:
    options = Options()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root in a container
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={WIDTH},{HEIGHT}",
        "--force-device-scale-factor=1",
        "--lang=en-US",
        f"--user-data-dir={profile}",
        # Talk to nobody but the live server.
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-domain-reliability",
        "--disable-client-side-phishing-detection",
        "--disable-sync",
        "--disable-extensions",
        "--disable-default-apps",
        "--disable-breakpad",
        "--no-first-run",
        "--no-default-browser-check",
        "--metrics-recording-only",
        "--password-store=basic",
        "--disable-features=Translate,OptimizationHints,MediaRouter,PasswordLeakDetection",
    ):
        options.add_argument(argument)
    options.add_experimental_option(
        "prefs", {"credentials_enable_service": False, "profile.password_manager_enabled": False}
    )
    return options


@unittest.skipUnless(webdriver is not None and CHROMIUM.exists() and CHROMEDRIVER.exists(), MISSING)
@override_settings(
    PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
    LOCKS_LEDGER_SLOTS=24,  # a day of the hourly sync
    LOCKS_JOBS={
        "sync_contests": {**settings.LOCKS_JOBS["sync_contests"], "schedule": "0 * * * *"},
        "send_reminders": {**settings.LOCKS_JOBS["send_reminders"], "schedule": "*/15 * * * *"},
    },
)
class ForceReleaseInTheBrowser(StaticLiveServerTestCase):
    host = "127.0.0.1"

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.profile = tempfile.mkdtemp(prefix="chromium-profile-")
        cls.addClassCleanup(shutil.rmtree, cls.profile, ignore_errors=True)
        cls.driver = webdriver.Chrome(
            service=Service(executable_path=str(CHROMEDRIVER)), options=chromium_options(cls.profile)
        )
        cls.addClassCleanup(cls.driver.quit)
        cls.driver.set_page_load_timeout(WAIT)
        shots = os.environ.get("ADMIN_SCREENSHOTS_DIR")
        cls.screenshots = Path(shots) if shots else Path(tempfile.mkdtemp(prefix="admin-screenshots-"))
        if not shots:
            cls.addClassCleanup(shutil.rmtree, cls.screenshots, ignore_errors=True)
        cls.screenshots.mkdir(parents=True, exist_ok=True)

    def setUp(self) -> None:
        get_user_model().objects.create_superuser("operator", "ops@example.com", "night-shift")
        now = timezone.now()
        hour = now.replace(minute=0, second=0, microsecond=0)
        # History: hourly syncs, one that hit the API's rate limit, one that lost its lease.
        runs = []
        for n in range(1, HISTORY + 1):
            started = hour - timedelta(hours=n, seconds=-2)
            created, updated = (1, 0) if n == 5 else (0, n % 3)
            status, error = Outcome.SUCCEEDED, ""
            stats = {
                "fetched": 1758,
                "created": created,
                "updated": updated,
                "unchanged": 1758 - created - updated,
                "invalid": 0,
                "removed": 0,
                "pruned": n % 2,
            }
            if n == 3:
                status, stats = Outcome.FAILED, {}
                error = (
                    "CodeforcesError: contest.list answered FAILED: Call limit exceeded (after 3 attempts)"
                )
            if n == 6:
                status, stats = Outcome.LOST_LOCK, {}
                error = "lease on sync_contests (token 3) was taken over or released"
            runs.append(
                JobRun(
                    job_name="sync_contests",
                    tick=hour - timedelta(hours=n),
                    holder=f"web-{n % 3 + 1}:{4000 + n}:{n:06x}",
                    token=HISTORY + 1 - n,
                    status=status,
                    started_at=started,
                    finished_at=started + timedelta(seconds=1.2 + n / 10),
                    stats=stats,
                    error=error,
                    requested_by="cron",
                )
            )
        JobRun.objects.bulk_create(runs)
        # The current run: sync_contests held by a web worker that may be stuck.
        self.lease = acquire(job="sync_contests", tick=hour, ttl=timedelta(minutes=10), holder=HOLDER)
        # The job existed a day ago: its ledger starts with its lock row (issue 27), so the slot
        # nobody ran 23 hours ago shows as missed.
        SyncLock.objects.filter(job_name="sync_contests").update(
            token=HISTORY + 1, created_at=hour - timedelta(hours=HISTORY + 2)
        )
        self.lease.token = HISTORY + 1
        JobRun.objects.create(
            job_name="sync_contests",
            tick=hour,
            holder=HOLDER,
            token=HISTORY + 1,
            started_at=self.lease.grant.acquired_at,
            requested_by="scheduler",
        )
        # A holder that died without releasing, and a job that ran fine.
        acquire(job="send_reminders", tick=None, ttl=timedelta(minutes=5), holder="worker-2:977:9f3e1d")
        SyncLock.objects.filter(job_name="send_reminders").update(
            acquired_at=now_plus(-timedelta(minutes=12)),
            last_started_at=now_plus(-timedelta(minutes=12)),
            locked_until=now_plus(-timedelta(minutes=7)),
            heartbeat_at=now_plus(-timedelta(minutes=11)),
            # Paused two hours ago, while its mail relay is down: its slots since then are paused.
            paused_at=now_plus(-timedelta(hours=2)),
            paused_by="admin:operator",
            paused_note="mail relay down",
            created_at=now - timedelta(days=1),  # it existed before the pause (the ledger starts here)
        )
        JobPause.objects.create(
            job_name="send_reminders",
            paused_at=now - timedelta(hours=2),
            paused_by="admin:operator",
            note="mail relay down",
        )
        done = acquire(job="weekly_report", tick=None, ttl=timedelta(minutes=5), holder="cron-1:311:0c5a7b")
        release(lease=done, status=Outcome.SUCCEEDED)
        SyncLock.objects.filter(job_name="weekly_report").update(
            last_started_at=now_plus(-timedelta(hours=3, seconds=47)),
            last_finished_at=now_plus(-timedelta(hours=3)),
        )
        # Alive on paper (lease valid 90 s more) but silent for 5 minutes.
        acquire(job="rebuild_rankings", tick=None, ttl=timedelta(minutes=6), holder="worker-1:5120:77aa01")
        SyncLock.objects.filter(job_name="rebuild_rankings").update(
            last_started_at=now_plus(-timedelta(minutes=5, seconds=20)),
            locked_until=now_plus(timedelta(seconds=90)),
            heartbeat_at=now_plus(-timedelta(minutes=5)),
        )

    # --- helpers

    def wait_for(self, css: str):
        return WebDriverWait(self.driver, WAIT).until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))

    def lock_row(self, job: str):
        return self.driver.find_element(
            By.XPATH, f"//table[@id='result_list']//tr[.//th//a[normalize-space()='{job}']]"
        )

    def overflow(self) -> list[int]:
        """How far the page and the list's table reach past the window (0, 0: no scrollbar)."""
        return self.driver.execute_script(
            "const d = document.documentElement, r = document.querySelector('#changelist .results');"
            "return [d.scrollWidth - d.clientWidth, r.scrollWidth - r.clientWidth];"
        )

    def screenshot(self, name: str) -> None:
        path = self.screenshots / name
        self.assertTrue(self.driver.save_screenshot(str(path)), path)
        self.assertEqual(path.read_bytes()[:8], PNG)

    # --- the test

    def log_in(self) -> None:
        """Open the locks list, which asks for the operator's login first."""
        self.driver.get(f"{self.live_server_url}/admin/locks/synclock/")
        self.wait_for("#id_username").send_keys("operator")
        self.driver.find_element(By.ID, "id_password").send_keys("night-shift")
        self.driver.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()

    def fold_sidebar(self, *, fold: bool = True) -> None:
        """Fold (or unfold) the navigation sidebar; the browser remembers it."""
        if self.driver.find_element(By.ID, "nav-sidebar").is_displayed() == fold:
            self.driver.find_element(By.ID, "toggle-nav-sidebar").click()

    def test_operator_force_releases_a_held_lock(self) -> None:
        driver = self.driver
        self.log_in()

        self.wait_for("#result_list")
        self.fold_sidebar()
        row = self.lock_row("sync_contests")
        self.assertIn("held", row.find_element(By.CSS_SELECTOR, ".field-state").text)
        self.assertIn(HOLDER, row.text)
        self.assertIn(f"token {HISTORY + 1}", row.find_element(By.CSS_SELECTOR, ".field-holder_token").text)
        self.assertIn("expired, not released", self.lock_row("send_reminders").text)
        self.assertIn("heartbeat overdue", self.lock_row("rebuild_rankings").text)
        self.assertIn("2 stuck locks", driver.find_element(By.ID, "lock-summary").text)

        row.find_element(By.LINK_TEXT, "sync_contests").click()
        self.wait_for("#recent-runs")
        self.assertIn("Last 20 runs", driver.find_element(By.ID, "recent-runs").text)
        driver.find_element(By.ID, "force-release").click()

        confirm = self.wait_for("#confirm-force-release")
        self.assertIn(HOLDER, driver.find_element(By.ID, "force-release-locks").text)
        confirm.click()

        message = self.wait_for(".messagelist .success").text
        self.assertIn(
            f"Released sync_contests: holder was {HOLDER} (token {HISTORY + 1}); new token {HISTORY + 2}.",
            message,
        )
        row = self.lock_row("sync_contests")
        self.assertIn("free", row.find_element(By.CSS_SELECTOR, ".field-state").text)
        self.assertIn("released", row.find_element(By.CSS_SELECTOR, ".field-lease").text)
        self.assertIn(f"token {HISTORY + 2}", row.find_element(By.CSS_SELECTOR, ".field-holder_token").text)
        self.assertNotIn(HOLDER, row.text)  # a released lease keeps no holder

        lock = SyncLock.objects.get(job_name="sync_contests")
        self.assertIsNone(lock.locked_until)
        self.assertEqual(lock.token, HISTORY + 2)
        with self.assertRaises(LockLost):  # the old holder is fenced out
            renew(lease=self.lease)
        entry = LogEntry.objects.get()
        self.assertEqual(entry.user.username, "operator")
        self.assertIn(HOLDER, entry.get_change_message())

        driver.get(f"{self.live_server_url}/admin/locks/jobrun/")
        self.wait_for("#result_list")
        self.assertEqual(len(driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")), HISTORY + 1)
        self.assertIn("Call limit exceeded", driver.find_element(By.ID, "result_list").text)
        self.assertEqual(self.overflow(), [0, 0])  # the run history fits 1,400 px too
        self.screenshot("admin-runs.png")

    def test_the_locks_list_fits_1400_px_and_marks_the_paused_job(self) -> None:
        """At 1,400 px, navigation sidebar open as a new user first sees it: no horizontal
        scrollbar, and each row's holder, locked until, tick and last run inside the window.
        The filters sit above the table and fold; the summary says which job is paused."""
        driver = self.driver
        self.log_in()
        self.wait_for("#result_list")
        self.assertEqual(driver.execute_script("return window.innerWidth"), WIDTH)
        self.fold_sidebar(fold=False)
        self.assertTrue(driver.find_element(By.ID, "nav-sidebar").is_displayed())
        self.assertEqual(self.overflow(), [0, 0])
        for job in ("sync_contests", "send_reminders", "rebuild_rankings", "weekly_report"):
            for column in ("holder_token", "lease", "tick_at", "last_outcome"):
                cell = self.lock_row(job).find_element(By.CSS_SELECTOR, f".field-{column}")
                right = driver.execute_script("return arguments[0].getBoundingClientRect().right", cell)
                self.assertLessEqual(right, WIDTH, f"{job} {column}")
        row = self.lock_row("sync_contests")
        self.assertIn(HOLDER, row.find_element(By.CSS_SELECTOR, ".field-holder_token").text)
        self.assertIn("not done yet", row.find_element(By.CSS_SELECTOR, ".field-tick_at").text)
        self.assertIn("running", row.find_element(By.CSS_SELECTOR, ".field-last_outcome").text)
        summary = driver.find_element(By.ID, "lock-summary").text
        self.assertIn("send_reminders: no successful run on record · paused by admin:operator since", summary)
        self.assertIn("no slot runs until it is resumed", summary)
        self.screenshot("admin-locks.png")

        by_state = driver.find_element(
            By.CSS_SELECTOR, '#changelist-filter details[data-filter-title="state"]'
        )
        states = by_state.find_element(By.TAG_NAME, "ul")
        self.assertTrue(states.is_displayed())
        filters_top = driver.find_element(By.ID, "changelist-filter").location["y"]
        self.assertLess(filters_top, driver.find_element(By.ID, "result_list").location["y"])
        by_state.find_element(By.TAG_NAME, "summary").click()
        self.assertFalse(states.is_displayed())

    def test_operator_reads_the_tick_strip_in_light_and_dark_mode(self) -> None:
        driver = self.driver
        self.log_in()
        self.wait_for("#result_list")
        self.fold_sidebar()

        cells = driver.find_elements(By.CSS_SELECTOR, '.tick-strip[data-job="sync_contests"] .tick-cell')
        self.assertEqual(len(cells), 24)  # LOCKS_LEDGER_SLOTS, one per slot
        outcomes = [cell.get_attribute("data-outcome") for cell in cells]
        # Newest on the right: the current slot's run holds the lease; 3 h ago failed, 6 h ago lost its
        # lease (a failed attempt), and nobody ran the slot 23 h ago: it has no run.
        expected = ["succeeded"] * 24
        expected[-1], expected[-4], expected[-7], expected[0] = "running", "failed", "failed", "missed"
        self.assertEqual(outcomes, expected)
        hour = timezone.now().replace(minute=0, second=0, microsecond=0)
        self.assertEqual(
            cells[-4].get_attribute("title"),
            f"{hour - timedelta(hours=3):%Y-%m-%d %H:%M} UTC failed (1 attempt)",
        )
        paused = driver.find_elements(
            By.CSS_SELECTOR, '.tick-strip[data-job="send_reminders"] .tick-cell[data-outcome="paused"]'
        )
        self.assertGreaterEqual(len(paused), 7)  # the quarter-hours whose whole chance fell in the pause
        self.assertEqual(
            driver.find_element(
                By.CSS_SELECTOR, '.tick-strip[data-job="send_reminders"] .tick-cell:last-child'
            ).get_attribute("data-outcome"),
            "pending",
        )

        light = self.cell_colours()
        self.assertEqual(light["failed"], light["--error-fg"])
        self.assertEqual(light["succeeded"], light["--message-success-bg"])
        self.assertEqual(light["missed"], light["--accent"])
        self.assertEqual(light["running"], light["--primary"])
        self.assertEqual(light["paused"], light["--body-quiet-color"])
        self.assertEqual(len({light[o] for o in ("failed", "succeeded", "missed", "running", "paused")}), 5)

        driver.execute_cdp_cmd(
            "Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]}
        )
        dark = self.cell_colours()
        self.assertEqual(dark["failed"], dark["--error-fg"])
        self.assertEqual(dark["succeeded"], dark["--message-success-bg"])
        self.assertNotEqual(dark["succeeded"], light["succeeded"])  # the admin's dark theme applies
        self.assertNotEqual(dark["--body-bg"], light["--body-bg"])
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})

        self.lock_row("sync_contests").find_element(By.LINK_TEXT, "sync_contests").click()
        self.wait_for("#tick-ledger")
        self.assertIn("Tick ledger: the last 24 slots", driver.find_element(By.ID, "tick-ledger").text)
        self.assertTrue(driver.find_element(By.ID, "run-now").is_displayed())
        self.assertTrue(driver.find_element(By.ID, "pause").is_displayed())
        driver.set_window_size(WIDTH, 1800)  # the buttons, the lease and the ledger in one picture
        self.screenshot("admin-ledger.png")
        driver.set_window_size(WIDTH, HEIGHT)

    def cell_colours(self) -> dict[str, str]:
        """The computed background of one cell of each outcome, and of the admin's variables as colours."""
        return self.driver.execute_script(
            """
            const probe = document.createElement('span');
            document.body.appendChild(probe);
            const out = {};
            for (const name of ['--error-fg', '--message-success-bg', '--accent', '--primary',
                                '--body-quiet-color', '--body-bg']) {
                probe.style.background = `var(${name})`;
                out[name] = getComputedStyle(probe).backgroundColor;
            }
            probe.remove();
            for (const cell of document.querySelectorAll('.tick-cell')) {
                out[cell.dataset.outcome] ??= getComputedStyle(cell).backgroundColor;
            }
            return out;
            """
        )
