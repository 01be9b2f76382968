"""Effect policies: CEL rules over each TOOL intent, checked at intake before anything runs.

A policy file (TOML, ``serve --policy FILE``) declares counters and rules. Rules are tried in
file order; the first whose ``when`` holds decides (``allow``, ``deny`` or
``require_approval``); an intent no rule matches gets the file's ``default``. A rule that
cannot be evaluated denies (fail closed). ``docs/effector.md``, "Effect policies", is the
reference.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import hashlib
import json
import logging
import os
import re
import tomllib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cel

from beam_agents._protos import PoliciesResponse, PolicyCounter, PolicyRule, ToolIntent
from beam_agents._protos.bounds import window_ms
from effector.store.intents import gate_id_for

_log = logging.getLogger("effector.policy")

MAX_POLICY_BYTES = 1 << 20
"""A policy file larger than this is refused."""
MAX_RULES = 1_000
MAX_APPROVALS = 100
"""The largest quorum a rule may require."""
MAX_REASON_CHARS = 1_000
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,127}\Z")
_COUNTER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
_BOUND = re.compile(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_]\w*)\s*,")
_COUNTER_USE = re.compile(r"\bcounters\s*(?:\.\s*([A-Za-z_]\w*)|\[\s*[\"']([^\"']*)[\"']\s*\])")
VARIABLES = frozenset(
    {
        "tool",
        "args",
        "key",
        "tenant",
        "namespace",
        "seq",
        "step",
        "now",
        "created_at",
        "compensates",
        "counters",
    }
)
"""The names a rule's ``when`` may use (plus those its macros bind)."""


class Outcome(enum.Enum):
    """What a rule decides about an effect."""

    ALLOW = "allow"
    DENY = "deny"
    REQUIRE_APPROVAL = "require_approval"


class CountedBy(enum.Enum):
    """Whose effects a counter counts."""

    KEY = "key"
    """The intent's own entity key."""
    TENANT = "tenant"
    """Every key of the intent's tenant (the key's text up to the file's tenant separator)."""
    FLEET = "fleet"
    """Every key."""


class PolicyError(ValueError):
    """A policy file that cannot be enforced; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class EffectCounter:
    """Effects of ``tool`` in the trailing ``window_ms``, per key, tenant or fleet."""

    name: str
    tool: str
    per: CountedBy
    window_ms: int


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule: when ``condition`` holds for an intent, ``outcome`` decides it."""

    name: str
    when: str
    outcome: Outcome
    line: int
    condition: cel.Program = dataclasses.field(repr=False, compare=False)
    reason: str = ""
    channel: str = ""
    approvals: int = 1
    counters: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Policy:
    """A parsed policy file."""

    source: str
    digest: str
    rules: tuple[Rule, ...]
    counters: Mapping[str, EffectCounter]
    default: Outcome = Outcome.ALLOW
    tenant_separator: str = ""
    variables: frozenset[str] = frozenset()
    """The variables some rule uses: only they are built for an intent."""
    counted: frozenset[str] = frozenset()
    """The counters some rule uses: only they are counted."""

    def tenant_of(self, entity_key: bytes) -> bytes:
        """The key's tenant: its bytes up to the tenant separator (the whole key without one)."""
        separator = self.tenant_separator.encode()
        if separator:
            head, found, _ = entity_key.partition(separator)
            if found:
                return head + separator
        return entity_key


@dataclass(frozen=True, slots=True)
class Verdict:
    """A policy's decision on one intent."""

    outcome: Outcome
    rule: str = ""
    """The rule that decided (empty: the file's default, or no policy)."""
    reason: str = ""
    channel: str = ""
    approvals: int = 1

    def rejection(self) -> str | None:
        """The REJECTED result's message for a deny (``None`` otherwise)."""
        if self.outcome is not Outcome.DENY:
            return None
        decided = f"rule {self.rule!r}" if self.rule else "the policy's default"
        return f"denied by effect policy: {decided}" + (f": {self.reason}" if self.reason else "")


_DEFAULTS = {outcome: Verdict(outcome) for outcome in Outcome}
"""The verdict of the file's default, one per outcome (shared: verdicts are immutable)."""


def parse_window(text: object, where: str) -> int:
    """``"90s"``, ``"15m"``, ``"24h"``, ``"7d"`` or ``"500ms"`` in milliseconds."""
    length = window_ms(text)
    if length is None:
        raise PolicyError(f"{where}: window must be a duration like 90s, 15m or 24h (366d at most)")
    return length


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """Read and parse the policy file at ``path``."""
    source = os.fspath(path)
    try:
        with open(source, "rb") as file:
            raw = file.read(MAX_POLICY_BYTES + 1)
    except OSError as exc:
        raise PolicyError(f"{source}: cannot read the policy file: {exc.strerror or exc}") from exc
    if len(raw) > MAX_POLICY_BYTES:
        raise PolicyError(f"{source}: the policy file is larger than {MAX_POLICY_BYTES} bytes")
    return parse_policy(raw, source)


def parse_policy(raw: bytes, source: str) -> Policy:
    """Parse a policy file's bytes; ``source`` names it in errors."""
    try:
        text = raw.decode("utf-8")
        document = tomllib.loads(text)
    except UnicodeDecodeError as exc:
        raise PolicyError(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except tomllib.TOMLDecodeError as exc:
        where = re.search(r"\(at line (\d+), column \d+\)$", str(exc))
        line = where[1] if where else "1"
        raise PolicyError(f"{source}:{line}: not TOML: {exc}") from None
    lines = _lines_starting(text, r"\[\[\s*rules\s*\]\]")
    if not document:
        raise PolicyError(
            f"{source}:1: the policy file is empty: it would allow every effect (write "
            'default = "allow" to mean that)'
        )
    _only(document, {"default", "tenant_separator", "counters", "rules"}, f"{source}:1", "file")
    default = _outcome(document.get("default", "allow"), f"{source}:1: default", deciding=True)
    separator = document.get("tenant_separator", "")
    if not isinstance(separator, str) or len(separator) > 16:
        raise PolicyError(f"{source}:1: tenant_separator must be a string of at most 16 chars")
    counters = _counters(document.get("counters", {}), source, text)
    raw_rules = document.get("rules", [])
    if not isinstance(raw_rules, list) or len(raw_rules) > MAX_RULES:
        raise PolicyError(f"{source}:1: rules must be an array of at most {MAX_RULES} tables")
    rules: list[Rule] = []
    for number, table in enumerate(raw_rules):
        line = lines[number] if number < len(lines) else 1
        rules.append(_rule(table, f"{source}:{line}", line, counters))
    seen: set[str] = set()
    for rule in rules:
        if rule.name in seen:
            raise PolicyError(f"{source}:{rule.line}: rule name {rule.name!r} is used twice")
        seen.add(rule.name)
    return Policy(
        source=source,
        digest=hashlib.sha256(raw).hexdigest(),
        rules=tuple(rules),
        counters=counters,
        default=default,
        tenant_separator=separator,
        variables=frozenset(
            name for rule in rules for name in rule.condition.variables() if name in VARIABLES
        ),
        counted=frozenset(name for rule in rules for name in rule.counters),
    )


def _lines_starting(text: str, pattern: str) -> list[int]:
    """The numbers of the lines that start with ``pattern`` (after blanks), in order."""
    starts = re.compile(r"\s*" + pattern)
    return [number for number, line in enumerate(text.splitlines(), start=1) if starts.match(line)]


def _only(table: object, allowed: set[str], where: str, what: str) -> None:
    if not isinstance(table, dict):
        raise PolicyError(f"{where}: {what} must be a table")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise PolicyError(f"{where}: unknown field {unknown[0]!r} in {what}")


def _outcome(value: object, where: str, *, deciding: bool = False) -> Outcome:
    try:
        outcome = Outcome(value)
    except ValueError:
        outcome = None
    if outcome is None or (deciding and outcome is Outcome.REQUIRE_APPROVAL):
        allowed = "allow or deny" if deciding else "allow, deny or require_approval"
        raise PolicyError(f"{where} must be {allowed}, not {value!r}")
    return outcome


def _counters(tables: object, source: str, text: str) -> dict[str, EffectCounter]:
    if not isinstance(tables, dict):
        raise PolicyError(f"{source}:1: counters must be a table of counter tables")
    counters: dict[str, EffectCounter] = {}
    for name, table in tables.items():
        line = next(iter(_lines_starting(text, rf"\[\s*counters\.{re.escape(name)}\s*\]")), 1)
        where = f"{source}:{line}: counter {name!r}"
        if not _COUNTER_NAME.match(name):
            raise PolicyError(f"{where}: a counter's name is letters, digits and _")
        _only(table, {"tool", "per", "window"}, where, "the counter")
        tool = table.get("tool")
        if not isinstance(tool, str) or not tool:
            raise PolicyError(f"{where}: tool must name the tool whose effects it counts")
        try:
            per = CountedBy(table.get("per", "key"))
        except ValueError:
            raise PolicyError(f"{where}: per must be key, tenant or fleet") from None
        counters[name] = EffectCounter(name, tool, per, parse_window(table.get("window"), where))
    return counters


def _rule(table: object, where: str, line: int, counters: Mapping[str, EffectCounter]) -> Rule:
    _only(table, {"name", "when", "outcome", "reason", "channel", "approvals"}, where, "a rule")
    assert isinstance(table, dict)
    name = table.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise PolicyError(f"{where}: a rule needs a name (letters, digits, _ . -; 128 at most)")
    where = f"{where}: rule {name!r}"
    when = table.get("when")
    if not isinstance(when, str) or not when.strip():
        raise PolicyError(f"{where}: when must be a CEL expression")
    try:
        condition = cel.compile(when)
    except ValueError as exc:
        raise PolicyError(f"{where}: when is not CEL: {exc}") from None
    bound = set(_BOUND.findall(when))
    unknown = sorted(set(condition.variables()) - VARIABLES - bound)
    if unknown:
        raise PolicyError(
            f"{where}: when uses {unknown[0]!r}, which is not one of {', '.join(sorted(VARIABLES))}"
        )
    used = {dotted or quoted for dotted, quoted in _COUNTER_USE.findall(when)}
    undeclared = sorted(used - set(counters))
    if undeclared:
        raise PolicyError(f"{where}: when uses counter {undeclared[0]!r}, which is not declared")
    if "counters" in condition.variables() and not used:
        used = set(counters)
    outcome = _outcome(table.get("outcome"), f"{where}: outcome")
    reason = table.get("reason", "")
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        raise PolicyError(f"{where}: reason must be text of at most {MAX_REASON_CHARS} chars")
    channel, approvals = table.get("channel", ""), table.get("approvals", 1)
    if outcome is Outcome.REQUIRE_APPROVAL:
        if not isinstance(channel, str) or not channel or len(channel) > 128:
            raise PolicyError(f"{where}: require_approval needs a channel (128 chars at most)")
        if type(approvals) is not int or not 1 <= approvals <= MAX_APPROVALS:
            raise PolicyError(f"{where}: approvals must be an integer from 1 to {MAX_APPROVALS}")
    elif "channel" in table or "approvals" in table:
        raise PolicyError(f"{where}: channel and approvals are for require_approval only")
    return Rule(
        name=name,
        when=when,
        outcome=outcome,
        line=line,
        condition=condition,
        reason=reason,
        channel=channel,
        approvals=approvals,
        counters=frozenset(used),
    )


def gate_for(intent: ToolIntent, verdict: Verdict) -> ToolIntent:
    """The APPROVAL intent that gates ``intent`` for a ``require_approval`` verdict."""
    return ToolIntent(
        intent_id=gate_id_for(intent.intent_id),
        entity_key=intent.entity_key,
        seq=intent.seq,
        step_index=intent.step_index,
        args_json=intent.args_json,
        created_at_ms=intent.created_at_ms,
        expires_at_ms=intent.expires_at_ms,
        kind=ToolIntent.APPROVAL,
        trace_id=intent.trace_id,
        channel=verdict.channel,
        required_approvals=verdict.approvals if verdict.approvals > 1 else 0,
        gated_tool=intent.tool_name,
        intent_namespace=intent.intent_namespace,
        policy_gate_for=intent.intent_id,
        policy_rule=verdict.rule,
    )


def group_of(policy: Policy, counter: EffectCounter, intent: ToolIntent) -> bytes:
    """The group whose effects ``counter`` counts for ``intent``: key, tenant prefix or fleet."""
    if counter.per is CountedBy.KEY:
        return intent.entity_key
    if counter.per is CountedBy.TENANT:
        return policy.tenant_of(intent.entity_key)
    return b""


_TOOL_NAMED = re.compile(r"""\btool\s*==\s*["']([^"']+)["']|["']([^"']+)["']\s*==\s*tool\b""")


def unknown_tools(policy: Policy, known: set[str]) -> list[str]:
    """Tools the rules compare ``tool`` with, or counters count, that ``known`` lacks (typos)."""
    named = {
        tool
        for rule in policy.rules
        for pair in _TOOL_NAMED.findall(rule.when)
        for tool in pair
        if tool
    }
    named |= {counter.tool for counter in policy.counters.values()}
    return sorted(named - known)


def policy_answer(policy: Policy, decisions: Mapping[str, int] | None = None) -> PoliciesResponse:
    """``policy`` as the ``Policies`` RPC describes it (``decisions``: counts by rule)."""
    counts = decisions or {}
    return PoliciesResponse(
        enforced=True,
        source=policy.source,
        digest=policy.digest,
        default_outcome=policy.default.value,
        rules=[
            PolicyRule(
                name=rule.name,
                when=rule.when,
                outcome=rule.outcome.value,
                reason=rule.reason,
                channel=rule.channel,
                approvals=rule.approvals,
                line=rule.line,
                decisions=counts.get(rule.name, 0),
            )
            for rule in policy.rules
        ],
        counters=[
            PolicyCounter(
                name=counter.name,
                tool=counter.tool,
                per=counter.per.value,
                window_ms=counter.window_ms,
            )
            for counter in policy.counters.values()
        ],
    )


CountEffects = Callable[[EffectCounter, Sequence[bytes], int], Awaitable[Mapping[bytes, int]]]
"""``(counter, groups, since_ms)`` -> the effects recorded since then in each group (a key, a
tenant prefix, or empty for the fleet), in one store transaction."""


def _timestamp(ms: int) -> datetime.datetime:
    seconds = min(max(ms, 0), 253_402_300_799_000) / 1000
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC)


class LivePolicy:
    """The policy an effector enforces now; reloads it from its file when asked or changed."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.loaded_at_ms = 0
        self.reload_error = ""
        self._signature = _signature(policy.source)

    @classmethod
    def open(cls, path: str | os.PathLike[str], now_ms: int) -> LivePolicy:
        """Load the file at ``path`` (raises :class:`PolicyError` if it is not a valid policy)."""
        gate = cls(load_policy(path))
        gate.loaded_at_ms = now_ms
        return gate

    def changed(self) -> bool:
        """Whether the file looks different from when it was last read (time, size, inode)."""
        return _signature(self.policy.source) != self._signature

    def reload(self, now_ms: int, *, force: bool = False) -> bool:
        """Read the file again if it changed (``force``: anyway); ``True`` if a new policy rules.

        A bad file keeps the policy in force; why is logged and kept in :attr:`reload_error`.
        """
        if not force and not self.changed():
            return False
        if force and not self.changed():
            _log.info("policy reload asked: %s is unchanged", self.policy.source)
        self._signature = _signature(self.policy.source)
        try:
            policy = load_policy(self.policy.source)
        except PolicyError as exc:
            self.reload_error = str(exc)
            _log.error("policy reload refused; the last good policy stays in force: %s", exc)
            return False
        self.reload_error = ""
        if policy.digest == self.policy.digest:
            _log.info("policy reload: %s has the same content", policy.source)
            return False
        self.policy, self.loaded_at_ms = policy, now_ms
        _log.warning(
            "policy reloaded from %s (sha256 %s, %d rules)",
            policy.source,
            policy.digest[:12],
            len(policy.rules),
        )
        return True

    async def screen(
        self,
        intents: Sequence[tuple[ToolIntent, Mapping[str, Any] | None]],
        now_ms: int,
        count: CountEffects,
    ) -> list[Verdict]:
        """The verdict on each TOOL intent (with its parsed arguments, if known), in order.

        Counters count the effects recorded before this batch, plus those the batch's earlier
        intents add (an intent counts unless it is denied).
        """
        policy = self.policy
        needed = policy.counted
        tallies: dict[tuple[str, bytes], int] = {}
        for name in sorted(needed):
            counter = policy.counters[name]
            groups = sorted({group_of(policy, counter, intent) for intent, _ in intents})
            counts = await count(counter, groups, now_ms - counter.window_ms)
            tallies.update(((name, group), counts.get(group, 0)) for group in groups)
        now = _timestamp(now_ms)
        verdicts = []
        for intent, arguments in intents:
            verdict = _decide(policy, intent, arguments, now, tallies)
            verdicts.append(verdict)
            if verdict.outcome is not Outcome.DENY:
                for name in needed:
                    counter = policy.counters[name]
                    if counter.tool == intent.tool_name:
                        tallies[name, group_of(policy, counter, intent)] += 1
        return verdicts


def _decide(
    policy: Policy,
    intent: ToolIntent,
    arguments: Mapping[str, Any] | None,
    now: datetime.datetime,
    tallies: Mapping[tuple[str, bytes], int],
) -> Verdict:
    if not policy.rules:
        return _DEFAULTS[policy.default]
    try:
        context = cel.Context(_facts(policy, intent, arguments, now, tallies))
    except Exception as exc:  # arguments CEL cannot hold: no rule can be evaluated
        return _failed(policy.rules[0], f"its variables: {type(exc).__name__}: {exc}")
    for rule in policy.rules:
        try:
            holds = rule.condition.execute(context)
        except Exception as exc:  # any failure of a rule denies
            return _failed(rule, f"{type(exc).__name__}: {exc}")
        if holds is True:
            return Verdict(rule.outcome, rule.name, rule.reason, rule.channel, rule.approvals)
        if holds is not False:
            return _failed(rule, f"it gave {type(holds).__name__}, not a bool")
    return _DEFAULTS[policy.default]


def _failed(rule: Rule, why: str) -> Verdict:
    return Verdict(
        Outcome.DENY, rule.name, f"the rule could not be evaluated ({why[:300]}); denied closed"
    )


def _facts(
    policy: Policy,
    intent: ToolIntent,
    arguments: Mapping[str, Any] | None,
    now: datetime.datetime,
    tallies: Mapping[tuple[str, bytes], int],
) -> dict[str, Any]:
    """The CEL variables of ``intent`` that the policy's rules use."""
    used = policy.variables
    facts: dict[str, Any] = {}
    if "tool" in used:
        facts["tool"] = intent.tool_name
    if "args" in used:
        if arguments is None:
            arguments = json.loads(intent.args_json) if intent.args_json else {}
        facts["args"] = arguments
    if "key" in used:
        facts["key"] = intent.entity_key.decode("utf-8", "replace")
    if "tenant" in used:
        tenant = policy.tenant_of(intent.entity_key)
        separator = policy.tenant_separator.encode()
        if separator and tenant.endswith(separator):
            tenant = tenant[: -len(separator)]
        facts["tenant"] = tenant.decode("utf-8", "replace")
    if "namespace" in used:
        facts["namespace"] = intent.intent_namespace
    if "seq" in used:
        facts["seq"] = intent.seq
    if "step" in used:
        facts["step"] = intent.step_index
    if "now" in used:
        facts["now"] = now
    if "created_at" in used:
        facts["created_at"] = _timestamp(intent.created_at_ms)
    if "compensates" in used:
        facts["compensates"] = intent.compensates_intent_id
    if "counters" in used:
        facts["counters"] = {
            name: tallies.get((name, group_of(policy, policy.counters[name], intent)), 0)
            for name in policy.counted
        }
    return facts


def _signature(path: str) -> tuple[int, int, int] | None:
    try:
        status = Path(path).stat()
    except OSError:
        return None
    return status.st_mtime_ns, status.st_size, status.st_ino
