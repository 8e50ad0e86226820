"""The retry consumer: waits until a record's nextRetryTime, notifies again, and either stops (success),
hands it back to the retry topic (retryTimes + 1, due one interval later) or, after the 3rd failed
attempt, to the DLQ topic with the last error.

It may sleep until due: every record on callbacks.retry was delayed by the same interval, so within a
partition the one at the head is due first, and nothing behind it could go sooner. Sleeping means no
poll for up to an interval, so max.poll.interval.ms is raised above it (or the group would evict this
member mid-wait). What the design gives up: order per key. A retried callback is notified after later
callbacks of the same order that succeeded at once.
"""
import json
import os
import time

from confluent_kafka import Consumer, Producer

import notifier

BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092")
RETRY_INTERVAL_MS = int(os.environ.get("RETRY_INTERVAL_MS", "600000"))
RETRY_TOPIC, DLQ_TOPIC = "callbacks.retry", "callbacks.dlq"
MAX_ATTEMPTS = 3


def header(msg, name: str) -> str:
    for key, value in msg.headers() or ():
        if key == name and value is not None:
            return value.decode()
    raise KeyError(name)


def main() -> None:
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "notifier-retry",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "max.poll.interval.ms": RETRY_INTERVAL_MS + 60_000})
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "acks": "all"})
    consumer.subscribe([RETRY_TOPIC])
    try:
        while True:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                print("consume error:", msg.error(), flush=True)
                continue
            failed = int(header(msg, "retryTimes"))
            wait = int(header(msg, "nextRetryTime")) / 1000 - time.time()
            if wait > 0:
                time.sleep(wait)
            try:
                notifier.notify(json.loads(msg.value()))
            except notifier.NotifyError as error:
                failed += 1
                if failed >= MAX_ATTEMPTS:
                    headers = [("retryTimes", str(failed).encode()), ("lastError", str(error).encode())]
                    producer.produce(DLQ_TOPIC, key=msg.key(), value=msg.value(), headers=headers)
                else:
                    due = int(time.time() * 1000) + RETRY_INTERVAL_MS
                    headers = [("retryTimes", str(failed).encode()), ("nextRetryTime", str(due).encode()),
                               ("lastError", str(error).encode())]
                    producer.produce(RETRY_TOPIC, key=msg.key(), value=msg.value(), headers=headers)
                producer.flush()    # stored before the commit below: a kill in between repeats, never loses
            consumer.commit(message=msg, asynchronous=False)
    finally:
        consumer.close()


if __name__ == "__main__":
    main()
