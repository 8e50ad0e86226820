"""A learner run's way to its private Redis (retrylab.brokers.LearnerLink): the recording relay in front of
the server, the environment that points the learner-side redirect at it, and what the runner's `Progress`
reads while the run goes on (commands, the keyspace, the blocking reads the learner waits in)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from retrylab.brokers.redis import SHOWN_NAME, keyspace
from retrylab.brokers.redis.commands import Command, is_blocking_read, read_keys
from retrylab.brokers.redis.intercepts import VirtualTime
from retrylab.brokers.redis.proxy import RecordingProxy
from retrylab.brokers.redis.relay_guard import AdminGuard

# The learner-side redirect of redis-py: the learner site loads this file by its path (the sandbox shows a
# learner process the files its environment names, and nothing else of the harness outside learner_site).
REDIRECT = Path(__file__).resolve().with_name("redirect.py")


@dataclass(frozen=True)
class Waiting:
    """What the learner waits for, if that is all it does: `reads`, the blocking reads still without a
    reply; `state` changes whenever anything else crosses the relay (compared between two looks)."""
    reads: list[Command]
    state: tuple


class RedisLink:
    broker_name = SHOWN_NAME
    """Made for one learner run (Endpoint.link) and entered for its length: a relay that records every
    command and refuses admin ones (AdminGuard), answers TIME in the run's virtual time, and listens on a
    unix socket in the sandbox's folder when the sandbox has no network of its own to reach it by."""

    def __init__(self, endpoint, sandbox, run_clock):
        self.endpoint = endpoint
        self.sandbox = sandbox
        self.run_clock = run_clock
        self.env: dict[str, str] = {}
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> RedisLink:
        endpoint = self.endpoint
        with self._stack as stack:
            # TIME answers in the run's virtual time (a worker may take first_seen_at from Redis)
            guard = VirtualTime(self.run_clock, AdminGuard(endpoint.db, shared=endpoint.shared))
            self.proxy = stack.enter_context(RecordingProxy((endpoint.host, endpoint.port), intercept=guard))
            self.client = stack.enter_context(endpoint.client())
            host, port = self.proxy.address
            env = {"RETRYLAB_BROKER_REDIRECT": str(REDIRECT),
                   "RETRYLAB_REDIS_HOST": host, "RETRYLAB_REDIS_PORT": str(port),
                   "RETRYLAB_REDIS_DB": str(endpoint.db), "REDIS_URL": f"redis://{host}:{port}/{endpoint.db}"}
            if self.sandbox.isolated:  # no network in its namespace: the relay's unix socket is the only way out
                socket_path = self.sandbox.socket_path("redis.sock")
                self.proxy.serve_unix(socket_path)
                env.update(RETRYLAB_REDIS_SOCKET=str(socket_path), REDIS_URL=f"unix://{socket_path}?db={endpoint.db}")
            # a server the user named (url backend) may need them; the relay passes bytes as they are
            env.update({f"RETRYLAB_REDIS_{k.upper()}": v for k, v in
                        (("username", endpoint.username), ("password", endpoint.password)) if v})
            self.env = env
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def commands(self) -> list[Command]:
        return self.proxy.commands()

    def received(self) -> list:
        """The relay keeps no record of replies: what a check needs of them is in the keyspace."""
        return []

    def started(self) -> bool:
        """Whether the learner has sent its first command."""
        return self.proxy.activity > 0

    def shape(self) -> tuple:
        return keyspace.shape(self.client)

    def snapshot(self) -> dict[bytes, keyspace.KeyContent]:
        return keyspace.dump(self.client)

    def waiting(self) -> Waiting | None:
        """The blocking reads the learner waits in, if every command still without a reply is one and the
        relay follows every connection's replies (one in RESP2 pub/sub mode, say, may wait unseen); else None."""
        pending = self.proxy.pending()
        if not pending or not all(is_blocking_read(c) for c in pending) or not self.proxy.replies_followed():
            return None
        return Waiting(pending, (tuple(c.seq for c in pending), self.proxy.activity))

    def could_wake(self, reads: list[Command]) -> bool:
        """Whether those reads have something to take, or were answered and the reply is on its way
        through the relay: then the learner is not stuck (asked last: it costs a round trip)."""
        keys = [k for c in reads for k in (read_keys(c) or ())]
        return bool(keys and self.client.exists(*keys)) or self.proxy.replies_in_flight()
