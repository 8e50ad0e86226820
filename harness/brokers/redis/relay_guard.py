"""What the recording relay refuses to pass from learner code to Redis: commands that administer the server.

A learner's script may use its own database freely, but nothing that changes the server itself (its configuration,
users, persistence, replication, modules), watches or disconnects other clients, or reaches another database: those
would let a script change what the harness sees, outlive the check, or touch data that is not the grading's. The
relay answers each such command with an error reply (`proxy.refusal`) that the learner's client raises, in order with
the rest (see RecordingProxy's intercept).

Inside a script (EVAL, FCALL) Redis 7 itself refuses the administrative commands ("This Redis command is not allowed
from script"; the fake backend's Lua sandbox does the same), but allows SELECT, SWAPDB, MOVE and FLUSHALL. On a
private server (fake, redis-server, container) they can only reach the grading's own data, which is emptied before
every check. On a server the user names (url backend) FLUSHALL is refused, but scripts stay allowed (the reference
solution itself uses them for atomic moves), so a script there can still reach the other databases: the url backend
is for servers whose other data one could afford to lose (README).
"""
from __future__ import annotations

from retrylab import i18n
from retrylab.brokers.redis import catalog
from retrylab.brokers.redis.intercepts import refusal
from retrylab.brokers.redis.resp import string2ll

# Refused whatever their arguments: the server's configuration, users, persistence, replication, modules, other
# clients' traffic, other servers.
ADMIN = frozenset({b"CONFIG", b"ACL", b"DEBUG", b"SHUTDOWN", b"MODULE", b"REPLICAOF", b"SLAVEOF", b"MONITOR",
                   b"SYNC", b"PSYNC", b"FAILOVER", b"SAVE", b"BGSAVE", b"BGREWRITEAOF", b"CLUSTER", b"MIGRATE"})
CLIENT_ADMIN = frozenset({b"KILL", b"PAUSE", b"UNPAUSE", b"NO-EVICT"})
DATABASES = frozenset({b"SELECT", b"SWAPDB", b"MOVE", b"COPY", b"FLUSHALL", b"RESET"})


class AdminGuard:
    """An intercept for RecordingProxy: refuses admin commands and any way out of database `db`.

    `shared` says the server also serves others (url backend): then FLUSHALL is refused too. Messages
    are in the language current when the guard is made (the relay's threads have no language of their own)."""

    def __init__(self, db: int = 0, *, shared: bool = False, lang: str | None = None):
        self.db = db
        self.shared = shared
        self.lang = lang or i18n.current()
        self.names = ADMIN | DATABASES | {b"CLIENT"}

    def __call__(self, args: tuple[bytes, ...]) -> tuple[bytes, ...] | None:
        name = args[0].upper()
        shown = name.decode("latin-1")
        if name in ADMIN:
            return self._refuse("relay_guard.admin", command=shown)
        if name == b"CLIENT":
            sub = args[1].upper() if len(args) > 1 else b""
            if sub in CLIENT_ADMIN:
                return self._refuse("relay_guard.admin", command=f"CLIENT {sub.decode('latin-1')}")
            return None
        if name == b"FLUSHALL":
            return self._refuse("relay_guard.flushall_shared") if self.shared else None
        if name == b"RESET":   # it selects database 0 again
            return None if self.db == 0 else self._refuse("relay_guard.other_db", db=self.db)
        return None if self._own_database_only(name, args[1:]) else self._refuse("relay_guard.other_db", db=self.db)

    def _own_database_only(self, name: bytes, rest: tuple[bytes, ...]) -> bool:
        if name == b"SELECT":
            return len(rest) == 1 and string2ll(rest[0]) == self.db
        if name == b"SWAPDB":
            return len(rest) == 2 and string2ll(rest[0]) == string2ll(rest[1]) == self.db
        if name == b"MOVE":
            return len(rest) == 2 and string2ll(rest[1]) == self.db
        if name == b"COPY":   # COPY source destination [DB index] [REPLACE]
            options = [a.upper() for a in rest[2:]]
            if b"DB" not in options:
                return True
            at = options.index(b"DB") + 1
            return at < len(options) and string2ll(rest[2 + at]) == self.db
        return True

    def _refuse(self, key: str, **params) -> tuple[bytes, ...]:
        text = catalog.text(key, self.lang, **params)
        return refusal(" ".join(text.split()))   # one line: it travels as a RESP error
