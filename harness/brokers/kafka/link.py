"""A learner run's way to its private Kafka broker (retrylab.brokers.LearnerLink): the recording relay in
front of the broker, the environment that points the learner-side redirect at it, and what the runner's
`Progress` reads while the run goes on.

Without a network namespace the learner's clients reach the relay's TCP port on 127.0.0.1. In a sandbox
with one (no network at all there) the relay listens on a unix socket in the sandbox's folder, and the
redirect, inside the learner's process, listens on 127.0.0.1:9092 of the learner's own namespace and
forwards each connection to that socket (librdkafka, under confluent-kafka, speaks TCP only). Either way
the relay advertises the address the learner came in by, so the connections a client opens to the broker
it learns from metadata come back the same way."""
from __future__ import annotations

import contextlib
from pathlib import Path

from retrylab.brokers.kafka import SHOWN_NAME
from retrylab.brokers.kafka.relay import KafkaRelay, Request
from retrylab.brokers.kafka.state import KafkaState, read_state

# The learner-side redirect: the learner site loads this file by its path (the sandbox shows a learner
# process the files its environment names, and nothing else of the harness outside learner_site).
REDIRECT = Path(__file__).resolve().with_name("redirect.py")
ISOLATED_ADDRESS = ("127.0.0.1", 9092)   # in the learner's own network namespace: where Kafka is expected


class KafkaLink:
    broker_name = SHOWN_NAME

    def __init__(self, endpoint, sandbox, run_clock):
        self.endpoint = endpoint
        self.sandbox = sandbox
        self.run_clock = run_clock
        self.env: dict[str, str] = {}
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> KafkaLink:
        with self._stack as stack:
            self.relay = stack.enter_context(KafkaRelay((self.endpoint.host, self.endpoint.port)))
            env = {"RETRYLAB_BROKER_REDIRECT": str(REDIRECT),
                   "RETRYLAB_KAFKA_SESSION_TIMEOUT_MS": str(self.endpoint.learner_session_timeout_ms)}
            if self.endpoint.learner_auto_commit_ms:
                env["RETRYLAB_KAFKA_AUTO_COMMIT_MS"] = str(self.endpoint.learner_auto_commit_ms)
            if self.sandbox.isolated:
                socket_path = self.sandbox.socket_path("kafka.sock")
                self.relay.serve_unix(socket_path)
                self.relay.advertise = ISOLATED_ADDRESS
                env["RETRYLAB_KAFKA_SOCKET"] = str(socket_path)
            host, port = self.relay.advertise
            env.update(RETRYLAB_KAFKA_BOOTSTRAP=f"{host}:{port}", KAFKA_BOOTSTRAP_SERVERS=f"{host}:{port}")
            self.env = env
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def commands(self) -> list[Request]:
        return self.relay.requests()

    def received(self) -> list:
        """The relay keeps the requests (produced batches with the offsets the broker gave them, commits),
        not the responses: what a check needs of what was fetched is in `snapshot()`."""
        return []

    def started(self) -> bool:
        """Whether the learner has sent its first request."""
        return self.relay.activity > 0

    def shape(self) -> tuple:
        """What the learner changed so far, from the relay's record (cheap: no round trip to the broker)."""
        return (tuple(sorted(self.relay.produced().items())), tuple(sorted(self.relay.committed().items())),
                self.relay.changes())

    def snapshot(self) -> KafkaState:
        return read_state(self.endpoint)

    def produced(self) -> dict[tuple[str, int], int]:
        return self.relay.produced()

    def waiting(self) -> None:
        """Kafka consumers poll (Fetch requests with a wait time, and heartbeats): no read blocks on the
        relay the way a Redis BLPOP does, so there is never "only a blocking read" to report."""
        return None

    def could_wake(self, reads: list) -> bool:
        return False
