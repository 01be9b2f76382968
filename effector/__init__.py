"""The effector: a gRPC sidecar that executes each side-effecting intent once.

Agents never perform side effects; they stage ``ToolIntent`` messages, which the pipeline
submits here. The effector records each intent, executes it with ``EffectorToolRunner``,
records the ``ToolResult`` and publishes it on an ordered envelope log that the pipeline reads
back (``Read``); approvers list what awaits them (``ListIntents``) and decide (``Decide``).
It never imports Apache Beam. Run it with ``beam-agents-effector serve`` or
``python -m effector serve`` (see ``--help``).

Guarantees
----------
- **One durable record per intent id.** The first Submit of an id records the intent (all of
  its fields, with a content digest). A later Submit of the same id with identical content is
  a DUPLICATE and changes nothing; with different content it is REJECTED as a conflict and
  the first is kept. A duplicate submit never executes anything, so an intent executes at
  most once except in the window below. Records are kept for the result retention period
  (``--result-retention-s``, default 7 days) after the intent is DONE; deduplication holds
  for every intent within it, and an id submitted again after its record was pruned is new.
- **Per-key order, cross-key concurrency.** The TOOL intents of one ``entity_key`` execute
  one at a time in ``(seq, step_index)`` order (among those submitted so far); an intent
  starts only after the one before it in its key is DONE. Different keys execute
  concurrently, up to ``--concurrency``. APPROVAL intents are never executed and do not hold
  their key: they wait for ``Decide``.
- **Phase order per intent:** refuse-expired → claim with a lease → execute → record the
  result durably → publish. Recording and publishing are one transaction, so every published
  result is durable, and a result is published exactly once. A crash before execution
  starts loses nothing: the intent is claimed again (on SQLite at the next start, on
  PostgreSQL when the lease runs out, by any replica) with its attempt count increased.
- **The only duplicate window** is a crash (or lost lease) after a tool started and before its
  result was recorded: the intent then executes again. A tool that declares a keyword-only
  ``intent: IntentInfo`` parameter receives ``intent_id`` (and ``attempt``) and can pass the
  id downstream as an idempotency key, which closes that window. If two attempts do finish,
  the first result recorded is the one kept and published.
- **Expiry uses the effector's wall clock** (processing time), never event time. The TTL
  window ``expires_at_ms - created_at_ms`` (both minted by the pipeline from event time) is
  anchored at ``max(created_at_ms, first_received_at_ms)``, where ``first_received_at_ms`` is
  recorded durably when the intent is first accepted. An intent is EXPIRED when
  ``now > anchor + (expires_at_ms - created_at_ms)``; ``expires_at_ms == 0`` means never.
  Replaying a backlog with old event times therefore does not mass-expire it, while an intent
  held at the effector longer than its TTL is refused before it is claimed. An undecided
  APPROVAL past the same deadline is expired by the worker on its own and published as a
  ``tool_result`` envelope with status EXPIRED.
- **Rejections are published.** An intent with a valid id and key that cannot run (unknown
  tool, read-only tool, bad JSON, invalid arguments, an ``intent`` argument, unknown kind) is
  recorded as DONE with a REJECTED result and published, so a suspended agent resumes. An
  intent whose id is not a canonical UUID or whose key is empty is refused in its
  acknowledgement and not recorded.
- **Redelivery on request.** A Submit with ``redeliver_results`` set appends, for each
  DUPLICATE whose intent is already DONE, the envelope that published its result to the log
  again: the same bytes at a new offset (for a decided approval its ``Approval`` envelope,
  otherwise its ``tool_result`` envelope, REJECTED and EXPIRED included). A pipeline that
  replays its events from fresh state thus receives the results its agents wait for, while
  nothing executes again; a duplicate of an intent not yet DONE appends nothing (its result
  is published when it completes). ``RunAgent`` refuses a result it has already applied.
- **Stores** are pluggable by URL and pass one conformance suite: SQLite (embedded, default,
  one process, fsync on every commit) and PostgreSQL (shared by replicas; keys are claimed
  with row locks, ``FOR UPDATE SKIP LOCKED``, under leases that are renewed while tools run).
  Concurrent Submits are group-committed: each is acknowledged only after the transaction
  holding it committed, and answers as if the Submits had been recorded one after another,
  in arrival order. A replica started with ``--concurrency 0`` is ingest-only: it records and
  publishes but executes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from effector.runner import EffectorToolRunner

__all__ = ["EffectorToolRunner"]


def __getattr__(name: str) -> Any:
    # Lazy, so that ``import effector`` (and the CLI's --help) stays cheap.
    if name == "EffectorToolRunner":
        from effector.runner import EffectorToolRunner

        return EffectorToolRunner
    raise AttributeError(f"module 'effector' has no attribute {name!r}")
