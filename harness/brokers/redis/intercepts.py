"""What the relay may do to a command before the server sees it: an `Intercept` answers for the commands it
names, e.g. with a `refusal` (the admin guard) or the run's virtual `TIME` (`VirtualTime`)."""
from __future__ import annotations

from typing import Collection, Protocol


class Intercept(Protocol):
    """What a RecordingProxy asks about each command named in `names` (upper-case) before the server sees it.

    Called with the command's arguments (each truncated to the proxy's max_arg_bytes) on the connection's relay
    thread; returns None to forward the command as sent, or the arguments of the one command to send instead (e.g.
    `refusal(...)`). Must be quick and must not raise."""

    names: Collection[bytes]

    def __call__(self, args: tuple[bytes, ...]) -> tuple[bytes, ...] | None: ...


class chain:
    """Several intercepts as one (e.g. the admin guard and a virtual clock's TIME): each command goes to those that
    name it, in order; the first rewrite wins."""

    def __init__(self, *intercepts: Intercept):
        self._parts = [(frozenset(n.upper() for n in part.names), part) for part in intercepts]
        self.names = frozenset().union(*(names for names, _ in self._parts))

    def __call__(self, args: tuple[bytes, ...]) -> tuple[bytes, ...] | None:
        name = args[0].upper()
        for names, part in self._parts:
            if name in names:
                rewrite = part(args)
                if rewrite is not None:
                    return rewrite
        return None


def refusal(message: str) -> tuple[bytes, ...]:
    """A command the server answers with the error reply `message` (which the learner's client raises): Redis and
    fakeredis both run it in a pipeline, inside MULTI (the error comes back in EXEC's array) and in RESP2 and RESP3."""
    return (b"EVAL", b"return redis.error_reply(ARGV[1])", b"0", message.encode())


def time_answer(seconds: float) -> tuple[bytes, ...]:
    """A command the server answers exactly as TIME would at `seconds` since the epoch: [seconds, microseconds]."""
    micros = int(round(seconds * 1_000_000))
    return (b"EVAL", b"return {ARGV[1],ARGV[2]}", b"0", str(micros // 1_000_000).encode(),
            str(micros % 1_000_000).encode())


def encode(args: tuple[bytes, ...]) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


# An intercepted command is held back until complete. Those the intercepts want (admin commands, TIME) never need big


class VirtualTime:
    """An intercept: TIME is answered in the run's virtual time (retrylab.appchannel.RunClock), so a worker
    that takes first_seen_at from Redis sees the clock its sleeps move; every other command is `inner`'s to
    decide (the admin guard)."""

    def __init__(self, clock, inner: Intercept | None = None):
        self.clock = clock
        self.inner = inner
        self.names = frozenset({b"TIME"} | set(inner.names if inner is not None else ()))

    def __call__(self, args: tuple[bytes, ...]) -> tuple[bytes, ...] | None:
        if args[0].upper() == b"TIME":
            return time_answer(self.clock.now())
        return self.inner(args) if self.inner is not None else None
