"""The learner's virtual clock (retrylab.learner_site.virtual_clock) reads the run's time from its first moment."""
import json
import os
import subprocess
import sys

OFFSET = 1000.0
START_UP = 0.5      # real seconds a learner process spends before its first read of the time (imports, a client)

_PROCESS = f"""
import time
from time_machine import escape_hatch
from retrylab.learner_site import virtual_clock
virtual_clock.install()
virtual_clock._real_sleep({START_UP})
print(time.time() - escape_hatch.time.time())
"""


def test_the_clock_ticks_from_install_not_from_the_first_read():
    # time-machine starts ticking at the first read of the time: a process whose start-up ran before that read was
    # behind the run's clock by its start-up (seconds on a busy machine: a retry due after an interval came early)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRYLAB_")}
    env["RETRYLAB_CLOCK_OFFSET"] = str(OFFSET)
    out = subprocess.run([sys.executable, "-c", _PROCESS], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    ahead = float(out.stdout)
    assert abs(ahead - OFFSET) < START_UP / 2, f"the process's clock is {OFFSET - ahead:.3f} s behind the run's"


_REFUSED = """
import asyncio, fractions, threading, time
from retrylab.learner_site import appstub, virtual_clock
virtual_clock.install()
reported = []                           # what would reach the harness's clock: only sleeps time.sleep takes
appstub.available = lambda: True
appstub.request = lambda message: reported.append(message["seconds"])

class Count:
    def __index__(self):
        return 100

said = []
for value in (float("nan"), float("inf"), 1e300, 2 ** 63, -1, "1", None, fractions.Fraction(1, 2)):
    try:
        time.sleep(value)
        said.append("slept")
    except Exception as exc:
        said.append(type(exc).__name__)
for value in ("1", b"2"):               # text: threading's own wait raises too
    try:
        threading.Event().wait(value)
        said.append("waited")
    except Exception as exc:
        said.append(type(exc).__name__)
print(*said, reported)
time.sleep(Count())                     # an integer of another type, as time.sleep takes it
print(reported)

async def main():
    for value in (float("nan"), float("inf")):
        try:
            await asyncio.wait_for(asyncio.sleep(value), 0.2)   # asyncio's own: waits for ever
        except TimeoutError:
            pass
    for value in ("600", b"2"):         # asyncio compares the delay with 0: text raises
        try:
            await asyncio.sleep(value)
        except TypeError:
            pass
    await asyncio.sleep(-1)
    await asyncio.sleep(2.5)
asyncio.run(main())
print(reported)
"""


def test_a_sleep_time_sleep_refuses_fails_in_the_learners_process_as_without_the_harness():
    # time.sleep(nan) was reported to the harness's clock first: the learner read "a sleep reported without a number
    # of seconds ... the application module's connection is not the worker's to use" instead of its own ValueError
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRYLAB_")}
    out = subprocess.run([sys.executable, "-c", _REFUSED], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    refused, counted, awaited = out.stdout.splitlines()
    assert refused.split() == ["ValueError", "OverflowError", "OverflowError", "OverflowError", "ValueError",
                               "TypeError", "TypeError", "TypeError", "TypeError", "TypeError", "[]"], refused
    assert counted == "[100.0]" and awaited == "[100.0, 2.5]", out.stdout


_EVENT_WAIT_FOR = """
import asyncio, json, time
from retrylab.learner_site import virtual_clock
virtual_clock.install()
real = virtual_clock._real_monotonic
seen = {}

async def timed(name, awaitable):
    began, offset = real(), virtual_clock.offset()
    try:
        seen[name] = [await awaitable]
    except TimeoutError:
        seen[name] = ["timeout"]
    seen[name] += [round(real() - began, 2), virtual_clock.offset() - offset]

async def main():
    stop = asyncio.Event()
    await timed("unset", asyncio.wait_for(stop.wait(), timeout=600))
    asyncio.get_running_loop().call_soon(stop.set)          # set by a callback ready to run now
    await timed("set meanwhile", asyncio.wait_for(stop.wait(), timeout=600))
    await timed("set before", asyncio.wait_for(stop.wait(), timeout=600))
    never = asyncio.get_running_loop().create_future()      # any other wait is asyncio's own: real time
    await timed("a future", asyncio.wait_for(never, timeout=0.3))
    await timed("no timeout", asyncio.wait_for(stop.wait(), timeout=None))

asyncio.run(main())
print(json.dumps(seen))
"""


def test_waiting_for_an_asyncio_event_with_a_timeout_is_a_virtual_sleep():
    # `await asyncio.wait_for(stop.wait(), timeout=wait)`, asyncio's interruptible sleep, waited the real 600 s (a
    # retry consumer failed steps 4-7 of retry-topics), where threading's `stop.wait(wait)` is a virtual sleep
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRYLAB_")}
    out = subprocess.run([sys.executable, "-c", _EVENT_WAIT_FOR], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["unset"][0] == "timeout" and seen["unset"][1] < 1 and seen["unset"][2] == 600, seen
    assert seen["set meanwhile"][0] is True and seen["set meanwhile"][2] == 600, seen
    assert seen["set before"] == [True, seen["set before"][1], 0] and seen["set before"][1] < 1, seen
    assert seen["a future"][0] == "timeout" and seen["a future"][1] >= 0.29 and seen["a future"][2] == 0, seen
    assert seen["no timeout"][0] is True and seen["no timeout"][2] == 0, seen
