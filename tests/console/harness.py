"""What the console tests share: effectors serving a console, HTTP clients, page helpers.

Every effector runs in this process (``EffectorThread``) on 127.0.0.1 with its console on a
free port; clients keep cookies and do not follow redirects, so tests see what the guard does.
"""

from __future__ import annotations

import html
import re
import time
from pathlib import Path
from typing import Any

import httpx
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.support.wait import WebDriverWait

from beam_agents._protos import AgentEnvelope
from beam_agents.tools import ToolRegistry
from effector.launch import EffectorThread
from effector.server import ServerSettings
from effector.service import Tokens
from effector.store.intents import IntentRecord
from tests.console.runs_data import (
    agent_run,
    approval_intent,
    failed_event,
    key_runs,
    now_ms,
    submit,
    timer_error,
)

TOKEN = "console-test-token-3f9a1c"
KEY = b"customer-7"
_CSRF = re.compile(r'name="csrf_token" value="([0-9a-f]+)"')


def start_effector(
    tmp_path: Path,
    *,
    token: str | None = None,
    registry: ToolRegistry | None = None,
    host: str = "127.0.0.1",
    tls: tuple[bytes, bytes] | None = None,
    tokens: Tokens | None = None,
    policy_file: Path | None = None,
) -> EffectorThread:
    """An effector on ``host`` with its console on a free port; ``tls``: PEM cert and key.

    ``policy_file``: the effect policy it enforces (``serve --policy``).
    """
    settings = ServerSettings(
        listen=f"{host}:0",
        console_listen=f"{host}:0",
        token=token if tokens is None else tokens.primary,
        tokens=tokens,
        tls_cert=None if tls is None else tls[0],
        tls_key=None if tls is None else tls[1],
        policy_file=None if policy_file is None else str(policy_file),
    )
    tmp_path.mkdir(parents=True, exist_ok=True)
    store = f"sqlite:///{tmp_path / 'effector.db'}"
    return EffectorThread(store, registry or ToolRegistry(), settings)


_CELL = re.compile(r"</?(?:td|th|tr|dt|dd|p|br|pre|h\d)\b[^>]*>")
_TAG = re.compile(r"<[^>]+>")


def page_text(page: str) -> str:
    """A page's text as a person reads it: tags dropped, entities decoded, spaces collapsed."""
    return " ".join(html.unescape(_TAG.sub("", _CELL.sub(" ", page))).split())


def between(page: str, start: str, end: str) -> str:
    """The part of ``page`` from ``start`` to the next ``end``."""
    begins = page.index(start)
    return page[begins : page.index(end, begins)]


def console_url(effector: EffectorThread) -> str:
    """The console's base URL, without the trailing slash."""
    assert effector.console_url is not None
    return effector.console_url.rstrip("/")


def client_for(effector: EffectorThread, **options: Any) -> httpx.Client:
    """A client for the effector's console that keeps cookies and does not follow redirects."""
    return httpx.Client(base_url=console_url(effector), follow_redirects=False, **options)


def csrf_of(html: str) -> str:
    """The CSRF token a console page's forms carry (the security gate reads pages with it)."""
    found = _CSRF.search(html)
    assert found is not None, "the page has no CSRF field"
    return found.group(1)


def follow(driver: Any, element: Any) -> None:
    """Click a link or submit button and wait until the page it leads to has replaced this one."""
    element.click()
    WebDriverWait(driver, 30).until(lambda _: _replaced(element))
    WebDriverWait(driver, 30).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )


def _replaced(element: Any) -> bool:
    """Whether ``element``'s page is gone (Selenium's ``staleness_of``, and one more answer).

    Mid-navigation, ChromeDriver may report the node as not in the document with a generic
    error rather than as stale; it means the same.
    """
    try:
        element.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as error:
        if "does not belong to the document" in str(error):
            return True
        raise
    return False


def body_text(driver: Any) -> str:
    """The visible text of the browser's page."""
    return str(driver.find_element("tag name", "body").text)


def seed(effector: EffectorThread) -> dict[str, str]:
    """Three runs, an approval waiting, a failed event and a timer error; their ids."""
    store = effector.server.store
    events = key_runs(KEY, 2) + agent_run(KEY, 2, time.time_ns(), completed=False)
    effector.run(store.record_traces(events, now_ms()))
    approval = approval_intent(KEY, 2, {"refund": "r-7", "cents": 75_000}, now_ms())
    effector.run(submit(store, approval))
    effector.run(store.record_errors([failed_event(KEY, b'{"refund": "r-9"}')], now_ms()))
    effector.run(store.record_errors([timer_error(KEY)], now_ms()))
    errors = effector.run(store.list_errors(None, 10))
    redrivable = next(e for e in errors if e.error.envelope).error_id
    timer = next(e for e in errors if not e.error.envelope).error_id
    return {"approval": approval.intent_id, "error": redrivable, "timer_error": timer}


def log_envelopes(effector: EffectorThread) -> list[AgentEnvelope]:
    """Every envelope on the effector's log, in order."""
    return [record.envelope for record in effector.run(effector.server.store.read(1, 100))]


def intent(effector: EffectorThread, intent_id: str) -> IntentRecord:
    """What the effector's store holds about one intent."""
    record = effector.run(effector.server.store.get_intent(intent_id))
    assert record is not None
    return record


def empty_registry() -> ToolRegistry:
    """No tools: what the console's subprocess effectors load (``--tools``)."""
    return ToolRegistry()
