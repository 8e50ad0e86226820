"""The learner's virtual clock (retrylab.learner_site.virtual_clock) reads the run's time from its first moment."""
import json
import os
import subprocess
import sys

OFFSET = 1000.0
START_UP = 0.5      # real seconds a learner process spends before its first read of the time (imports, a client)


def run_learner_python(code: str, **env: str) -> str:
    """Run `code` in a new interpreter, outside any harness run (no RETRYLAB_ variable but `env`); its output."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RETRYLAB_")}, **env}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout

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
    out = run_learner_python(_PROCESS, RETRYLAB_CLOCK_OFFSET=str(OFFSET))
    ahead = float(out)
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
    out = run_learner_python(_REFUSED)
    refused, counted, awaited = out.splitlines()
    assert refused.split() == ["ValueError", "OverflowError", "OverflowError", "OverflowError", "ValueError",
                               "TypeError", "TypeError", "TypeError", "TypeError", "TypeError", "[]"], refused
    assert counted == "[100.0]" and awaited == "[100.0, 2.5]", out


_HEARTBEAT = """
import asyncio, json, time
from retrylab.learner_site import virtual_clock
virtual_clock.install()
real = virtual_clock._real_monotonic

async def heartbeat():
    while True:
        await asyncio.sleep(5)

async def main():
    seen = {}
    began, cpu = real(), time.process_time()
    beat = asyncio.create_task(heartbeat())
    # half a real second beside it (in a thread: the loop's timers follow the clock the heartbeat moves)
    await asyncio.get_running_loop().run_in_executor(None, virtual_clock._real_sleep, 0.5)
    beat.cancel()
    seen["cpu share"] = (time.process_time() - cpu) / (real() - began)
    began = real()
    for _ in range(500):
        await asyncio.sleep(0)                      # a bare yield, as asyncio's own
    seen["500 yields"] = real() - began
    try:
        await asyncio.wait_for(asyncio.sleep(10), 5)
        seen["sleep past its timeout"] = "done"
    except TimeoutError:
        seen["sleep past its timeout"] = "timeout"
    print(json.dumps(seen))

asyncio.run(main())
"""


def test_a_loop_of_virtual_asyncio_sleeps_pauses_for_real_as_time_sleep_does():
    # a heartbeat task's virtual sleeps yielded for no real time: it spun a CPU and moved the clock about five times
    # as fast as a thread's time.sleep loop (which pauses 1 ms a call), and on a busy machine a retry-topics step
    # charged those seconds to the consumer beside it
    out = run_learner_python(_HEARTBEAT)
    seen = json.loads(out)
    assert seen["cpu share"] < 0.5, seen                 # about 0.06 paused; 1.0 spinning
    assert seen["500 yields"] < 0.4, seen                # sleep(0) pauses not: 500 pauses would be 0.55 s
    assert seen["sleep past its timeout"] == "timeout", seen     # as asyncio's own: the sleep outlasts the timeout
