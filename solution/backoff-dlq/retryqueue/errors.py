"""Which failures are worth retrying.

A retry helps only when the cause can go away by itself: a timeout, an overloaded or
rate-limiting service. A message that breaks the schema, or names something that does not
exist, fails the same way every time: retrying it only delays the moment a human sees it, so
it goes to the DLQ after its first attempt.
"""
RETRYABLE = "retryable"
PERMANENT = "permanent"

# HTTP statuses that say "try again later": request timeout, too early, too many requests, and
# the server-side errors of an overloaded or restarting service.
RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})

# By type: schema violations are ValueErrors (json's decode error is one too), missing
# references LookupErrors (KeyError, IndexError). A permanent error must be *known* to be
# permanent; anything unrecognised is retried, because wrongly retrying costs a few seconds and
# wrongly giving up costs a message.
PERMANENT_TYPES = (ValueError, LookupError)
TRANSIENT_TYPES = (TimeoutError, ConnectionError)


def status_of(exc):
    """The HTTP status an exception carries (`.status` or `.status_code`), or None."""
    for name in ("status", "status_code"):
        value = getattr(exc, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    response = getattr(exc, "response", None)  # requests/httpx errors keep it on the response
    value = getattr(response, "status_code", None)
    return value if isinstance(value, int) else None


def classify(exc):
    """RETRYABLE or PERMANENT for an exception raised by process()."""
    status = status_of(exc)
    if status is not None:
        # The status is the server's own word on it; it beats the exception's type.
        if status in RETRYABLE_STATUS or status >= 500:
            return RETRYABLE
        if 400 <= status < 500:
            return PERMANENT  # the request itself is wrong: 400, 404, 422 ...
    if isinstance(exc, TRANSIENT_TYPES):
        return RETRYABLE
    if isinstance(exc, PERMANENT_TYPES):
        return PERMANENT
    return RETRYABLE


def describe(exc):
    """`Type: text`: the class tells a timeout from a bug, the text says which task and why."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
