"""The worker: claims runnable intents, executes them, records and publishes their results.

Per intent: refuse-expired and claim with a lease → execute (``EffectorToolRunner``) → record
the result and append its envelope (one transaction, group-committed) → release the key, and
claim work for the slots the group's results free (in that commit on SQLite). Keys run
concurrently up to ``concurrency``; leases are renewed while tools run, undecided approvals
expired and old records (intents, envelopes, telemetry) pruned on the worker's own schedule.
See ``effector/README.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import effector.audit as audit
from beam_agents._protos import ToolResult
from beam_agents.tools import ToolRegistry
from effector.backoff import StoreOutage
from effector.errors import StoreError
from effector.group_commit import GroupCommit
from effector.intents import wall_clock_ms
from effector.metrics import EffectorMetrics
from effector.reconcile import Found, InDoubt, NotFound, settle
from effector.runner import EffectorToolRunner
from effector.store.base import Claim, ClaimBatch, ClaimRequest, Completion, EffectorStore

_log = logging.getLogger(__name__)

_APPROVAL_EXPIRY_BATCH = 1_000
DEFAULT_TELEMETRY_RETENTION_MS = 7 * 24 * 3_600_000
"""How long stored trace events and error records are kept unless told otherwise."""


GAUGE_COUNT_SHARE = 0.02
"""The most of the time the queue-depth gauge's count may take, up to the cap below: after a
count that took T, the next waits T / this (a backlog of 100,000 intents is counted every few
seconds, not each), but never longer than ``GAUGE_COUNT_WAIT_MAX_S``."""
GAUGE_COUNT_WAIT_MAX_S = 30.0
"""The longest the gauges go uncounted, however slow one count was (a stall, not the count)."""


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """How the worker paces itself; every duration is in milliseconds."""

    concurrency: int = 64
    """Intents executed at once (each of a different key).

    0 makes an ingest-only replica: it records, publishes and keeps house, but never claims;
    the other replicas on its (PostgreSQL) store execute.
    """
    lease_ms: int = 30_000
    """How long a claim stays valid without renewal; renewed every third of it."""
    result_retention_ms: int = 7 * 24 * 3_600_000
    """DONE intents and envelopes older than this may be pruned (dedup holds within it)."""
    poll_interval_ms: int = 100
    """The longest the worker sleeps before looking for work it was not told about."""
    housekeeping_interval_ms: int = 1_000
    """How often approvals are expired, leases renewed and gauges refreshed (the gauges less
    often while counting the intents in flight is slow: see ``GAUGE_COUNT_SHARE``)."""

    def __post_init__(self) -> None:
        if self.concurrency < 0:
            raise ValueError(f"concurrency must not be negative, got {self.concurrency}")
        for name in (
            "lease_ms",
            "result_retention_ms",
            "poll_interval_ms",
            "housekeeping_interval_ms",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


def default_owner() -> str:
    """An owner id unique to this process, recorded on its leases (for diagnosis)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Worker:
    """Executes the intents of one store; see the module docstring for the phase order."""

    def __init__(
        self,
        store: EffectorStore,
        registry: ToolRegistry,
        runner: EffectorToolRunner,
        metrics: EffectorMetrics,
        settings: WorkerSettings,
        *,
        owner: str | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        telemetry_retention_ms: int = DEFAULT_TELEMETRY_RETENTION_MS,
    ) -> None:
        if telemetry_retention_ms <= 0:
            raise ValueError(
                f"telemetry_retention_ms must be positive, got {telemetry_retention_ms}"
            )
        self._telemetry_retention_ms = telemetry_retention_ms
        self._store = store
        self._registry = registry
        self._runner = runner
        self._metrics = metrics
        self._settings = settings
        self._owner = owner or default_owner()
        self._clock = clock
        self._claims: dict[str, Claim] = {}
        self._reserved = 0
        """Slots promised to claim transactions in progress, not yet in ``_claims``."""
        self._unstarted: list[Claim] = []
        """Claims a commit made as a drain began: given back at its end, never run."""
        self._abandoned_commit: asyncio.Future[tuple[list[bool], ClaimBatch]] | None = None
        """A record-and-claim commit left running when a drain gave up waiting for it."""
        self._executions: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._stopping = False
        self._stopped = asyncio.Event()
        """Set by :meth:`drain`: ends a claim loop waiting out a store outage."""
        self._outage = StoreOutage()
        self._recorder: GroupCommit[Completion, bool] = GroupCommit(self._record)
        self._loops: list[asyncio.Task[None]] = []
        self._next_count_at = 0.0
        """When (``time.monotonic``) the gauges may next count the intents in flight."""

    @property
    def owner(self) -> str:
        """The id this worker records on its leases."""
        return self._owner

    def start(self) -> None:
        """Start claiming and executing; call once, from the event loop."""
        self._loops = [
            asyncio.create_task(self._claim_loop(), name="effector-claims"),
            asyncio.create_task(self._housekeeping_loop(), name="effector-housekeeping"),
        ]

    def wake(self) -> None:
        """Look for runnable work now (new intents were submitted, or a key was released)."""
        self._wake.set()

    async def drain(self, grace_s: float) -> None:
        """Stop claiming, let executions finish for up to ``grace_s``, record, release the rest.

        Executions still running after the grace period are cancelled and their claims given
        back, so their intents run again (as a new attempt) when an effector next starts; so
        do executions whose results the store cannot take within another ``grace_s``.
        """
        self._stopping = True
        self._stopped.set()
        self.wake()
        claim_loop, housekeeping = self._loops
        await claim_loop
        if self._executions:
            _, unfinished = await asyncio.wait(set(self._executions), timeout=grace_s)
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)
        housekeeping.cancel()
        await asyncio.gather(housekeeping, return_exceptions=True)
        try:
            await asyncio.wait_for(self._recorder.drain(), grace_s)
        except TimeoutError:
            _log.warning("the store did not take the last results; those intents will run again")
            await self._give_back_abandoned(grace_s)
        unstarted, self._unstarted = self._unstarted, []
        if unstarted:
            try:
                await self._store.release(unstarted, started=False)
            except StoreError as exc:
                _log.warning("releasing unstarted claims failed; their leases will expire: %s", exc)
        if self._claims:
            abandoned = list(self._claims.values())
            _log.warning("releasing %d claim(s) still running at shutdown", len(abandoned))
            try:
                await self._store.release(abandoned)
            except StoreError as exc:
                _log.warning("releasing claims failed; their leases will expire: %s", exc)

    def _free_slots(self) -> int:
        """Slots neither executing nor reserved by a claim in progress (0 once draining)."""
        if self._stopping:
            return 0
        return self._settings.concurrency - len(self._claims) - self._reserved

    async def _claim_loop(self) -> None:
        settings = self._settings
        if settings.concurrency == 0:
            return  # ingest-only: never claims, so every Submit's wake() would be wasted work
        while not self._stopping:
            self._wake.clear()
            free = self._free_slots()
            if free > 0:
                self._reserved += free
                try:
                    batch = await self._store.claim(
                        self._owner, free, self._clock(), settings.lease_ms
                    )
                except Exception as exc:
                    if not isinstance(exc, StoreError):  # a bug, not an outage: say where
                        _log.error("claiming work raised %r", exc, exc_info=exc)
                    delay_s = self._outage.failed("claiming work", exc)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopped.wait(), delay_s)
                    continue
                finally:
                    self._reserved -= free
                self._outage.succeeded("claiming work")
                self._start_batch(batch)
                if batch.claims or batch.expired:
                    continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), settings.poll_interval_ms / 1000)

    def _start_batch(self, batch: ClaimBatch) -> None:
        if batch.expired:
            self._metrics.expired.inc(batch.expired)
        for claim in batch.claims:
            if self._stopping:
                # Claimed by a commit that began before the drain: never started, given back.
                self._unstarted.append(claim)
            else:
                self._start(claim)

    def _start(self, claim: Claim) -> None:
        self._claims[claim.token] = claim
        task = asyncio.create_task(self._execute(claim), name=f"effector-intent:{claim.token}")
        self._executions.add(task)
        task.add_done_callback(self._executions.discard)

    async def _execute(self, claim: Claim) -> None:
        metrics = self._metrics
        metrics.in_flight.inc()
        try:
            if await self._run_claim(claim):
                return  # recorded: the commit that took its result claimed its key's next work
            self._claims.pop(claim.token, None)
        except Exception:
            # Only a defect in the effector gets here (tool failures become ERROR results);
            # giving the claim back keeps the key from being blocked by a renewed lease.
            _log.exception(
                "executing intent %s failed; releasing its claim", claim.intent.intent_id
            )
            self._claims.pop(claim.token, None)
            try:
                await self._store.release([claim])
            except StoreError as exc:
                _log.warning("releasing the claim failed; its lease will expire: %s", exc)
        finally:
            metrics.in_flight.dec()
        self.wake()

    async def _run_claim(self, claim: Claim) -> bool:
        """Settle, reconcile or execute ``claim``; ``True`` once its result was recorded.

        ``False``: it ended without a result of the worker's to record (a settled compensation,
        an intent left IN_DOUBT), so the claim loop must look for work in its place.
        """
        metrics = self._metrics
        if claim.intent.compensates_intent_id and await self._settled_compensation(claim):
            return False
        # Reconcile before re-executing (see effector/reconcile.py).
        settled = await settle(self._runner, self._registry, claim, self._clock)
        if isinstance(settled, InDoubt):
            metrics.reconciliations.labels("failed").inc()
            await self._leave_in_doubt(claim, settled)
            return False
        if isinstance(settled, Found):
            metrics.reconciliations.labels("found").inc()
            await self._recorder(Completion(claim, settled.result))
        elif isinstance(settled, NotFound) and settled.expired is not None:
            if await self._recorder(Completion(claim, settled.expired)):
                metrics.expired.inc()
                audit.expired([claim.intent])
        else:
            if isinstance(settled, NotFound):
                metrics.reconciliations.labels("not_found").inc()
            started = time.perf_counter()
            result = await self._runner.execute(
                self._registry, claim.intent, attempt=claim.attempt, clock=self._clock
            )
            metrics.tool_latency.labels(claim.intent.tool_name).observe(
                time.perf_counter() - started
            )
            if await self._recorder(Completion(claim, result)):
                metrics.executed.labels(ToolResult.Status.Name(result.status)).inc()
        return True

    async def _settled_compensation(self, claim: Claim) -> bool:
        """Settle a compensation in the store (through outages); ``False``: execute it.

        The store records its NOT_NEEDED or REJECTED verdict itself; a claim that lost its key
        is dropped (the key's holder settles it).
        """
        while True:
            try:
                settled = await self._store.settle_compensation(claim, self._clock())
            except StoreError as exc:
                await asyncio.sleep(self._outage.failed("settling a compensation", exc))
                continue
            self._outage.succeeded("settling a compensation")
            break
        if settled.execute:
            return False
        result = settled.result
        if result is not None and settled.recorded:
            self._metrics.executed.labels(ToolResult.Status.Name(result.status)).inc()
            if result.status == ToolResult.REJECTED:
                audit.rejected(claim.intent, result.error_message)
            else:
                audit.not_needed(claim.intent, result.error_message)
        return True

    async def _leave_in_doubt(self, claim: Claim, in_doubt: InDoubt) -> None:
        """Record the claim's intent IN_DOUBT (its key held until the retry), through outages."""
        while True:
            now = self._clock()
            try:
                await self._store.mark_in_doubt(
                    claim, in_doubt.reason, now, now + in_doubt.retry_in_ms
                )
            except StoreError as exc:
                await asyncio.sleep(self._outage.failed("recording an intent in doubt", exc))
                continue
            self._outage.succeeded("recording an intent in doubt")
            return

    async def _record(self, completions: Sequence[Completion]) -> list[bool]:
        """Record a group of results, then claim work for the slots they free, at once.

        (:meth:`EffectorStore.complete_and_claim`: one transaction on SQLite, two on
        PostgreSQL.) The claims start only after the results' commit: a key's next intent runs
        once the result before it is durable and published.
        """
        while True:
            # These results' claims still count in _claims: their slots are the ones freed.
            free = 0 if self._stopping else self._free_slots() + len(completions)
            request = ClaimRequest(self._owner, max(free, 0), self._settings.lease_ms)
            self._reserved += request.limit
            # Shielded: a drain that gives up on this commit must not lose what it claimed.
            commit = asyncio.ensure_future(
                self._store.complete_and_claim(completions, self._clock(), request)
            )
            try:
                recorded, batch = await asyncio.shield(commit)
            except asyncio.CancelledError:
                self._abandoned_commit = commit  # the drain releases what it claims
                raise
            except StoreError as exc:
                # Results stay in memory until the store is back: nothing executed is dropped.
                await asyncio.sleep(self._outage.failed("recording results", exc))
                continue
            finally:
                self._reserved -= request.limit
            self._outage.succeeded("recording results")
            for completion in completions:
                self._claims.pop(completion.claim.token, None)
            self._start_batch(batch)
            if batch.expired or (request.limit and not batch.claims):
                self.wake()  # slots left unfilled: refused heads, or a claim that failed
            return recorded

    async def _give_back_abandoned(self, grace_s: float) -> None:
        """Release what the commit a timed-out drain abandoned claimed, once it is done."""
        commit, self._abandoned_commit = self._abandoned_commit, None
        if commit is None:
            return
        try:
            _, batch = await asyncio.wait_for(asyncio.shield(commit), grace_s)
        except Exception as exc:  # the store is out, or slower than the grace: leases expire
            _log.warning(
                "an abandoned commit did not finish; its claims' leases will expire: %s", exc
            )
            return
        if batch.claims:
            try:
                await self._store.release(list(batch.claims), started=False)
            except StoreError as exc:
                _log.warning("releasing abandoned claims failed; their leases will expire: %s", exc)

    async def _housekeeping_loop(self) -> None:
        settings = self._settings
        renew_every_ms = settings.lease_ms // 3
        shortest_retention_ms = min(settings.result_retention_ms, self._telemetry_retention_ms)
        prune_every_ms = min(60_000, max(shortest_retention_ms // 4, 1))
        last_renewal = last_prune = self._clock()
        interval_s = wait_s = settings.housekeeping_interval_ms / 1000
        while True:
            await asyncio.sleep(wait_s)
            wait_s = interval_s
            now = self._clock()
            try:
                if now - last_renewal >= renew_every_ms:
                    last_renewal = now
                    await self._renew(now)
                expired = await self._store.expire_approvals(now, _APPROVAL_EXPIRY_BATCH)
                if expired:
                    self._metrics.expired.inc(expired)
                if now - last_prune >= prune_every_ms:
                    last_prune = now
                    await self._store.prune(now, settings.result_retention_ms)
                    await self._store.prune_telemetry(now, self._telemetry_retention_ms)
                await self._refresh_gauges()
            except StoreError as exc:
                wait_s = max(interval_s, self._outage.failed("housekeeping", exc))
            else:
                self._outage.succeeded("housekeeping")

    async def _refresh_gauges(self) -> None:
        """Set the queue-depth and in-doubt gauges, as often as their count's cost allows."""
        started = time.monotonic()
        if started < self._next_count_at:
            return
        counts = await self._store.counts(done=False)
        took_s = time.monotonic() - started
        self._next_count_at = started + min(took_s / GAUGE_COUNT_SHARE, GAUGE_COUNT_WAIT_MAX_S)
        self._metrics.queue_depth.set(
            counts.pending + counts.running + counts.in_doubt + counts.awaiting_decision
        )
        self._metrics.in_doubt.set(counts.in_doubt)

    async def _renew(self, now: int) -> None:
        claims = list(self._claims.values())
        if not claims:
            return
        held = await self._store.renew(claims, now, self._settings.lease_ms)
        for claim in claims:
            # Not held and not finished meanwhile: the lease ran out before this renewal, so
            # the intent may be executing elsewhere too; the first recorded result wins.
            if claim.token not in held and claim.token in self._claims:
                _log.warning("lease on intent %s ran out before renewal", claim.intent.intent_id)
