"""Errors the service reports to callers; the servicer maps each to its gRPC status code.

Kept free of grpc so the drafting helpers can be tested without a network.
"""

from __future__ import annotations


class ServiceError(Exception):
    """A call was refused; the message names the bad value (and request id) and no
    state was changed."""


class InvalidArgument(ServiceError):
    """Malformed input: bad ids, empty, duplicate or oversize values."""


class FailedPrecondition(ServiceError):
    """Valid input that does not fit the service (tokenizer mismatch, read-only datastore)."""


class NotFound(ServiceError):
    """An unknown datastore name."""


class ResourceExhausted(ServiceError):
    """Overload (too many calls in flight) or a full datastore."""


class DeadlineExceeded(ServiceError):
    """The call's deadline passed, or would pass before its work could be done: not
    started."""


class Unavailable(ServiceError):
    """The service is not serving yet (loading) or any more (shutting down)."""
