"""A virtual clock for learner processes: sleeping costs no real time.

time-machine moves `time.time()` and `datetime.now()`; it does not move `time.monotonic()` or
`perf_counter()` (measured), so those are patched here to follow the same offset, or a worker that
schedules retries by the monotonic clock would spin in real time. Time still ticks with real time
between sleeps (tick=True), so a busy-wait on `time.time()` ends as it would.

The clock is the run's, kept by the harness (retrylab.appchannel.RunClock): each sleep is reported over
the application channel, and the reply (to a sleep or to any call of the application module) carries
the run's offset, which this process takes as its own. So every process of a run, and the harness's
record of calls, read one clock. Without a channel (no RETRYLAB_APP_SOCKET) the offset is local.
A process starts at the offset the run had when it began (RETRYLAB_CLOCK_OFFSET): the run's clock is
days ahead of real time, so the process's first time.time() is already the run's, not real time.
"""
import math
import operator
import os
import sys
import threading
import time

from retrylab.learner_site import appstub

_offset = 0.0
_offset_lock = threading.Lock()
_traveller = None
_real_sleep = time.sleep
_real_monotonic = time.monotonic
_real_monotonic_ns = time.monotonic_ns
_real_perf_counter = time.perf_counter
_real_perf_counter_ns = time.perf_counter_ns
_real_event_wait = threading.Event.wait
# A real pause per sleep call (time.sleep's and asyncio.sleep's), so that a polling loop (`while True: lpop();
# sleep(1)`) yields the CPU instead of spinning, yet costs only about a millisecond per call, however long the sleep.
_REAL_PAUSE = 0.001
# The longest time.sleep takes: its clock counts nanoseconds in 64 bits, and a longer sleep is an OverflowError.
LONGEST_SLEEP = 2**63 / 1e9


def advance(seconds: float) -> None:
    """Move the run's clock forward by `seconds` (this process's, without a channel)."""
    if seconds <= 0:
        return
    if appstub.available():
        try:
            appstub.request({"op": "advance", "seconds": seconds})  # the reply's offset reaches _follow
            return
        except appstub.ChannelClosed:
            pass    # the run is being stopped: time still passes for this process
    _follow(_offset + seconds)


def _follow(run_offset: float) -> None:
    """Set this process's clocks to the run's offset (never backwards)."""
    global _offset
    with _offset_lock:
        delta = run_offset - _offset
        if delta > 0:
            _offset = run_offset
            _traveller.shift(delta)


def offset() -> float:
    return _offset


def _sleep_seconds(seconds) -> float | None:
    """`seconds` as time.sleep takes it (a float, or an integer of any type), or None where time.sleep refuses it:
    NaN, infinite, too long, negative, not a number."""
    if isinstance(seconds, float):
        value = seconds
    else:
        try:
            value = operator.index(seconds)
        except TypeError:
            return None
    return float(value) if 0 <= value < LONGEST_SLEEP else None     # False for NaN


def sleep(seconds) -> None:
    value = _sleep_seconds(seconds)
    if value is None:
        # the learner's own error, raised in the learner's process as without the harness (ValueError for NaN,
        # OverflowError, TypeError); reported to the harness's clock, it read as a malformed call of the channel
        _real_sleep(seconds)
        return
    advance(value)
    _real_sleep(min(value, _REAL_PAUSE))


def monotonic() -> float:
    return _real_monotonic() + _offset


def monotonic_ns() -> int:
    return _real_monotonic_ns() + int(_offset * 1e9)


def perf_counter() -> float:
    return _real_perf_counter() + _offset


def perf_counter_ns() -> int:
    return _real_perf_counter_ns() + int(_offset * 1e9)


def _event_wait(self, timeout=None):
    # `stop.wait(backoff)` is a common way to sleep interruptibly: treat a timeout as a virtual sleep.
    if timeout is None or _real_event_wait(self, 0):
        return _real_event_wait(self, timeout)
    negative = isinstance(timeout, (int, float)) and timeout < 0     # no wait, as threading takes it
    seconds = 0.0 if negative else _sleep_seconds(timeout)
    if seconds is None:     # not a number, NaN, too long: as the real wait takes it (it raises, or waits)
        return _real_event_wait(self, timeout)
    sleep(seconds)
    return _real_event_wait(self, 0)


async def _asyncio_sleep(delay, result=None):
    seconds = _sleep_seconds(delay)
    if seconds is None:
        # not a number (text too: asyncio compares it with 0 and raises), NaN, infinite, longer than any clock, or
        # negative: asyncio's own sleep raises, waits for ever or returns at once, as it would without the harness
        return await _real_asyncio_sleep(delay, result)
    advance(seconds)
    # the real pause time.sleep makes too: a loop of virtual sleeps beside other work (a heartbeat task) yielded for no
    # real time, spinning a CPU and moving the run's clock five times as fast as a thread's loop did (a consumer with
    # such a task was charged 380-520 s of its own waiting between two messages on a busy machine)
    return await _real_asyncio_sleep(min(seconds, _REAL_PAUSE), result)


_real_asyncio_sleep = None


def _patch_asyncio(module) -> None:
    global _real_asyncio_sleep
    _real_asyncio_sleep = module.sleep
    module.sleep = _asyncio_sleep
    if "asyncio.tasks" in sys.modules:
        sys.modules["asyncio.tasks"].sleep = _asyncio_sleep


def _import_time_machine():
    # time-machine imports pytest (and dateutil) only for its own test fixtures when they are
    # installed; that is most of its import time in every learner process. Hide them while it loads.
    hidden = [name for name in ("pytest", "dateutil", "dateutil.parser") if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None
    try:
        import time_machine
    finally:
        for name in hidden:
            sys.modules.pop(name, None)
    return time_machine


def preload() -> None:
    """Import what install() needs, ahead of any run (the warm learner template: about 40 ms of every warm run
    went to importing time-machine, with unittest and zoneinfo, in the forked script process)."""
    import importlib
    _import_time_machine()
    importlib.import_module("retrylab.learner_site.import_hooks")


OFFSET_VARIABLE = "RETRYLAB_CLOCK_OFFSET"


def _starting_offset() -> float:
    """The run's offset when it began, as the harness set it (0 when absent or unreadable)."""
    try:
        value = float(os.environ.get(OFFSET_VARIABLE) or 0.0)
    except ValueError:
        return 0.0
    return value if math.isfinite(value) and 0.0 <= value < 1e9 else 0.0


def install() -> None:
    global _traveller, _offset
    time_machine = _import_time_machine()

    _offset = _starting_offset()
    _traveller = time_machine.travel(time.time() + _offset, tick=True).start()
    # time-machine starts ticking at the first read of the time, not at start(): read it now. Else the process's
    # clock stays behind the run's by all its start-up before that read (imports, a client's set-up), which is
    # seconds on a busy machine: a retry due one interval after a failure then came seconds early on the run's clock
    time.time()
    time.sleep = sleep
    time.monotonic, time.monotonic_ns = monotonic, monotonic_ns
    time.perf_counter, time.perf_counter_ns = perf_counter, perf_counter_ns
    threading.Event.wait = _event_wait
    appstub.on_offset = _follow
    from retrylab.learner_site.import_hooks import after_import
    after_import("asyncio", _patch_asyncio)
