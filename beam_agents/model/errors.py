"""The errors of a model provider call, and whether the runtime retries them.

Also importable from :mod:`beam_agents.model.client`.
"""

from __future__ import annotations


class ProviderError(Exception):
    """Base class for every failure of a model provider call."""

    retryable: bool = False


class RateLimitError(ProviderError):
    """The provider refused the call for rate limiting (HTTP 429); retried."""

    retryable = True

    def __init__(self, message: str = "rate limited", *, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ServerError(ProviderError):
    """The provider failed on its side (HTTP 5xx); retried."""

    retryable = True

    def __init__(self, message: str = "server error", *, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code


class ProviderTimeout(ProviderError):
    """The call timed out or the connection broke off; retried."""

    retryable = True


class ProviderUnavailable(ProviderTimeout):
    """The provider could not be reached (connection refused, DNS failure, no route); retried.

    A :class:`ProviderTimeout`, so the retry policy and code that catches timeouts treat it as
    before; its message names the URL and the operating system's error.
    """

    retryable = True


class ProviderRequestError(ProviderError):
    """The provider rejected the request itself (other HTTP 4xx, undecodable body); not retried."""

    retryable = False

    def __init__(self, message: str = "bad request", *, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code
