"""Reading what the command line is given by path: token files and TLS files.

:func:`load_tokens` turns ``--token`` or ``--token-file`` into :class:`~effector.identities.Tokens`
(a bare token, or named ``name:token[:channels]`` lines); a client uses the first of them.
"""

from __future__ import annotations

from pathlib import Path

from effector.errors import ConfigurationError
from effector.identities import Tokens, parse_tokens


def read_file(path: str, what: str) -> bytes:
    """The bytes of ``path``; a ``ConfigurationError`` naming ``what`` if it cannot be read."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"cannot read {what} {path!r}: {exc.strerror}") from None


def load_tokens(token: str | None, token_file: str | None) -> Tokens | None:
    """The tokens given by ``--token`` or ``--token-file`` (not both); ``None`` without either."""
    if token and token_file:
        raise ConfigurationError("give the token once: --token or --token-file, not both")
    if token_file:
        text = read_file(token_file, "token file").decode("utf-8", "replace")
        return parse_tokens(text, token_file)
    if token is None:
        return None
    if not token.strip():
        raise ConfigurationError("the token is empty")
    return Tokens.single(token.strip())
