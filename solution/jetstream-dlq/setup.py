"""Create what the worker and the DLQ service need on JetStream; safe to run again (same settings: no change).

- consumer `worker-consumer` on stream EVENTS: durable, pull, explicit acks, at most 3 deliveries, and a
  growing wait before each redelivery (BackOff 0.5 s, then 1 s);
- stream DLQ (`dlq.events`: messages that used up their deliveries; `dlq.terminated`: ones the worker
  terminated), with a 2-minute duplicate window so a dead letter published twice is stored once;
- stream ADVISORIES, which keeps the consumer's MAX_DELIVERIES and MSG_TERMINATED advisories: advisories
  are core NATS messages, lost when nobody listens, so the DLQ service reads them from here and misses
  none even when it starts late or restarts.

Run:  NATS_URL=nats://host:4222 python setup.py
"""
import asyncio
import os

import nats
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

ADVISORY_SUBJECTS = ["$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.EVENTS.worker-consumer",
                     "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.EVENTS.worker-consumer"]

WORKER_CONSUMER = ConsumerConfig(
    durable_name="worker-consumer",     # durable: it outlives the worker, so a restart resumes where it was
    filter_subject="events.created",
    ack_policy=AckPolicy.EXPLICIT,      # every message acked (or nak'ed, or terminated) on its own
    max_deliver=3,                      # 1 delivery + 2 redeliveries, then the MAX_DELIVERIES advisory
    ack_wait=30,                        # with backoff set the server uses backoff[0] for the first wait
    backoff=[0.5, 1.0],                 # seconds before the 2nd and the 3rd delivery of an unacked message
)


async def main():
    nc = await nats.connect(os.environ.get("NATS_URL", "nats://localhost:4222"))
    js = nc.jetstream()
    await js.add_consumer("EVENTS", WORKER_CONSUMER)    # the same config again is accepted as it is
    for name, subjects in (("DLQ", ["dlq.events", "dlq.terminated"]), ("ADVISORIES", ADVISORY_SUBJECTS)):
        config = StreamConfig(name=name, subjects=subjects, duplicate_window=120)
        try:
            await js.add_stream(config)
        except nats.js.errors.BadRequestError:          # it exists with other settings: make them these
            await js.update_stream(config)
    await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
