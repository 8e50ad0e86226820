"""A learner run's way to its private nats-server (retrylab.brokers.LearnerLink): the recording relay in
front of the server, the environment that points the learner-side redirect at it, and what the runner's
`Progress` reads while the run goes on."""
from __future__ import annotations

import contextlib
from pathlib import Path

from retrylab.brokers.nats import SHOWN_NAME
from retrylab.brokers.nats import state
from retrylab.brokers.nats.admin import NatsError
from retrylab.brokers.nats.relay import Frame, RecordingRelay

# The learner-side redirect of nats-py: the learner site loads this file by its path (the sandbox shows a
# learner process the files its environment names, and nothing else of the harness outside learner_site).
REDIRECT = Path(__file__).resolve().with_name("redirect.py")


class NatsLink:
    """Made for one learner run (Endpoint.link) and entered for its length: a relay that records what the
    learner publishes and is delivered, listening on a unix socket in the sandbox's folder when the sandbox
    has no network of its own to reach it by."""

    broker_name = SHOWN_NAME

    def __init__(self, endpoint, sandbox, run_clock):
        self.endpoint = endpoint
        self.sandbox = sandbox
        self.run_clock = run_clock      # NATS has no server time a learner reads: nothing to answer with it
        self.env: dict[str, str] = {}
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> NatsLink:
        with self._stack as stack:
            self.relay = stack.enter_context(RecordingRelay((self.endpoint.host, self.endpoint.port)))
            self.monitor = self.endpoint.monitor()
            host, port = self.relay.address
            url = f"nats://{host}:{port}"
            env = {"RETRYLAB_BROKER_REDIRECT": str(REDIRECT), "RETRYLAB_NATS_URL": url, "NATS_URL": url}
            if self.sandbox.isolated:   # no network in its namespace: the relay's unix socket is the only way out
                socket_path = self.sandbox.socket_path("nats.sock")
                self.relay.serve_unix(socket_path)
                env["RETRYLAB_NATS_SOCKET"] = str(socket_path)
            self.env = env
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def started(self) -> bool:
        """Whether the learner has sent its first op (a client's CONNECT)."""
        return self.relay.learner_ops > 0

    def commands(self) -> list[Frame]:
        """What the learner sent, in order (relay.Frame: PUB, HPUB, SUB, UNSUB, CONNECT), all of it from
        connections it has closed (its processes ended, say)."""
        self.relay.drain_closed()
        return self.relay.commands()

    def deliveries(self) -> list[Frame]:
        """What the server sent the learner (MSG, HMSG, -ERR), in order."""
        self.relay.drain_closed()
        return self.relay.deliveries()

    received = deliveries     # LearnerLink: what the server sent the learner

    def shape(self) -> tuple:
        try:
            return state.shape(self.monitor)
        except NatsError as exc:   # a monitoring request that timed out on a busy machine must not end the run
            return ("unreadable", str(exc))

    def snapshot(self) -> dict[str, state.StreamContent]:
        with self.endpoint.admin() as admin:
            return state.dump(admin)

    def waiting(self) -> None:
        """NATS has no blocking read the relay could see a learner wait in (a pull request is a PUB whose
        answer may never come, a subscription waits unseen): stop conditions judge by progress and CPU."""
        return None

    def could_wake(self, reads: list) -> bool:
        return False
