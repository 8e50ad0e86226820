"""The worker loop: take a message, process it, and on failure retry it later or give up.

One round of the loop, in the common case, is one round trip to Redis: acknowledging the message
just processed and taking the next one are one script (reliable.TAKE); due retries are promoted
every promote_every seconds, not on every round. Everything that changes where a message lives
(retry, dead-letter, acknowledge) is atomic, so a crash at any point leaves each message in
exactly one place.
"""
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, fields

import redis

from . import backoff, dlq, errors, messages
from .delayed import DelayedRetries
from .reliable import ReliableFetch, new_worker_id, recover_dead_workers

log = logging.getLogger("retryqueue.worker")


@dataclass(frozen=True)
class Settings:
    max_attempts: int = 5         # process() calls before a retryable failure is given up on
    backoff_base: float = 1.0     # seconds: the first retry waits up to this long ...
    backoff_cap: float = 30.0     # ... and no retry waits longer than this
    heartbeat_ttl: float = 30.0   # seconds without a heartbeat after which a worker counts as dead;
                                  # beats come every ttl/3, so process() must finish within 2/3 of it
    idle_block: float = 1.0       # seconds to block on an empty queue; below redis-py's 5 s socket timeout
    max_nap: float = 0.5          # longest sleep while a retry is pending: new messages are seen soon
    promote_every: float = 0.1    # seconds between checks for due retries while busy

    ENV = {"max_attempts": "RETRY_MAX_ATTEMPTS", "backoff_base": "RETRY_BACKOFF_BASE",
           "backoff_cap": "RETRY_BACKOFF_CAP", "heartbeat_ttl": "WORKER_HEARTBEAT_TTL"}

    @classmethod
    def from_env(cls, env=os.environ):
        """Defaults, overridden by environment variables (see ENV)."""
        values = {}
        for field in fields(cls):
            name = cls.ENV.get(field.name)
            if name and env.get(name, "").strip():
                try:
                    values[field.name] = field.type(env[name])
                except ValueError:
                    raise SystemExit(f"{name}={env[name]!r} is not a valid {field.type.__name__}") from None
        return cls(**values)


class Shutdown(BaseException):
    """A stop signal arrived while the worker was waiting, holding no message.

    A BaseException, like KeyboardInterrupt, so that no `except Exception` on the way up
    (in redis-py, or around process()) swallows it.
    """


class Worker:
    def __init__(self, r, process, settings=Settings(), *, worker_id=None, policy=None):
        self.r = r
        self.process = process
        self.settings = settings
        self.worker_id = worker_id or new_worker_id()
        self.policy = policy or backoff.policy(settings.backoff_base, settings.backoff_cap)
        self.fetcher = ReliableFetch(r, self.worker_id, settings.heartbeat_ttl)
        self.delayed = DelayedRetries(r)
        self.stopping = False
        self._waiting = False          # True only while sleeping or blocked with no message in hand
        self._next_beat = 0.0          # time.monotonic() of the next heartbeat and recovery round
        self._next_promote = 0.0       # time.monotonic() of the next look for due retries
        self._next_due = None          # epoch seconds of the earliest parked retry, None: none known

    # -- the loop ------------------------------------------------------------------------------

    def run(self):
        """Work until stopped by SIGTERM/SIGINT (or `stop()`); return how many messages were handled."""
        self._handle_signals()
        handled = 0
        done = None  # processed, not yet acknowledged: the ack travels with the next fetch
        log.info("worker %s started", self.worker_id)
        try:
            while not self.stopping:
                self._keep_alive()
                raw, done = self._fetch(ack=done), None
                if raw is None:
                    raw = self._wait()
                    self._keep_alive()  # the wait may have been long: beat before working again
                if raw is not None:
                    done = raw if self.handle(raw) else None
                    handled += 1
        except Shutdown:
            pass
        finally:
            self._leave(done)
        return handled

    def stop(self):
        self.stopping = True

    def handle(self, raw):
        """Process one message; retry or dead-letter it on failure. True when processed."""
        now = time.time()
        try:
            msg = messages.decode(raw)
        except messages.Malformed as exc:
            # Retrying cannot fix it: straight to the DLQ, with the raw text kept.
            self._dead_letter(raw, raw.decode("utf-8", "replace"), exc, attempts=1, first_seen_at=now)
            return False
        first_seen_at = messages.first_seen_at(msg, now)
        try:
            self.process(messages.original(msg))
        except Exception as exc:  # any failure of the task must not kill the worker
            self._failed(raw, msg, exc, first_seen_at)
            return False
        log.debug("processed id=%s", msg.get("id"))
        return True

    # -- what happens to a failed message --------------------------------------------------------

    def _failed(self, raw, msg, exc, first_seen_at):
        attempts = messages.attempts(msg) + 1
        kind = errors.classify(exc)
        if kind == errors.PERMANENT or attempts >= self.settings.max_attempts:
            self._dead_letter(raw, messages.original(msg), exc, attempts=attempts, first_seen_at=first_seen_at)
            return
        # attempts failures so far: the first retry uses backoff step 0 (up to base seconds).
        wait = self.policy(attempts - 1)
        due = time.time() + wait
        retry = messages.after_failure(msg, first_seen_at)
        self.delayed.park(self.fetcher.processing, raw, messages.encode(retry), due)
        self._next_due = due if self._next_due is None else min(self._next_due, due)
        log.info("requeued id=%s attempts=%d wait=%.3f (%s)", msg.get("id"), attempts, wait, errors.describe(exc))

    def _dead_letter(self, raw, payload, exc, *, attempts, first_seen_at):
        entry = dlq.record(payload, exc, attempts=attempts, first_seen_at=first_seen_at,
                           failed_at=time.time(), worker_id=self.worker_id)
        with self.r.pipeline(transaction=True) as pipe:  # MULTI/EXEC: dead-letter and acknowledge as one step
            dlq.push(pipe, entry)
            pipe.lrem(self.fetcher.processing, 1, raw)
            pipe.execute()
        message_id = payload.get("id") if isinstance(payload, dict) else None
        log.warning("dead-lettered id=%s attempts=%d %s: %s",
                    message_id, attempts, entry["error_class"], entry["error"])

    # -- fetching and waiting ------------------------------------------------------------------

    def _fetch(self, ack):
        """Acknowledge `ack` and take the next message, promoting due retries first (now and then)."""
        if time.monotonic() >= self._next_promote or (
                self._next_due is not None and time.time() >= self._next_due):
            _, self._next_due = self.delayed.promote(time.time())
            self._next_promote = time.monotonic() + self.settings.promote_every
        return self.fetcher.take(ack)

    def _wait(self):
        """Nothing to take: sleep until the next retry is due, or block on the queue if none is."""
        self._next_promote = 0.0  # whatever ends the wait, look for due retries next
        if self._next_due is not None:
            # Not BLMOVE: a blocking call waits in real time on the server, whereas sleeping can
            # be cut short (and is virtual under a test clock). Short naps see new messages soon.
            nap = min(max(self._next_due - time.time(), 0.0), self.settings.max_nap)
            self._interruptible(time.sleep, nap)
            return None
        # Never block past the next heartbeat: a worker silent for heartbeat_ttl counts as dead.
        block = min(self.settings.idle_block, self.settings.heartbeat_ttl / 3)
        return self._interruptible(self.fetcher.take_blocking, block)

    def _keep_alive(self):
        if time.monotonic() < self._next_beat:
            return
        self.fetcher.beat()
        recover_dead_workers(self.r, log=log.warning)
        self._next_beat = time.monotonic() + self.settings.heartbeat_ttl / 3

    # -- stopping ------------------------------------------------------------------------------

    def _handle_signals(self):
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum, frame):
        # Finish the message in hand; if there is none, stop waiting for one right now.
        self.stopping = True
        if self._waiting:
            raise Shutdown

    def _interruptible(self, wait, *args):
        if self.stopping:
            raise Shutdown
        self._waiting = True
        try:
            return wait(*args)
        finally:
            self._waiting = False

    def _leave(self, done):
        # A BLMOVE cut short by a signal may still have moved a message into our processing list:
        # retire() puts anything left there back at the head of the queue.
        try:
            if done is not None:
                self.fetcher.ack(done)
            returned = self.fetcher.retire()
        except redis.RedisError as exc:
            # Redis is gone: our heartbeat will expire and another worker recovers what we held.
            log.error("worker %s stopped without retiring (%s)", self.worker_id, exc)
            return
        log.info("worker %s stopped%s", self.worker_id,
                 f"; {returned} unprocessed message(s) back on the queue" if returned else "")
