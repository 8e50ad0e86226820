"""The main consumer: notify each callback once; a failure goes to the retry topic and this consumer moves
straight on. It never waits for a retry: a ten-minute wait here would stall every callback behind the
failing one (in its partition) for ten minutes.

Offsets are committed by hand, after the record is handled. For a failure that means after the retry
record is stored (flush): killed between the two, the record is read again and notified again (at least
once), never lost; committed first, a kill would lose the retry.
"""
import json
import os
import time

from confluent_kafka import Consumer, Producer

import notifier

BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092")
RETRY_INTERVAL_MS = int(os.environ.get("RETRY_INTERVAL_MS", "600000"))
TOPIC, RETRY_TOPIC = "callbacks", "callbacks.retry"


def retry_headers(error: Exception) -> list[tuple[str, bytes]]:
    """The first failure: retryTimes 1, due one interval from now (epoch ms)."""
    due = int(time.time() * 1000) + RETRY_INTERVAL_MS
    return [("retryTimes", b"1"), ("nextRetryTime", str(due).encode()), ("lastError", str(error).encode())]


def main() -> None:
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "notifier",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "acks": "all"})
    consumer.subscribe([TOPIC])
    try:
        while True:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                print("consume error:", msg.error(), flush=True)
                continue
            try:
                notifier.notify(json.loads(msg.value()))
            except notifier.NotifyError as error:
                # the value goes on byte for byte, the retry state rides in headers
                producer.produce(RETRY_TOPIC, key=msg.key(), value=msg.value(), headers=retry_headers(error))
                producer.flush()    # stored before the offset below moves past the original
            consumer.commit(message=msg, asynchronous=False)
    finally:
        consumer.close()


if __name__ == "__main__":
    main()
