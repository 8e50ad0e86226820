"""Copy each message that used up its deliveries to `dlq.events`, and each terminated one to
`dlq.terminated`: the original payload byte for byte, fetched from EVENTS by its stream sequence.

The advisories are read from stream ADVISORIES (setup.py), through a durable consumer of this service's
own: one published while this service was down is read when it starts. Each dead letter carries
`Nats-Msg-Id: dlq-<stream_seq>`, so the same advisory handled twice (a redelivery, a re-sent advisory)
is stored once: JetStream drops a duplicate id inside the stream's 2-minute window.

Run:  NATS_URL=nats://host:4222 python dlq_service.py
"""
import asyncio
import json
import os
import signal

import nats

TARGETS = {"MAX_DELIVERIES": ("dlq.events", "dlq"), "MSG_TERMINATED": ("dlq.terminated", "term")}


async def dead_letter(js, advisory: dict, kind: str) -> None:
    subject, prefix = TARGETS[kind]
    seq = advisory["stream_seq"]
    original = await js.get_msg(advisory["stream"], seq)
    await js.publish(subject, original.data, headers={
        "Nats-Msg-Id": f"{prefix}-{seq}",
        "Dlq-Stream": advisory["stream"], "Dlq-Stream-Seq": str(seq),
        "Dlq-Deliveries": str(advisory.get("deliveries", "")), "Dlq-Subject": original.subject or ""})


async def main():
    nc = await nats.connect(os.environ.get("NATS_URL", "nats://localhost:4222"))
    js = nc.jetstream()
    sub = await js.pull_subscribe(">", durable="dlq-service", stream="ADVISORIES")
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stopping.set)
    while not stopping.is_set():
        try:
            messages = await sub.fetch(10, timeout=1)
        except asyncio.TimeoutError:    # nats' own TimeoutError, or asyncio's (see README)
            continue
        for msg in messages:
            kind = msg.subject.split(".")[4]    # $JS.EVENT.ADVISORY.CONSUMER.<KIND>.<stream>.<consumer>
            if kind in TARGETS:
                await dead_letter(js, json.loads(msg.data), kind)
            await msg.ack()                     # after the dead letter: a crash in between redoes it, once
    await nc.close()    # not drain(): with a pull subscription it waits out nats-py's drain timeout (30 s)


if __name__ == "__main__":
    asyncio.run(main())
