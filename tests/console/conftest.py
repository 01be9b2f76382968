# mypy: disallow-untyped-calls=False
"""Fixtures for the console tests: effectors serving a console, and headless Chromium.

The browser is Debian's ``/usr/bin/chromium`` driven through ``/usr/bin/chromedriver`` by
Selenium, headless, with a fresh profile, and it never downloads anything (``SE_OFFLINE``);
it is quit, and chromedriver with it, after each module.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

# The effector's test harness (its self-signed certificates) lives beside its tests and is
# imported as a top-level module (as pytest imports it there); make it importable from here
# too, as tests/io and tests/semantics do.
_EFFECTOR_TESTS = str(Path(__file__).resolve().parent.parent / "effector")
if _EFFECTOR_TESTS not in sys.path:
    sys.path.insert(0, _EFFECTOR_TESTS)

import pytest  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402

from effector.launch import EffectorThread  # noqa: E402
from tests.console.harness import TOKEN, start_effector  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture
def effector(tmp_path: Path) -> Iterator[EffectorThread]:
    """An effector without a token, serving a console."""
    with start_effector(tmp_path) as started:
        yield started


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[EffectorThread]:
    """An effector with a token, serving a console that asks for it."""
    with start_effector(tmp_path, token=TOKEN) as started:
        yield started


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    """Headless Chromium with a fresh profile; quit (chromedriver with it) after the module."""
    profile = tempfile.mkdtemp(prefix="console-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SE_OFFLINE", "true")
        driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(browser: webdriver.Chrome) -> Iterator[webdriver.Chrome]:
    """The browser without cookies (they ignore ports; every test has a console of its own).

    After the test, the browser's log must hold no error (a CSP violation, a failed load).
    """
    browser.execute_cdp_cmd("Network.clearBrowserCookies", {})
    browser.get_log("browser")
    yield browser
    problems = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert problems == [], f"the browser reported errors: {problems}"
