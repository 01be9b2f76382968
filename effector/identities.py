"""Who holds a token: named tokens, their approvers' names and the channels they may decide.

A token file holds either one bare token on its one line (unnamed: a decision records the
approver the client names, as before named tokens existed; a colon in it is part of the token)
or two or more ``name:token`` lines, one per approver, optionally
``name:token:channel1,channel2`` to limit the approvals that approver may decide to those
channels (``-`` names the empty channel). Blank lines and lines starting with ``#`` are
skipped. A decision made with a named token records the token's name as its approver, whatever
the client says. :class:`Tokens` checks a presented token against all of them in constant time.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from effector.errors import ConfigurationError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")
"""An approver's name: what a decision records, so printable and without separators."""
EMPTY_CHANNEL = "-"
"""How a channel list names the empty channel (approvals requested without one)."""


@dataclass(frozen=True, slots=True)
class Approver:
    """One token and who holds it: ``name`` ("" for a bare token) and its channel limit."""

    name: str
    token: str = field(repr=False)
    channels: frozenset[str] | None = None
    """The channels whose approvals this token may decide; ``None``: every channel."""

    def may_decide(self, channel: str) -> bool:
        """Whether this token may decide an approval requested on ``channel``."""
        return self.channels is None or channel in self.channels

    def refusal(self, channel: str) -> str | None:
        """Why this token may not decide on ``channel``, or ``None`` if it may."""
        if self.may_decide(channel):
            return None
        allowed = ", ".join(sorted(repr(name) for name in self.channels or ()))
        return (
            f"approver {self.name!r} may not decide approvals on channel {channel!r} "
            f"(its token is limited to {allowed})"
        )


@dataclass(frozen=True, slots=True)
class Tokens:
    """Every token the effector accepts; the first is the primary (the console keys off it)."""

    approvers: tuple[Approver, ...]

    def __post_init__(self) -> None:
        if not self.approvers:
            raise ConfigurationError("no token given")

    @classmethod
    def single(cls, token: str) -> Tokens:
        """A bare, unnamed token (``--token``, or a token file of one bare token)."""
        return cls((Approver("", token),))

    @property
    def primary(self) -> str:
        """The first token: the secret the console's session keys are derived from."""
        return self.approvers[0].token

    @property
    def named(self) -> bool:
        """Whether the tokens carry names (a token file of ``name:token`` lines)."""
        return bool(self.approvers[0].name)

    def identify(self, presented: str | bytes) -> Approver | None:
        """The holder of ``presented``, or ``None``; compares with every token, in constant time."""
        given = presented.encode() if isinstance(presented, str) else presented
        found = None
        for approver in self.approvers:
            if hmac.compare_digest(given, approver.token.encode()):
                found = approver
        return found

    def identify_bearer(self, header: str | bytes | None) -> Approver | None:
        """The holder of the token in an ``authorization: Bearer <token>`` value, or ``None``."""
        if header is None:
            return None
        value = header.encode() if isinstance(header, str) else header
        if not value.startswith(b"Bearer "):
            return None
        return self.identify(value[len(b"Bearer ") :])


def parse_tokens(text: str, source: str) -> Tokens:
    """The tokens in a token file's ``text`` (see the module docstring); ``source`` names it."""
    lines = [
        (number, line.strip())
        for number, line in enumerate(text.splitlines(), 1)
        if line.strip() and not line.strip().startswith("#")
    ]
    if not lines:
        raise ConfigurationError(f"token file {source!r} is empty")
    if len(lines) == 1:  # one line is one bare token, colons and all, as it always was
        return Tokens.single(lines[0][1])
    approvers = tuple(_named(source, number, line) for number, line in lines)
    _check_distinct(approvers, source)
    return Tokens(approvers)


def _named(source: str, number: int, line: str) -> Approver:
    where = f"token file {source!r} line {number}"
    parts = line.split(":")
    if len(parts) not in (2, 3):
        raise ConfigurationError(
            f"{where}: expected 'name:token' or 'name:token:channel,...' (a file of several "
            "tokens names each one)"
        )
    name, token = parts[0].strip(), parts[1].strip()
    if not _NAME.fullmatch(name):
        raise ConfigurationError(
            f"{where}: {name!r} is not an approver name (letters, digits and . _ @ + -)"
        )
    if not token:
        raise ConfigurationError(f"{where}: the token of {name!r} is empty")
    channels = None
    if len(parts) == 3:
        listed = [channel.strip() for channel in parts[2].split(",") if channel.strip()]
        if not listed:
            raise ConfigurationError(f"{where}: the channel list of {name!r} is empty")
        channels = frozenset("" if channel == EMPTY_CHANNEL else channel for channel in listed)
    return Approver(name, token, channels)


def _check_distinct(approvers: Sequence[Approver], source: str) -> None:
    """Refuse two lines with one name or one token."""
    names = [approver.name for approver in approvers]
    tokens = [approver.token for approver in approvers]
    if len(set(names)) != len(names) or len(set(tokens)) != len(tokens):
        raise ConfigurationError(f"token file {source!r} names an approver or a token twice")
