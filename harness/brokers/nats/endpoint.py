"""Where a private nats-server answers: its client port and its monitoring port (HTTP, for /jsz)."""
from __future__ import annotations

import socket
from dataclasses import dataclass

# imported here, not in the methods: a first import raced for by two threads can leave its lock held in Python 3.11
# when a signal lands in it (retrylab.background.Beside says how), and learner runs call link() from several threads
from retrylab.brokers.nats.admin import AdminClient, Monitor
from retrylab.brokers.nats.link import NatsLink


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    monitor_port: int

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def link(self, sandbox, run_clock):
        """A learner run's way to this server (retrylab.brokers.LearnerLink), to enter for the run."""
        return NatsLink(self, sandbox, run_clock)

    def admin(self, timeout: float = 5.0):
        """The harness's own client of this server (JetStream API requests), to close after use."""
        return AdminClient(self.host, self.port, timeout=timeout)

    def monitor(self):
        return Monitor(self.host, self.monitor_port)
