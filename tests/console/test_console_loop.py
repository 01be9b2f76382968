# mypy: disallow-untyped-calls=False
"""Acceptance: approve a suspended pipeline's approval in the inbox, see its runs complete.

A real loop on Beam's ``FnApiRunner`` runs on a thread: ``ReadEnvelopes`` → ``RunAgent`` →
``SubmitIntents``, with ``.traces`` and ``.errors`` stored in the effector by ``WriteTraces`` and
``WriteErrors``. Two refunds arrive for one key. For each the agent asks the model and looks up
the order (a read-only tool), both taking visible time; the large refund needs a reviewer's
approval, so its run suspends (the small one waits in the key's buffer meanwhile). In Chromium,
a reviewer approves it in the console's inbox; the agent resumes and has the effector pay the
refund, then runs the small one, and the keys page shows both runs completed, with their
waterfalls and memory. With ``BEAM_AGENTS_SCREENSHOT=1`` it saves that page as
``docs/console-keys.png``, the docs' picture of the keys page (docs/operations.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path

import apache_beam as beam
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner
from selenium import webdriver
from selenium.webdriver.common.by import By

from beam_agents import AgentConfig, Deny, FallbackContext, HitlPolicy, RunAgent
from beam_agents._protos import AgentEnvelope
from beam_agents.core.agent import Complete, Suspend
from beam_agents.core.context import ActivationContext
from beam_agents.io import ReadEnvelopes, SubmitIntents, WriteErrors, WriteTraces
from beam_agents.model.client import LlmRequest
from beam_agents.model.fake import FakeLLM, match_any, respond_with
from beam_agents.tools import ToolRegistry, tool
from tests.console.harness import body_text, console_url, follow, start_effector

KEY = b"refund-customer-31"
WAIT_S = 60.0
APPROVAL_CENTS = 50_000
"""Refunds from this amount on need a reviewer's approval."""
REFUNDS = [{"refund": "r-31", "cents": 64_000}, {"refund": "r-32", "cents": 1_900}]
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "console-keys.png"
SCREENSHOT_ENV = "BEAM_AGENTS_SCREENSHOT"
_OUTPUTS: list[bytes] = []  # FnApiRunner runs the DoFns in this process
_LOCK = threading.Lock()


class _Keep(beam.DoFn):
    def process(self, element: bytes) -> None:
        with _LOCK:
            _OUTPUTS.append(element)


@tool(side_effect=True)
def pay_refund(refund: str, cents: int) -> str:
    """Pay a refund back.

    Args:
        refund: The refund's id.
        cents: How much, in cents.
    """
    return f"paid {refund}"


@tool
async def order_history(refund: str) -> str:
    """Look up the order a refund is for.

    Args:
        refund: The refund's id.
    """
    await asyncio.sleep(0.12)  # a lookup over the network
    return json.dumps({"refund": refund, "orders": 14, "returns": 1})


def make_provider() -> FakeLLM:
    """A model that finds every refund plausible, after a provider's latency."""
    answer = b"Plausible: the order is delivered and this customer rarely returns anything."
    return FakeLLM([(match_any(), respond_with(answer, latency_ms=450))])


def deny_unanswered(fallback: FallbackContext) -> Deny:
    """Nobody decided in time."""
    return Deny(b"no decision")


async def refunds(ctx: ActivationContext) -> Complete | Suspend:
    """Ask the model, look the order up, ask a reviewer for a large refund, pay, complete."""
    if not ctx.is_resume:
        refund = json.loads(ctx.event)
        await ctx.call_model(LlmRequest(model_id="refund-checker", messages=[ctx.event.decode()]))
        history = await ctx.run_tool("order_history", {"refund": refund["refund"]})
        ctx.memory.set("request", ctx.event)
        ctx.memory.set("order_history", history.encode())
        if refund["cents"] >= APPROVAL_CENTS:
            ctx.request_approval(refund)
        else:
            ctx.act("pay_refund", refund)
        return Suspend(snapshot=ctx.event)
    if ctx.resume_approval is not None:
        if not ctx.resume_approval.approved:
            return Complete(output=b"declined")
        ctx.act("pay_refund", json.loads(ctx.snapshot))
        return Suspend(snapshot=ctx.snapshot)
    assert ctx.resume_result is not None
    return Complete(output=ctx.resume_result.payload)


def run_loop(address: str, failures: list[BaseException]) -> None:
    """The pipeline, until the effector is idle and every envelope is read."""
    now_ms = time.time_ns() // 1_000_000
    events = [
        AgentEnvelope(
            entity_key=KEY, event_time_ms=now_ms + n, external_event=json.dumps(refund).encode()
        )
        for n, refund in enumerate(REFUNDS)
    ]
    policy = HitlPolicy(
        timeout_ms=600_000,
        intent_ttl_ms=600_000,
        approval_channel="refund-reviewers",
        on_timeout=deny_unanswered,
    )
    config = AgentConfig(
        provider_factory=make_provider,
        tool_registry=ToolRegistry([order_history, pay_refund]),
        hitl_policy=policy,
    )
    try:
        with beam.Pipeline(runner=FnApiRunner()) as pipeline:
            keyed = pipeline | ReadEnvelopes(address, events=events, stop_when_idle_s=1.0)
            ran = keyed | RunAgent(refunds, config=config)
            ran.intents | SubmitIntents(address)
            ran.traces | WriteTraces(address)
            ran.errors | WriteErrors(address)
            ran.output | beam.ParDo(_Keep())
    except BaseException as failure:  # reported by the test, not lost on this thread
        failures.append(failure)


def wait_for_text(driver: webdriver.Chrome, url: str, text: str) -> None:
    """Load ``url`` until its page shows ``text``."""
    deadline = time.monotonic() + WAIT_S
    while True:
        driver.get(url)
        if text in body_text(driver):
            return
        assert time.monotonic() < deadline, f"{url} never showed {text!r}"
        time.sleep(0.3)


def save_whole_page(driver: webdriver.Chrome, path: Path, width: int = 1400) -> None:
    """Save the page, ``width`` pixels wide and as tall as it is, as a PNG at ``path``."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    metrics = {"width": width, "height": int(height), "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    try:
        path.parent.mkdir(exist_ok=True)
        assert driver.save_screenshot(str(path))
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_approve_in_the_inbox_and_see_the_runs_complete(
    page: webdriver.Chrome, tmp_path: Path
) -> None:
    failures: list[BaseException] = []
    _OUTPUTS.clear()
    with start_effector(tmp_path, registry=ToolRegistry([pay_refund])) as effector:
        base = console_url(effector)
        loop = threading.Thread(target=run_loop, args=(effector.address, failures))
        loop.start()
        try:
            wait_for_text(page, f"{base}/approvals", "refund-customer-31")
            wait_for_text(page, f"{base}/keys/{KEY.hex()}", "SUSPENDED")
            assert "AWAITING_DECISION" in page.find_element(By.ID, "suspension").text
            time.sleep(1.5)  # the reviewer reads the request: the wait shows on the waterfall

            page.get(f"{base}/approvals")
            page.find_element(By.NAME, "approver").send_keys("dana")
            page.find_element(By.NAME, "reason").send_keys("receipt checked")
            follow(page, page.find_element(By.CSS_SELECTOR, "button.approve"))
            assert "approved by dana" in page.find_element(By.CSS_SELECTOR, "p.notice").text
        finally:
            loop.join(timeout=WAIT_S * 2)
        assert not loop.is_alive(), "the pipeline did not finish after the approval"
        assert failures == []
        assert _OUTPUTS == [b'"paid r-31"', b'"paid r-32"']

        page.get(f"{base}/keys/{KEY.hex()}")
        runs = page.find_elements(By.CSS_SELECTOR, "section.run")
        assert [run.get_attribute("id") for run in runs] == ["run-1", "run-0"]
        statuses = [run.find_element(By.CSS_SELECTOR, ".status").text for run in runs]
        assert statuses == ["COMPLETED", "COMPLETED"]
        for run in runs:
            rows = [row.text for row in run.find_elements(By.CSS_SELECTOR, "tr th")]
            assert rows[:3] == ["activation (event)", "model refund-checker", "tool order_history"]
            assert "intent pay_refund" in rows and rows[-1] == "completed"
            model = run.find_element(By.CSS_SELECTOR, "tr.llm rect")
            assert model.size["width"] > 0
        approved = [row.text for row in runs[1].find_elements(By.CSS_SELECTOR, "tr th")]
        assert "intent approval" in approved and "activation (approval)" in approved
        assert "Not suspended" in page.find_element(By.ID, "suspension").text
        slots = [slot.text for slot in page.find_elements(By.CSS_SELECTOR, "#memory code")]
        assert slots == ["order_history", "request"]
        if os.environ.get(SCREENSHOT_ENV) == "1":
            save_whole_page(page, SCREENSHOT)
        page.get(f"{base}/errors")
        assert "No errors stored" in body_text(page)
