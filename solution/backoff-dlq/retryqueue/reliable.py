"""Fetching a message without losing it when the worker dies.

LPOP hands a message to the worker and forgets it: if the worker dies before it has finished,
the message is gone. Instead, LMOVE moves it atomically into a list that belongs to this
worker (its processing list), and the worker removes it only once the message has been
handled: processed, scheduled for a retry, or dead-lettered.

A worker proves it is alive with a heartbeat key that expires unless refreshed. A processing
list whose owner's heartbeat has expired belongs to a dead worker; any worker moves its
contents back to the queue (on start-up, and every few seconds after). The price is at least
once delivery: a message that was being processed when its worker died is processed again.

The heartbeat is refreshed from the worker loop (every third of its TTL), not from a thread: a
process() call longer than two thirds of the TTL makes a live worker look dead, and its message
runs twice. Set WORKER_HEARTBEAT_TTL well above the slowest task.
"""
import os
import secrets
import socket

from . import keys, lua

# KEYS: queue, our processing list. ARGV: the message just handled, or "".
TAKE = """
if ARGV[1] ~= '' then
  redis.call('LREM', KEYS[2], 1, ARGV[1])
end
return redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
"""


def new_worker_id():
    # Host and pid say where to look; the random part keeps a restarted pid from taking over
    # the identity (and the in-flight messages) of the dead process it replaces.
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class ReliableFetch:
    def __init__(self, r, worker_id, heartbeat_ttl=30.0):
        self.r = r
        self.worker_id = worker_id
        self.processing = keys.processing(worker_id)
        self.heartbeat_ttl = heartbeat_ttl
        self._take = lua.script(r, TAKE)

    # -- being alive -------------------------------------------------------------------------

    def beat(self):
        """Say "still alive" for another heartbeat_ttl seconds."""
        self.r.set(keys.heartbeat(self.worker_id), self.worker_id, px=int(self.heartbeat_ttl * 1000))
        # Again on every beat: if we were taken for dead (a pause longer than the TTL) and
        # recovered, this puts us back on the list of workers whose messages get recovered.
        self.r.sadd(keys.WORKERS, self.worker_id)

    def retire(self):
        """Leave cleanly: whatever is still in flight goes back to the queue, then forget us."""
        moved = return_to_queue(self.r, self.worker_id)
        self.r.delete(keys.heartbeat(self.worker_id))
        self.r.srem(keys.WORKERS, self.worker_id)
        return moved

    # -- taking and finishing messages -------------------------------------------------------

    def take(self, ack=None):
        """Acknowledge `ack` (a message just handled) and take the next message: one round trip.

        Returns the raw message, now in our processing list, or None if the queue is empty.
        """
        return self._take(keys=[keys.QUEUE, self.processing], args=[ack or b""])

    def take_blocking(self, timeout):
        """Wait up to `timeout` seconds for a message (only when there is nothing else to do)."""
        return self.r.blmove(keys.QUEUE, self.processing, timeout, "LEFT", "RIGHT")

    def ack(self, raw):
        """The message is handled: drop it from our processing list."""
        self.r.lrem(self.processing, 1, raw)


def return_to_queue(r, worker_id):
    """Move a worker's in-flight messages back to the head of the queue; how many moved.

    To the head because they were taken from there: they are the oldest work. One LMOVE per
    message is atomic, so two workers recovering the same list at once cannot duplicate one.
    """
    moved = 0
    while r.lmove(keys.processing(worker_id), keys.QUEUE, "RIGHT", "LEFT") is not None:
        moved += 1
    return moved


def recover_dead_workers(r, log=print):
    """Give the in-flight messages of every worker whose heartbeat expired back to the queue."""
    recovered = 0
    for worker_id in r.smembers(keys.WORKERS):
        worker_id = worker_id.decode() if isinstance(worker_id, bytes) else worker_id
        if r.exists(keys.heartbeat(worker_id)):
            continue
        moved = return_to_queue(r, worker_id)
        # Forget it only once its list is empty: if we die here, the next worker finishes the job.
        r.srem(keys.WORKERS, worker_id)
        if moved:
            log(f"recovered {moved} in-flight message(s) of dead worker {worker_id}")
        recovered += moved
    return recovered
