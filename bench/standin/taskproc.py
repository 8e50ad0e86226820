"""A stand-in for the lab's application module, for the benchmark and the crash test.

`process(msg)` raises for kind "bad" as the lab's taskproc does, and otherwise returns. Two
environment variables make it useful for measuring:
    STANDIN_SECONDS     real seconds each call takes (default 0: as fast as the queue allows)
    STANDIN_RECORD_URL  a Redis URL: every call is recorded in the list `standin:calls` as JSON
                        {"id", "pid", "ok"}, after its work and before process() returns, so that
                        a record means "the work was done"; the crash test reads it back
    STANDIN_COUNT_URL   a Redis URL: every failing call increments `standin:failures` (the
                        benchmark checks that each contender tried each bad message 5 times)
"""
import json
import os
import time

_SECONDS = float(os.environ.get("STANDIN_SECONDS") or 0)
_RECORD_URL = os.environ.get("STANDIN_RECORD_URL")
_PID = os.getpid()
_COUNT_URL = os.environ.get("STANDIN_COUNT_URL")
_record = _count = None
if _RECORD_URL or _COUNT_URL:
    import redis
    _record = redis.Redis.from_url(_RECORD_URL) if _RECORD_URL else None
    _count = redis.Redis.from_url(_COUNT_URL) if _COUNT_URL else None

CALLS = "standin:calls"
FAILURES = "standin:failures"


class TaskRejected(RuntimeError):
    """What process() raises for a message of kind "bad"."""


def process(msg):
    if _SECONDS:
        time.sleep(_SECONDS)
    ok = msg.get("kind") != "bad"
    if _record is not None:
        _record.rpush(CALLS, json.dumps({"id": msg.get("id"), "pid": _PID, "ok": ok}))
    if not ok:
        if _count is not None:
            _count.incr(FAILURES)
        raise TaskRejected(f"task {msg.get('id')}: kind=bad is rejected by taskproc")
