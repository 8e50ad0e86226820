"""A command the relay recorded, and what it says about a learner waiting: Redis' blocking reads."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Command:
    seq: int  # global order of arrival across all connections
    conn: int  # connection number, 1, 2, ...
    at: float  # time.time() when the command was fully received
    args: tuple[bytes, ...]  # the command's arguments; each arg truncated to max_arg_bytes
    truncated: bool  # True if any arg was truncated
    # time.time() when the relay read the server's reply, before passing it on; None while none has come, or where
    # the relay does not follow that connection's replies. Not part of a command's identity: a record seen before its
    # reply and after it is the same command.
    answered_at: float | None = field(default=None, compare=False)

    @property
    def name(self) -> str:
        return self.args[0].decode("latin-1").upper() if self.args else ""

    @property
    def read_timeout(self) -> float | None:
        """Seconds this blocking read waits at most (0.0: forever); None if it is not one."""
        return read_timeout(self)

    def same_read(self, other: Command) -> bool:
        """Whether `other` is the same blocking read, its timeout aside (the same command on the same keys)."""
        return self.name == other.name and self.args[:-1] == other.args[:-1]


# Blocking reads and where their timeout is (seconds; XREAD's BLOCK is in milliseconds).
BLOCKING_READS = {"BLPOP": -1, "BRPOP": -1, "BZPOPMIN": -1, "BZPOPMAX": -1, "BRPOPLPUSH": 3, "BLMOVE": 5,
                  "BLMPOP": 1, "BZMPOP": 1, "XREAD": None, "XREADGROUP": None}


def read_timeout(command: Command) -> float | None:
    """Seconds a blocking read waits at most (0.0: forever); None if `command` is not one."""
    name, args = command.name, command.args
    if name not in BLOCKING_READS:
        return None
    try:
        where = BLOCKING_READS[name]
        if where is not None:
            return float(args[where])
        upper = [a.upper() for a in args]
        if b"BLOCK" not in upper:
            return None  # XREAD without BLOCK answers at once
        return float(args[upper.index(b"BLOCK") + 1]) / 1000.0
    except (IndexError, ValueError):
        return None


def read_keys(command: Command) -> list[bytes] | None:
    """The keys a list or sorted-set blocking read waits on (None: another kind, e.g. XREAD, whose
    stream exists even when nothing new is in it)."""
    name, args = command.name, command.args
    try:
        if name in ("BLPOP", "BRPOP", "BZPOPMIN", "BZPOPMAX"):
            return list(args[1:-1])
        if name in ("BRPOPLPUSH", "BLMOVE"):
            return [args[1]]
        if name in ("BLMPOP", "BZMPOP"):
            return list(args[3:3 + int(args[2])])
    except (IndexError, ValueError):
        pass
    return None


def is_blocking_read(command: Command) -> bool:
    return read_timeout(command) is not None
