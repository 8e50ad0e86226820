"""A client library's own asyncio waits last real time beside a learner task that moves the virtual clock
(retrylab.learner_site.client_waits), while the learner's own waits stay virtual."""
import json
import os
import subprocess
import sys

_PROCESS = """
import asyncio, json, time
from retrylab.learner_site import client_waits, virtual_clock
virtual_clock.install()
client = client_waits.real_time_asyncio(asyncio, virtual_clock)    # asyncio as a client library's modules see it
real = virtual_clock._real_monotonic
seen = {}

async def heartbeat():          # a learner's ordinary liveness loop: virtual sleeps, moving the loop's clock on
    while True:
        await asyncio.sleep(5)

async def answer_after(future, seconds):
    await client.sleep(seconds)
    future.set_result("answer")

async def timed(name, awaitable):
    began = real()
    try:
        seen[name] = [await awaitable]
    except TimeoutError:
        seen[name] = ["timeout"]
    seen[name].append(round(real() - began, 2))

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
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRYLAB_")}
    out = subprocess.run([sys.executable, "-c", _PROCESS], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    # the race itself: the loop's clock, moved on by the heartbeat, ends asyncio's own wait_for at once
    assert seen["asyncio answered"][0] == "timeout" and seen["asyncio answered"][1] < 0.2, seen
    answer, took = seen["client answered"]
    assert answer == "answer" and 0.15 <= took < 1.0, seen
    assert seen["client never answered"][0] == "timeout" and seen["client never answered"][1] >= 0.29, seen
    assert seen["client sleep"][0] == "slept" and seen["client sleep"][1] >= 0.29, seen
    assert seen["client no time left"][0] == "timeout", seen
    # the learner's own sleep inside a client's wait with no timeout stays virtual: no real minute passes
    assert seen["client no timeout"][0] == "virtual" and seen["client no timeout"][1] < 5, seen
    assert seen["cancelled with its waiter"] is True
    assert seen["virtual seconds"] > 60, seen
