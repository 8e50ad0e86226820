"""The actor Dramatiq runs in the benchmark: the stand-in taskproc's process(), with the
reference's retry count (5 attempts: max_retries=4) and no backoff (min/max_backoff 0 ms)."""
import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from taskproc import process as _process

dramatiq.set_broker(RedisBroker(url=os.environ["REDIS_URL"]))


@dramatiq.actor(max_retries=4, min_backoff=0, max_backoff=0)
def process(msg):
    _process(msg)
