"""Process events from the durable pull consumer `worker-consumer` until SIGTERM or Ctrl-C.

- processed: ack;
- a temporary error (TemporaryError): no answer at all. The consumer's BackOff (0.5 s, then 1 s) is the
  one place the retry schedule lives: the server redelivers when the wait is over. (A plain nak() would
  redeliver at once, in a tight loop; nak(delay=...) works too, but puts a second schedule in the code.)
  After the 3rd delivery the server stops and publishes the MAX_DELIVERIES advisory (dlq_service.py);
- a permanent error (PermanentError: a corrupt payload): term(), no retry can fix it.

Run:  NATS_URL=nats://host:4222 python worker.py
"""
import asyncio
import os
import signal

import nats

from taskproc import PermanentError, TemporaryError, process

async def handle(msg):
    try:
        process(msg.data)
    except PermanentError:
        await msg.term()
    except TemporaryError:
        pass    # unacknowledged: redelivered after BackOff's wait, until MaxDeliver
    else:
        await msg.ack()


async def main():
    nc = await nats.connect(os.environ.get("NATS_URL", "nats://localhost:4222"))
    # bind to the consumer setup.py made: pull_subscribe would quietly create one with defaults if missing
    sub = await nc.jetstream().pull_subscribe_bind("worker-consumer", stream="EVENTS")
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stopping.set)
    while not stopping.is_set():
        try:
            # keep a pull request waiting at all times: the MAX_DELIVERIES advisory is only published
            # while one is, after the last redelivery wait
            messages = await sub.fetch(10, timeout=1)
        except asyncio.TimeoutError:    # nats' own TimeoutError, or asyncio's (see README)
            continue
        for msg in messages:
            await handle(msg)
    await nc.close()    # not drain(): with a pull subscription it waits out nats-py's drain timeout (30 s)


if __name__ == "__main__":
    asyncio.run(main())
