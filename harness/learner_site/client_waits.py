"""Real time for a broker client library's own waits, in a learner process on the run's virtual clock.

The virtual clock (retrylab.learner_site.virtual_clock) makes the learner's sleeps cost no real time, and the
event loop's clock follows it. A client library's waits are not the learner's: its heartbeat and ping loops
would move the run's clock on (time no learner code waited for), and its timeouts would expire whenever
anything else moves the clock. A learner task as ordinary as `while True: await asyncio.sleep(5)` beside the
client moves the clock 5 s per turn at once, and every pending request of the client timed out (measured
with two brokers' asyncio clients: every request of a DLQ service with such a heartbeat timed out, and a consumer
never fetched a record). So the modules of the package see a `threading` whose Event waits in real
time and, on the virtual clock, a `time` whose sleep and monotonic clock are real, and an `asyncio` (and an
`async_timeout`) whose `sleep`, `wait`, `wait_for` and `timeout` last in real time: each waits on the loop
again when the loop's clock jumped past its real end. The loop's other timers (`call_later`) still follow the
loop's clock: a client's idle-connection and linger timers firing early cost nothing but a reconnect or a send.
The learner's own asyncio timeouts stay on the loop's clock, as they were: `wait_for(event.wait(), t)` may be a
wait for I/O (a reply, a partition assignment), which a virtual jump would time out at once.
"""
import sys
import threading
import time
import types

from retrylab.learner_site import virtual_clock as clock_module    # the learner site imports it in every process


def virtual_clock():
    """The learner site's virtual clock, if this process runs on it (not on a run on real time)."""
    return clock_module if time.sleep is clock_module.sleep else None


class _Event(threading.Event):
    wait = clock_module._real_event_wait    # CPython's own Event.wait: the virtual clock's makes a timed wait a sleep


def _shim(module, **real) -> types.ModuleType:
    copy = types.ModuleType(module.__name__)
    copy.__dict__.update(module.__dict__)
    copy.__dict__.update(real)
    return copy


def _seconds(clock, timeout) -> float:
    """A timeout as a positive number of seconds, or 0 where the library's own wait should take it as it is
    (None, zero, negative, not a number, NaN, too long)."""
    return 0.0 if timeout is None else clock._sleep_seconds(timeout) or 0.0


class _RealTimeout:
    """`asyncio.timeout(delay)` counted in real time: its timer is on the loop's clock, so one that fires early
    (the clock jumped) is set again for the rest, and at the real end the timeout expires as asyncio's does."""

    def __init__(self, asyncio, seconds: float, real_now):
        self._asyncio, self._real_now = asyncio, real_now
        self._end = real_now() + seconds
        self._timeout = asyncio.timeout(None)
        self._handle = None

    async def __aenter__(self):
        await self._timeout.__aenter__()
        self._check()
        return self._timeout

    def _check(self) -> None:
        loop = self._asyncio.get_running_loop()
        left = self._end - self._real_now()
        if left > 0:
            self._handle = loop.call_later(left, self._check)
        else:
            self._handle = None
            self._timeout.reschedule(loop.time())   # expires now: the task is cancelled, TimeoutError on exit

    async def __aexit__(self, *exc_info):
        if self._handle is not None:
            self._handle.cancel()
        return await self._timeout.__aexit__(*exc_info)


def real_time_asyncio(asyncio, clock) -> types.ModuleType:
    """`asyncio` with a `sleep`, `wait_for`, `wait` and `timeout` that last their time in real time."""
    loop_sleep, loop_wait_for, loop_wait = clock._real_asyncio_sleep, asyncio.wait_for, asyncio.wait
    real_now = clock._real_monotonic

    async def sleep(delay, result=None):
        seconds = _seconds(clock, delay)
        if not seconds:     # zero, or what asyncio refuses or waits for ever on: as the loop's own sleep takes it
            return await loop_sleep(delay, result)
        end = real_now() + seconds
        while (left := end - real_now()) > 0:
            await loop_sleep(left)
        return result

    async def wait(fs, *, timeout=None, return_when=asyncio.ALL_COMPLETED):
        seconds = _seconds(clock, timeout)
        if not seconds:
            return await loop_wait(fs, timeout=timeout, return_when=return_when)
        end, fs = real_now() + seconds, set(fs)
        while True:
            done, pending = await loop_wait(fs, timeout=end - real_now(), return_when=return_when)
            if _met(done, pending, return_when) or end <= real_now():
                return done, pending

    def _met(done, pending, return_when) -> bool:
        if return_when == asyncio.FIRST_COMPLETED:
            return bool(done)
        if return_when == asyncio.FIRST_EXCEPTION:
            return not pending or any(not f.cancelled() and f.exception() is not None for f in done)
        return not pending

    async def wait_for(fut, timeout):   # asyncio's parameter names: a client may pass them by keyword
        seconds = _seconds(clock, timeout)
        if not seconds:     # no timeout, zero, negative or not a number: as asyncio's own wait_for takes it
            return await loop_wait_for(fut, timeout)
        # as Python 3.12's own wait_for: the awaitable under a timeout (here a real-time one), so a timeout
        # cancels it and waits for its clean-up, and a cancel of the waiting task reaches it
        async with _RealTimeout(asyncio, seconds, real_now):
            return await fut

    return _shim(asyncio, sleep=sleep, wait=wait, wait_for=wait_for,
                 timeout=real_time_timeout(asyncio, asyncio.timeout, clock))


def real_time_timeout(asyncio, timeout, clock):
    """`timeout(delay)` (asyncio's, or async_timeout's) counted in real time."""
    def real_timeout(delay):
        seconds = _seconds(clock, delay)
        return _RealTimeout(asyncio, seconds, clock._real_monotonic) if seconds else timeout(delay)
    return real_timeout


def real_waits(package: str) -> None:
    """Give every module of `package` imported so far the real-time `threading`, `time` and `asyncio` above."""
    shims = {"threading": (threading, _shim(threading, Event=_Event))}
    clock = virtual_clock()
    if clock is not None:
        # a client times its heartbeats, session and request timeouts by the monotonic clock: another
        # process's jump of the run's clock (a retry consumer sleeping ten minutes, seen here at the next reply
        # of the application channel) made a consumer leave its group (measured)
        shims["time"] = (time, _shim(time, sleep=clock._real_sleep, monotonic=clock._real_monotonic,
                                     monotonic_ns=clock._real_monotonic_ns))
        asyncio = sys.modules.get("asyncio")    # not imported: no module of the package uses it
        if asyncio is not None and getattr(clock, "_real_asyncio_sleep", None) is not None:
            shims["asyncio"] = (asyncio, real_time_asyncio(asyncio, clock))
            async_timeout = sys.modules.get("async_timeout")    # a client's request timeouts, where it uses it
            if async_timeout is not None:
                shims["async_timeout"] = (async_timeout, _shim(async_timeout, timeout=real_time_timeout(
                    asyncio, async_timeout.timeout, clock)))
    for name, module in list(sys.modules.items()):
        if name == package or name.startswith(package + "."):
            for attribute, (real, replacement) in shims.items():
                if getattr(module, attribute, None) is real:
                    setattr(module, attribute, replacement)
