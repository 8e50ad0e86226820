"""The broker's state as the harness reads it: its topics, every record in them (read from the start to
the end of each partition by a consumer of the harness's own, never from watermarks: Tansu's are wrong
after a batched produce), and the offsets each consumer group committed. Bounded: at most
`max_records` records per partition, values and keys cut to `max_bytes`."""
from __future__ import annotations

import time
from dataclasses import dataclass

INTERNAL_PREFIX = "__"      # __consumer_offsets and other internal topics are not the learner's


@dataclass(frozen=True)
class KafkaRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int          # epoch ms, as the record carries it


@dataclass(frozen=True)
class KafkaState:
    partitions: dict[str, int]                              # topic -> partition count
    records: dict[tuple[str, int], list[KafkaRecord]]       # (topic, partition) -> records, in offset order
    committed: dict[str, dict[tuple[str, int], int]]        # group -> (topic, partition) -> committed offset
    complete: bool = True   # False: a partition was not read to its end in time, or beyond max_records

    def counts(self) -> dict[tuple[str, int], int]:
        return {tp: len(records) for tp, records in self.records.items()}


def read_state(endpoint, *, timeout: float = 10.0, max_records: int = 10_000, max_bytes: int = 64 << 10) -> KafkaState:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
    admin = endpoint.admin()
    metadata = admin.list_topics(timeout=timeout)
    partitions = {name: len(topic.partitions) for name, topic in metadata.topics.items()
                  if not name.startswith(INTERNAL_PREFIX) and topic.error is None}
    wanted = [(name, p) for name, count in sorted(partitions.items()) for p in range(count)]
    records: dict[tuple[str, int], list[KafkaRecord]] = {tp: [] for tp in wanted}
    complete = True
    if wanted:
        consumer = Consumer(endpoint.config(**{
            "group.id": "retrylab-harness-reader", "enable.auto.commit": False, "enable.partition.eof": True,
            "auto.offset.reset": "earliest"}))
        try:
            consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in wanted])
            open_ = set(wanted)
            deadline = time.monotonic() + timeout
            while open_ and time.monotonic() < deadline:
                for message in consumer.consume(500, 0.2):
                    tp = (message.topic(), message.partition())
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            open_.discard(tp)
                        continue
                    kept = records.setdefault(tp, [])
                    if len(kept) >= max_records:
                        open_.discard(tp)
                        complete = False
                        continue
                    kept.append(KafkaRecord(tp[0], tp[1], message.offset(), _cut(message.key(), max_bytes),
                                            _cut(message.value(), max_bytes),
                                            tuple((k, _cut(v, max_bytes)) for k, v in message.headers() or ()),
                                            message.timestamp()[1]))
            complete = complete and not open_
        finally:
            consumer.close()
    return KafkaState(partitions, records, _committed(admin, wanted, timeout), complete)


def _committed(admin, wanted: list[tuple[str, int]], timeout: float) -> dict[str, dict[tuple[str, int], int]]:
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
    try:
        groups = admin.list_consumer_groups(request_timeout=timeout).result(timeout)
    except KafkaException:
        return {}
    committed = {}
    for group in sorted(g.group_id for g in groups.valid if not g.group_id.startswith("retrylab-harness")):
        request = [ConsumerGroupTopicPartitions(group, [TopicPartition(t, p) for t, p in wanted])]
        try:
            answer = admin.list_consumer_group_offsets(request, request_timeout=timeout)[group].result(timeout)
        except KafkaException:
            continue
        committed[group] = {(tp.topic, tp.partition): tp.offset for tp in answer.topic_partitions
                            if tp.error is None and tp.offset >= 0}
    return committed


def _cut(data: bytes | None, limit: int) -> bytes | None:
    return data if data is None or len(data) <= limit else data[:limit]
