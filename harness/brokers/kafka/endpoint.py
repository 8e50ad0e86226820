"""Where a private Kafka broker answers, and the harness's own clients for it (confluent-kafka, straight to
the broker: the learner's relay records only the learner's traffic)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def link(self, sandbox, run_clock):
        """A learner run's way to this broker (retrylab.brokers.LearnerLink), to enter for the run."""
        from retrylab.brokers.kafka.link import KafkaLink
        return KafkaLink(self, sandbox, run_clock)

    def config(self, **extra) -> dict:
        """librdkafka settings for a harness client of this broker."""
        return {"bootstrap.servers": self.bootstrap, "broker.address.family": "v4", **extra}

    def admin(self):
        from confluent_kafka.admin import AdminClient
        return AdminClient(self.config())

    def create_topics(self, partitions: dict[str, int], timeout: float = 10.0) -> None:
        """Create topics (name -> partition count) and wait until the broker has them."""
        from confluent_kafka.admin import NewTopic
        admin = self.admin()    # kept until the answers come: a client destroyed fails its futures
        futures = admin.create_topics([NewTopic(name, count, 1) for name, count in partitions.items()],
                                             operation_timeout=timeout, request_timeout=timeout)
        for future in futures.values():
            future.result(timeout)

    def producer(self, **extra):
        from confluent_kafka import Producer
        return Producer(self.config(**extra))
