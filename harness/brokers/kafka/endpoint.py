"""Where a private Kafka broker answers, and the harness's own clients for it (confluent-kafka, straight to
the broker: the learner's relay records only the learner's traffic)."""
from __future__ import annotations

from dataclasses import dataclass

# imported here, not in the methods: a first import raced for by two threads can leave its lock held in Python 3.11
# when a signal lands in it (retrylab.background.Beside says how), and learner runs call link() from several threads
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from retrylab.brokers.kafka.link import KafkaLink


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    # the most session.timeout.ms a learner's consumer gets (the redirect lowers it, with the heartbeat at a
    # third): Tansu completes a group join after about half of it, and a member SIGKILLed mid-group holds
    # its partitions up to about twice it (measured: joins 3.0 s / 2.0 s / 1.1 s and a rejoin after a
    # SIGKILL 11 s / 7 s / 1 s at 6000 / 3000 / 1000 ms; static membership rejoined after 6 s at each).
    # A check may ask for less with dataclasses.replace(endpoint, learner_session_timeout_ms=...).
    learner_session_timeout_ms: int = 6000
    # the most auto.commit.interval.ms a learner's consumer gets (None: its client's own, 5 s): a check of what a
    # kill loses lowers it, so that an offset auto-committed before its record was handled is committed by then
    learner_auto_commit_ms: int | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def link(self, sandbox, run_clock):
        """A learner run's way to this broker (retrylab.brokers.LearnerLink), to enter for the run."""
        return KafkaLink(self, sandbox, run_clock)

    def config(self, **extra) -> dict:
        """librdkafka settings for a harness client of this broker."""
        return {"bootstrap.servers": self.bootstrap, "broker.address.family": "v4", **extra}

    def admin(self):
        return AdminClient(self.config())

    def create_topics(self, partitions: dict[str, int], timeout: float = 10.0) -> None:
        """Create topics (name -> partition count) and wait until the broker has them."""
        admin = self.admin()    # kept until the answers come: a client destroyed fails its futures
        futures = admin.create_topics([NewTopic(name, count, 1) for name, count in partitions.items()],
                                             operation_timeout=timeout, request_timeout=timeout)
        for future in futures.values():
            future.result(timeout)

    def produce(self, topic: str, records, timeout: float = 10.0, partition: int | None = None) -> list[tuple[int, int]]:
        """Produce `records` ((key, value) or (key, value, headers)) one by one, in order, and return where
        each landed, (partition, offset), from the broker's delivery reports: what checks take partition
        ends from (Tansu's watermarks are wrong after a batched produce)."""
        producer = Producer(self.config(**{"linger.ms": 0, "enable.idempotence": False}))
        records = list(records)
        landed: list = [None] * len(records)

        def delivered(index, error, message):
            landed[index] = KafkaException(error) if error else (message.partition(), message.offset())

        for index, (key, value, *headers) in enumerate(records):
            options = {"partition": partition} if partition is not None else {}
            producer.produce(topic, key=key, value=value, headers=headers[0] if headers else None,
                             on_delivery=lambda error, message, i=index: delivered(i, error, message), **options)
        left = producer.flush(timeout)
        failed = [r for r in landed if not isinstance(r, tuple)]
        if left or failed:
            raise RuntimeError(f"the harness could not produce to {topic}: {failed[0] if failed else f'{left} not delivered'}")
        return landed
