"""A client library's own asyncio waits last real time beside a learner task that moves the virtual clock
(retrylab.learner_site.client_waits), while the learner's own waits stay virtual."""
import json

from test_virtual_clock import run_learner_python

_PROCESS = """
import asyncio, json, sys, time, types
import async_timeout
from retrylab.learner_site import client_waits, virtual_clock
virtual_clock.install()
library = types.ModuleType("library")   # a client library's module, as it sees the standard library
library.asyncio, library.async_timeout, library.time = asyncio, async_timeout, time
sys.modules["library"] = library
client_waits.real_waits("library")
client = library.asyncio
real = virtual_clock._real_monotonic
seen = {}

async def heartbeat():          # a learner's ordinary liveness loop: virtual sleeps, moving the loop's clock on
    while True:
        await asyncio.sleep(5)

async def answer_after(future, seconds):
    await client.sleep(seconds)
    if not future.done():       # asyncio's own wait_for, timed out, cancelled it
        future.set_result("answer")

async def timed(name, awaitable):
    began = real()
    try:
        seen[name] = [await awaitable]
    except TimeoutError:
        seen[name] = ["timeout"]
    seen[name].append(round(real() - began, 2))

async def expiring(client):
    async with client.timeout(0.3):
        await client.sleep(5)
    return "not expired"

async def main():
    beat = asyncio.create_task(heartbeat())
    loop = asyncio.get_running_loop()
    for name, wait_for in (("asyncio", asyncio.wait_for), ("client", client.wait_for)):
        future = loop.create_future()
        asyncio.create_task(answer_after(future, 0.2))
        await timed(name + " answered", wait_for(future, 1.0))
    await timed("client never answered", client.wait_for(loop.create_future(), 0.3))
    await timed("client sleep", client.sleep(0.3, "slept"))
    await timed("client no time left", client.wait_for(loop.create_future(), 0))
    await timed("client no timeout", client.wait_for(asyncio.sleep(60, "virtual"), None))
    await timed("client by keyword", client.wait_for(fut=asyncio.sleep(0, "keywords"), timeout=1.0))
    for name, timeout in (("asyncio", asyncio.timeout), ("client", client.timeout),
                          ("async_timeout", library.async_timeout.timeout)):
        async def under_timeout():
            async with timeout(0.3):
                await client.sleep(0.1)
                return "in time"
        await timed(name + " timeout", under_timeout())
    await timed("client timeout expires", expiring(client))
    future = loop.create_future()
    asyncio.create_task(answer_after(future, 0.2))
    await timed("client wait", client.wait([future], timeout=1.0, return_when=asyncio.FIRST_COMPLETED))
    seen["client wait"][0] = [len(part) for part in seen["client wait"][0]]
    await timed("client wait, none done", client.wait([loop.create_future()], timeout=0.3))
    seen["client wait, none done"][0] = [len(part) for part in seen["client wait, none done"][0]]
    seen["real monotonic"] = abs(library.time.monotonic() - real()) < 1

    inner = loop.create_future()
    waiting = asyncio.create_task(client.wait_for(inner, 30))
    await client.sleep(0.05)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    seen["cancelled with its waiter"] = inner.cancelled()
    beat.cancel()
    seen["virtual seconds"] = virtual_clock.offset()

asyncio.run(main())
print(json.dumps(seen))
"""


def test_a_clients_waits_last_real_time_beside_a_learner_task_that_moves_the_clock():
    seen = json.loads(run_learner_python(_PROCESS))
    # the race itself: the loop's clock, moved on by the heartbeat, ends asyncio's own wait_for at once
    assert seen["asyncio answered"][0] == "timeout" and seen["asyncio answered"][1] < 0.2, seen
    answer, took = seen["client answered"]
    assert answer == "answer" and 0.15 <= took < 1.0, seen
    assert seen["client never answered"][0] == "timeout" and seen["client never answered"][1] >= 0.29, seen
    assert seen["client sleep"][0] == "slept" and seen["client sleep"][1] >= 0.29, seen
    assert seen["client no time left"][0] == "timeout", seen
    # the learner's own sleep inside a client's wait with no timeout stays virtual: no real minute passes
    assert seen["client no timeout"][0] == "virtual" and seen["client no timeout"][1] < 5, seen
    # a timeout of 0.3 s around 0.1 s of real work: the loop's own expires at once, the client's do not
    assert seen["asyncio timeout"][0] == "timeout", seen
    assert seen["client timeout"][0] == seen["async_timeout timeout"][0] == "in time", seen
    assert seen["client timeout expires"][0] == "timeout" and seen["client timeout expires"][1] >= 0.29, seen
    assert seen["client wait"][0] == [1, 0] and 0.15 <= seen["client wait"][1] < 1.0, seen
    assert seen["client wait, none done"][0] == [0, 1] and seen["client wait, none done"][1] >= 0.29, seen
    assert seen["real monotonic"] is True
    assert seen["client by keyword"][0] == "keywords", seen
    assert seen["cancelled with its waiter"] is True
    assert seen["virtual seconds"] > 60, seen
