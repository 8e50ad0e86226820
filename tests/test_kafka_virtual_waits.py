"""Waiting in a poll on the run's virtual clock (harness/brokers/kafka/redirect.py): a consumer that pauses its
partitions and polls until a record is due (a retry consumer waiting ten minutes) waits in virtual time, with
confluent-kafka, kafka-python and aiokafka alike; a consumer that pauses nothing gains no time from its idle
polls, nor from its client's own heartbeats and backoffs; on a run on real time the polls really wait."""
from __future__ import annotations

import json
import time

import pytest

import test_kafka_broker
from retrylab.appchannel import RunClock
from test_kafka_broker import _run

backend = test_kafka_broker.backend     # its fixture: a Tansu backend for the module's tests

WAIT = 600.0        # seconds the learner's script waits, by its own time.time(): ten minutes

# Each script consumes record A, pauses the partition (or not: PAUSE), polls with a timeout of POLL seconds
# until its time.time() has passed WAIT seconds on (or MAX_POLLS polls were made), counting the records
# those polls returned, then resumes and consumes record B. It prints what it saw.
PAUSE_AND_POLL = {
    "confluent": """
from confluent_kafka import Consumer
c = Consumer({'bootstrap.servers': 'localhost:9092', 'group.id': 'retry', 'auto.offset.reset': 'earliest',
              'enable.auto.commit': False})
c.subscribe(['callbacks.retry'])
def records(timeout):
    if CONSUME:
        return [m for m in c.consume(5, timeout) if not m.error()]
    m = c.poll(timeout)
    return [m] if m is not None and not m.error() else []
got = []
while not got:
    got += [m.value().decode() for m in records(1.0)]
parts = c.assignment()
if PAUSE:
    c.pause(parts)
began, polls, during = time.time(), 0, 0
while time.time() < began + WAIT and polls < MAX_POLLS:
    new = records(POLL)
    polls, during, got = polls + 1, during + len(new), got + [m.value().decode() for m in new]
if PAUSE:
    c.resume(parts)
while len(got) < 2:
    got += [m.value().decode() for m in records(1.0)]
c.close()
""",
    "kafka-python": """
from kafka import KafkaConsumer
c = KafkaConsumer('callbacks.retry', bootstrap_servers='localhost:9092', group_id='retry',
                  auto_offset_reset='earliest', enable_auto_commit=False)
def records(timeout):
    return [r.value.decode() for rs in c.poll(timeout_ms=int(timeout * 1000), max_records=1).values() for r in rs]
got = []
while not got:
    got += records(1.0)
parts = c.assignment()
if PAUSE:
    c.pause(*parts)
began, polls, during = time.time(), 0, 0
while time.time() < began + WAIT and polls < MAX_POLLS:
    new = records(POLL)
    polls, during, got = polls + 1, during + len(new), got + new
if PAUSE:
    c.resume(*parts)
while len(got) < 2:
    got += records(1.0)
c.close()
""",
    "aiokafka": """
import asyncio
from aiokafka import AIOKafkaConsumer
async def main():
    global began, polls, during, got
    c = AIOKafkaConsumer('callbacks.retry', bootstrap_servers='localhost:9092', group_id='retry',
                         auto_offset_reset='earliest', enable_auto_commit=False)
    await c.start()
    async def records(timeout):
        batches = await c.getmany(timeout_ms=int(timeout * 1000), max_records=1)
        return [r.value.decode() for rs in batches.values() for r in rs]
    got = []
    while not got:
        got += await records(1.0)
    parts = c.assignment()
    if PAUSE:
        c.pause(*parts)
    began, polls, during = time.time(), 0, 0
    while time.time() < began + WAIT and polls < MAX_POLLS:
        new = await records(POLL)
        polls, during, got = polls + 1, during + len(new), got + new
    if PAUSE:
        c.resume(*parts)
    while len(got) < 2:
        got += await records(1.0)
    await c.stop()
asyncio.run(main())
""",
}
SAY = "\nprint(json.dumps({'got': got, 'polls': polls, 'during': during, 'waited': time.time() - began}))\n"

CLIENTS = ("confluent", "kafka-python", "aiokafka")


def _pause_and_poll(tmp_path, endpoint, client: str, run_clock: RunClock, timeout: float, consume: bool = False,
                    **constants):
    endpoint.create_topics({"callbacks.retry": 1})
    endpoint.produce("callbacks.retry", [(b"order-1", b"A"), (b"order-1", b"B")])
    constants = {"CONSUME": consume, "WAIT": WAIT, **constants}
    code = "import json, time\n" + "".join(f"{k} = {v!r}\n" for k, v in constants.items())
    began, started = run_clock.offset, time.monotonic()
    run = _run(tmp_path, endpoint, code + PAUSE_AND_POLL[client] + SAY, timeout=timeout, run_clock=run_clock)
    took = time.monotonic() - started
    assert run.result.returncode == 0, run.result.stderr
    return json.loads(run.result.stdout), run_clock.offset - began, took


@pytest.mark.parametrize("client, consume", [(c, False) for c in CLIENTS] + [("confluent", True)],
                         ids=list(CLIENTS) + ["confluent-consume"])
def test_a_paused_consumer_polls_ten_minutes_away_in_virtual_time(tmp_path, backend, client, consume):
    with backend.private() as endpoint:
        seen, advanced, took = _pause_and_poll(tmp_path, endpoint, client, RunClock.for_learner_run(), timeout=120,
                                               consume=consume, PAUSE=True, POLL=1.0, MAX_POLLS=10**6)
    # done within the run's 120 real seconds: of the ten minutes its polls waited, what real time did
    # not cover was the run's clock's
    assert seen["waited"] >= WAIT and advanced >= WAIT - took
    # each empty poll moved the clock on by its timeout (1 s), no more: the polls came one a second
    assert advanced - 0.5 <= seen["polls"] <= WAIT + 1
    # none of them returned the paused record; it came once resumed
    assert seen["during"] == 0 and seen["got"] == ["A", "B"]


@pytest.mark.parametrize("client", CLIENTS)
def test_idle_polls_of_a_consumer_that_pauses_nothing_do_not_move_the_clock(tmp_path, backend, client):
    """Nor do the client's own heartbeats and backoffs meanwhile (aiokafka's heartbeat task sleeps its
    interval in a loop: on the virtual clock it moved the run's clock about 2 s per heartbeat)."""
    with backend.private() as endpoint:
        seen, advanced, _ = _pause_and_poll(tmp_path, endpoint, client, RunClock.for_learner_run(), timeout=120,
                                            PAUSE=False, POLL=0.2, MAX_POLLS=20)
    assert seen["polls"] == 20 and seen["during"] == 1 and seen["got"] == ["A", "B"]   # B came unpaused
    assert advanced < 1.0, advanced


@pytest.mark.parametrize("client", CLIENTS)
def test_on_a_run_on_real_time_a_paused_consumers_polls_really_wait(tmp_path, backend, client):
    run_clock = RunClock.real()
    with backend.private() as endpoint:
        seen, advanced, _ = _pause_and_poll(tmp_path, endpoint, client, run_clock, timeout=120,
                                            PAUSE=True, POLL=0.5, MAX_POLLS=4)
    assert advanced == 0 and run_clock.offset == 0
    assert seen["polls"] == 4 and seen["during"] == 0 and seen["got"] == ["A", "B"]
    assert seen["waited"] >= 4 * 0.5        # real seconds, as the polls' timeouts said


# The consumer is assigned partitions 0 (record A) and 1 (record C), pauses 0 and polls once with a timeout
# of an hour: C ends that poll, well before the hour has passed on the run's clock; then it resumes 0.
ONE_LONG_POLL = {
    "confluent": """
from confluent_kafka import Consumer, TopicPartition
c = Consumer({'bootstrap.servers': 'localhost:9092', 'group.id': 'retry', 'auto.offset.reset': 'earliest'})
c.assign([TopicPartition('callbacks.retry', 0), TopicPartition('callbacks.retry', 1)])
c.pause([TopicPartition('callbacks.retry', 0)])
began = time.time()
m = c.poll(3600)
waited, first = time.time() - began, m.value().decode()
c.resume([TopicPartition('callbacks.retry', 0)])
m = None
while m is None or m.error():
    m = c.poll(1.0)
then = m.value().decode()
c.close()
""",
    "kafka-python": """
from kafka import KafkaConsumer, TopicPartition
c = KafkaConsumer(bootstrap_servers='localhost:9092', group_id='retry', auto_offset_reset='earliest')
c.assign([TopicPartition('callbacks.retry', 0), TopicPartition('callbacks.retry', 1)])
c.pause(TopicPartition('callbacks.retry', 0))
began = time.time()
(first,) = [r.value.decode() for rs in c.poll(timeout_ms=3_600_000).values() for r in rs]
waited = time.time() - began
c.resume(TopicPartition('callbacks.retry', 0))
then = []
while not then:
    then = [r.value.decode() for rs in c.poll(timeout_ms=1000).values() for r in rs]
(then,) = then
c.close()
""",
    "aiokafka": """
import asyncio
from aiokafka import AIOKafkaConsumer, TopicPartition
async def main():
    global began, waited, first, then
    c = AIOKafkaConsumer(bootstrap_servers='localhost:9092', group_id='retry', auto_offset_reset='earliest')
    await c.start()
    c.assign([TopicPartition('callbacks.retry', 0), TopicPartition('callbacks.retry', 1)])
    c.pause(TopicPartition('callbacks.retry', 0))
    began = time.time()
    (first,) = [r.value.decode() for rs in (await c.getmany(timeout_ms=3_600_000)).values() for r in rs]
    waited = time.time() - began
    c.resume(TopicPartition('callbacks.retry', 0))
    then = []
    while not then:
        then = [r.value.decode() for rs in (await c.getmany(timeout_ms=1000)).values() for r in rs]
    (then,) = then
    await c.stop()
asyncio.run(main())
""",
}


@pytest.mark.parametrize("client", CLIENTS)
def test_a_record_on_a_partition_not_paused_ends_the_virtual_wait(tmp_path, backend, client):
    run_clock = RunClock.for_learner_run()
    began = run_clock.offset
    with backend.private() as endpoint:
        endpoint.create_topics({"callbacks.retry": 2})
        endpoint.produce("callbacks.retry", [(b"order-1", b"A")], partition=0)
        endpoint.produce("callbacks.retry", [(b"order-2", b"C")], partition=1)
        code = ("import json, time\n" + ONE_LONG_POLL[client]
                + "print(json.dumps({'first': first, 'then': then, 'waited': waited}))\n")
        run = _run(tmp_path, endpoint, code, timeout=120, run_clock=run_clock)
    assert run.result.returncode == 0, run.result.stderr
    seen = json.loads(run.result.stdout)
    assert (seen["first"], seen["then"]) == ("C", "A")
    # the poll ended with C, not with its hour: the clock moved on only while it had nothing to return
    assert seen["waited"] < 3600 and run_clock.offset - began < 3600


HEARTBEAT_BESIDE_CLIENTS = """
import asyncio, json
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

async def heartbeat():          # the learner's own: virtual sleeps, moving the event loop's clock on at once
    while True:
        await asyncio.sleep(5)

async def main():
    beat = asyncio.create_task(heartbeat())
    admin = AIOKafkaAdminClient(bootstrap_servers="localhost:9092")
    await admin.start()
    await admin.create_topics([NewTopic("callbacks", num_partitions=1, replication_factor=1)])
    producer = AIOKafkaProducer(bootstrap_servers="localhost:9092")
    await producer.start()
    for n in range(3):
        await producer.send_and_wait("callbacks", str(n).encode())
    consumer = AIOKafkaConsumer("callbacks", bootstrap_servers="localhost:9092", group_id="g",
                                auto_offset_reset="earliest")
    await consumer.start()
    got = []
    while len(got) < 3:
        batches = await consumer.getmany(timeout_ms=1000)
        got += [r.value.decode() for rs in batches.values() for r in rs]
    topics = sorted(await admin.list_topics())
    for client in (consumer, producer, admin):
        await client.close() if client is admin else await client.stop()
    beat.cancel()
    print(json.dumps({"got": got, "topics": topics}))

asyncio.run(main())
"""


def test_aiokafka_clients_work_beside_a_learner_task_that_moves_the_clock(tmp_path, backend):
    # a heartbeat task of the learner's moved the loop's clock past every request timeout of aiokafka (async_timeout,
    # asyncio.wait on the loop's clock): the consumer never fetched a record; the admin client's modules, imported
    # apart from aiokafka's, got the clients' real-time waits only when imported
    run_clock = RunClock.for_learner_run()
    began = run_clock.offset
    with backend.private() as endpoint:
        run = _run(tmp_path, endpoint, HEARTBEAT_BESIDE_CLIENTS, timeout=90, run_clock=run_clock)
    assert run.result.returncode == 0, run.result.stderr
    seen = json.loads(run.result.stdout)
    assert seen["got"] == ["0", "1", "2"] and "callbacks" in seen["topics"], seen
    assert run_clock.offset - began > 3600      # the heartbeat's sleeps stayed virtual: the clock moved on
