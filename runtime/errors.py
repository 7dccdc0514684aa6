"""One exception tree for riqr.

Every error carries the HTTP status it maps to (``status``) and a stable machine-readable ``code``. The
errors cross Ray (an actor raises, a facade or client re-raises), so they pickle by value: ``__reduce__``
rebuilds them from their message and details, whatever the subclass's constructor looks like. The one
HTTP middleware (``runtime.http_app``) renders them; nothing else maps errors to statuses.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "RiqrError",
    "CannotListen",
    "DeploymentConflict",
    "BadRequest",
    "MalformedKey",
    "MalformedRange",
    "MalformedCursor",
    "MalformedPath",
    "KeyTooLong",
    "TooManyParameters",
    "PayloadTooLarge",
    "UriTooLong",
    "HeadersTooLarge",
    "InvalidParameter",
    "ResultTooLarge",
    "NotFound",
    "StoreNotFound",
    "KeyNotFound",
    "Conflict",
    "StoreConflict",
    "StoreInUse",
    "Unavailable",
    "PartitionUnavailable",
    "OwnerUnavailable",
    "PartitionIncomplete",
    "PartitionCatchingUp",
    "CopyBehind",
    "CopyMoved",
    "DeadlineExceeded",
    "SchemaError",
    "NotConnected",
    "InternalError",
    "Unauthorized",
    "Forbidden",
]


def _rebuild(cls: type[RiqrError], message: str, details: dict[str, Any]) -> RiqrError:
    err = cls.__new__(cls)
    RiqrError.__init__(err, message, **details)
    return err


class RiqrError(Exception):
    """Base of every riqr error. ``status`` is the HTTP status; ``code`` names the error for machines."""

    status: int = 500
    code: str = "internal"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.details))

    def to_json(self) -> dict[str, Any]:
        """The JSON body of an error response: ``{"error": {"code", "message", ...details}}``."""
        return {"error": {"code": self.code, "message": self.message, **self.details}}

    def headers(self) -> dict[str, str]:
        """Extra HTTP headers this error asks for (Retry-After for unavailability)."""
        return {}

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and isinstance(other, RiqrError)
            and (other.message, other.details) == (self.message, self.details)
        )

    def __hash__(self) -> int:
        return hash((type(self), self.message))


class BadRequest(RiqrError):
    """The caller sent something riqr cannot interpret."""

    status = 400
    code = "bad-request"


class MalformedKey(BadRequest):
    """A key that does not parse by the store's key schema."""

    code = "malformed-key"


class MalformedRange(BadRequest):
    """A range bound that does not parse, or an unusable range."""

    code = "malformed-range"


class MalformedCursor(BadRequest):
    """A paging cursor that this server did not issue for this query."""

    code = "malformed-cursor"


class CursorOfAnotherStore(MalformedCursor):
    """A cursor issued by an earlier store of the same name (dropped, and declared again since): its issuer
    is not in the store's lineage (``runtime.cursor``). A facade whose view may be older than the actor
    that issued it looks at the registry's view again before it says so."""


class MalformedPath(BadRequest):
    """A path segment that is not valid percent-encoded UTF-8 (a store name such as ``%FF``)."""

    code = "malformed-path"


class KeyTooLong(MalformedKey):
    """A key (or key bound, or prefix) longer than ``runtime.config.MAX_KEY_CHARS`` as written in the URL."""

    code = "key-too-long"


class TooManyParameters(BadRequest):
    """More query parameters than ``runtime.config.MAX_QUERY_PARAMS``."""

    code = "too-many-parameters"


class PayloadTooLarge(RiqrError):
    """A request body: no route of the REST API takes one, so anything above a token size is refused."""

    status = 413
    code = "payload-too-large"


class UriTooLong(RiqrError):
    """A request line longer than ``runtime.config.MAX_URL_CHARS``."""

    status = 414
    code = "uri-too-long"


class HeadersTooLarge(RiqrError):
    """A header field over ``MAX_HEADER_FIELD_BYTES``, or more than ``MAX_HEADERS`` headers."""

    status = 431
    code = "headers-too-large"


class InvalidParameter(BadRequest):
    """A query parameter with a value riqr cannot use (a limit too large, ``reverse=maybe``...)."""

    code = "invalid-parameter"


class ResultTooLarge(BadRequest):
    """A whole answer (no page, no stream) that would be too large to build in memory."""

    code = "result-too-large"


class NotFound(RiqrError):
    status = 404
    code = "not-found"


class StoreNotFound(NotFound):
    code = "store-not-found"


class KeyNotFound(NotFound):
    """The key is absent. ``position``, when the facade sets it, says as of what (``X-Riqr-Position``)."""

    code = "key-not-found"
    position: str | None = None

    def headers(self) -> dict[str, str]:
        return {} if self.position is None else {"X-Riqr-Position": self.position}  # monotonic.POSITION_HEADER


class Conflict(RiqrError):
    status = 409
    code = "conflict"


class StoreConflict(Conflict):
    """A store is declared again with a definition that differs from the registered one."""

    code = "store-conflict"


class StoreInUse(Conflict):
    """A store cannot be dropped while a running topology feeds it (unless forced), nor fed by a topology
    while another one feeds it (one store, one feed: ``runtime.feeds.FeedBook.refusal``)."""

    code = "store-in-use"


class DeploymentConflict(Conflict):
    """``riqr up`` asked to start verticles on new nodes with other settings (auth, binding) than the running
    ones keep: the nodes of one deployment would differ."""

    code = "deployment-conflict"


class SchemaError(BadRequest):
    """A DataFrame cannot be materialized: unsupported column type, missing column, and so on."""

    code = "schema-error"


class Unavailable(RiqrError):
    """Nobody can answer right now; the caller may retry after ``retry_after`` seconds."""

    status = 503
    code = "unavailable"

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(int(self.details.get("retry_after", 1)))}


class CannotListen(Unavailable):
    """An HTTP verticle could not bind its address (in use, not this host's, not allowed)."""

    code = "cannot-listen"


class PartitionUnavailable(Unavailable):
    """A partition has no live owner that holds its state."""

    code = "partition-unavailable"


class PartitionIncomplete(PartitionUnavailable):
    """A partition cannot prove its state complete (it missed a batch, or has not received its source's
    first one): it answers 503 rather than from partial state."""

    code = "partition-incomplete"


class PartitionCatchingUp(PartitionIncomplete):
    """A copy that lost its state is being rebuilt from a peer and has not caught up yet: it answers 503
    until it is in sync, never as if it were current."""

    code = "partition-catching-up"


class CopyBehind(PartitionUnavailable):
    """Every copy of a partition that answered is older than what this facade already served from it
    (``runtime.monotonic``); an older answer would make the store go back in time, so none is given. Also
    a peer's refusal to export a copy older than the catching-up copy's own (``QueryCore.open_snapshot``)."""

    code = "copy-behind"


class OwnerUnavailable(Unavailable):
    """The actor owning a partition is restarting or dead."""

    code = "owner-unavailable"


class CopyMoved(Unavailable):
    """A query actor whose copies are moving to another actor (``riqr rebalance``) takes no batch while
    the move switches over: the sink asks the registry again and delivers to the copies it names then."""

    code = "copy-moved"


class DeadlineExceeded(RiqrError):
    """The answer did not arrive within the request's deadline."""

    status = 504
    code = "deadline-exceeded"


class NotConnected(RiqrError):
    """The riqr runtime (registry, facades) is not deployed in the Ray namespace asked for."""

    status = 503
    code = "not-connected"

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "5"}


class InternalError(RiqrError):
    """Something failed that no client input should cause: a bug. The actor that hit it logged it."""

    status = 500
    code = "internal"


class Unauthorized(RiqrError):
    """The request carries no usable credentials: no bearer token, or one that does not verify.

    The message says only what a client needs to fix its request ("missing bearer token", "invalid
    token", "token expired"), never which check failed nor the token itself.
    """

    status = 401
    code = "unauthorized"

    def headers(self) -> dict[str, str]:
        # RFC 7235 requires a challenge on every 401; RFC 6750 names the scheme. A request with no token,
        # or with two Authorization headers, gets the bare challenge.
        return {"WWW-Authenticate": 'Bearer realm="riqr"'}


class TokenRefused(Unauthorized):
    """A bearer token was sent and is not taken (invalid, expired, not yet valid): the challenge says
    ``error="invalid_token"`` (RFC 6750, 3.1), so a client knows to get a new one. Same code and status."""

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": 'Bearer realm="riqr", error="invalid_token"'}


class Forbidden(RiqrError):
    """The caller is known but may not read what it asked for (a store outside its token or its ACL)."""

    status = 403
    code = "forbidden"
