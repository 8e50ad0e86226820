"""Real time for a broker client library's own waits, in a learner process on the run's virtual clock.

The virtual clock (retrylab.learner_site.virtual_clock) makes the learner's sleeps cost no real time, and the
event loop's clock follows it. A client library's waits are not the learner's: its heartbeat and ping loops
would move the run's clock on (time no learner code waited for), and its timeouts would expire whenever
anything else moves the clock. A learner task as ordinary as `while True: await asyncio.sleep(5)` beside the
client moves the clock 5 s per turn at once, and every pending request of the client timed out (measured with
nats-py: each js.get_msg of a DLQ service with such a heartbeat raised nats' TimeoutError). So the modules of
the package see a `threading` whose Event waits in real time and, on the virtual clock, a `time` whose
sleep and monotonic clock are real and an `asyncio` whose `sleep` and `wait_for` last in real time (each
waits on the loop again when the loop's clock jumped past its real end).
"""
import sys
import threading
import time
import types


def virtual_clock():
    """The learner site's virtual clock, if this process runs on it (not on a run on real time)."""
    from retrylab.learner_site import virtual_clock as clock
    return clock if time.sleep is clock.sleep else None


class _Event(threading.Event):
    def wait(self, timeout=None):   # CPython's own Event.wait: the virtual clock's makes a timed wait a sleep
        with self._cond:
            signaled = self._flag
            if not signaled:
                signaled = self._cond.wait(timeout)
            return signaled


def _shim(module, **real) -> types.ModuleType:
    copy = types.ModuleType(module.__name__)
    copy.__dict__.update(module.__dict__)
    copy.__dict__.update(real)
    return copy


def real_time_asyncio(asyncio, clock) -> types.ModuleType:
    """`asyncio` with a `sleep` and a `wait_for` that last their time in real time."""
    loop_sleep, loop_wait_for, real_now = clock._real_asyncio_sleep, asyncio.wait_for, clock._real_monotonic

    async def sleep(delay, result=None):
        seconds = clock._sleep_seconds(delay)
        if not seconds:     # zero, or what asyncio refuses or waits for ever on: as the loop's own sleep takes it
            return await loop_sleep(delay, result)
        end = real_now() + seconds
        while (left := end - real_now()) > 0:
            await loop_sleep(left)
        return result

    async def wait_for(awaitable, timeout):
        seconds = None if timeout is None else clock._sleep_seconds(timeout)
        if not seconds:     # no timeout, zero, negative or not a number: as asyncio's own wait_for takes it
            return await loop_wait_for(awaitable, timeout)
        end = real_now() + seconds
        future = asyncio.ensure_future(awaitable)
        try:
            while (left := end - real_now()) > 0:
                done, _ = await asyncio.wait((future,), timeout=left)
                if done:
                    return future.result()
        except asyncio.CancelledError:
            future.cancel()     # as wait_for does when the task waiting is cancelled
            raise
        # the time is up: asyncio's own wait_for with no time left cancels the future and raises TimeoutError
        # (or returns its result, should it finish while being cancelled), as it would have after `timeout`
        return await loop_wait_for(future, 0)

    return _shim(asyncio, sleep=sleep, wait_for=wait_for)


def real_waits(package: str) -> None:
    """Give every module of `package` imported so far the real-time `threading`, `time` and `asyncio` above."""
    shims = {"threading": (threading, _shim(threading, Event=_Event))}
    clock = virtual_clock()
    if clock is not None:
        # a client times its heartbeats, session and request timeouts by the monotonic clock: another
        # process's jump of the run's clock (a retry consumer sleeping ten minutes, seen here at the next reply
        # of the application channel) made aiokafka leave its group (measured)
        shims["time"] = (time, _shim(time, sleep=clock._real_sleep, monotonic=clock._real_monotonic,
                                     monotonic_ns=clock._real_monotonic_ns))
        asyncio = sys.modules.get("asyncio")    # not imported: no module of the package uses it
        if asyncio is not None and getattr(clock, "_real_asyncio_sleep", None) is not None:
            shims["asyncio"] = (asyncio, real_time_asyncio(asyncio, clock))
    for name, module in list(sys.modules.items()):
        if name == package or name.startswith(package + "."):
            for attribute, (real, replacement) in shims.items():
                if getattr(module, attribute, None) is real:
                    setattr(module, attribute, replacement)
