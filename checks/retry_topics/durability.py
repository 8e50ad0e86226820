"""What step 7's run (run_durable.py) shows about a kill: the attempts of each callback across the restart,
and whether each record was handed on (its retry or DLQ record stored) before its offset was committed.

Calls are counted per order across both halves (one NotifierApp). A hung call is an attempt that never
ended: the retry it was must be made again after the restart, so it adds one to the order's calls.
"""
from __future__ import annotations

from dataclasses import dataclass

from retrylab.checks.retry_topics import lab, records

EARLY_TOLERANCE = 1.0   # seconds of virtual time: nextRetryTime is in whole milliseconds


@dataclass(frozen=True)
class Attempt:
    t: float            # virtual time of the call
    script: str
    outcome: str        # "ok", "error", or "hung"
    after_kill: bool


def attempts(run) -> dict[str, list[Attempt]]:
    """order id -> its calls in the order they were made, over both halves."""
    hung = set(run.hung)
    found: dict[str, list[Attempt]] = {}
    for half, after in ((run.first, False), (run.second, True)):
        if half is None:
            continue
        for script, script_run in half.runs.items():
            for call in script_run.calls:
                found.setdefault(call.id, []).append(Attempt(call.t, script, call.outcome, after))
    for order, calls in found.items():
        calls.sort(key=lambda a: a.t)
        for number, attempt in enumerate(calls, 1):
            if (order, number) in hung:
                calls[number - 1] = Attempt(attempt.t, attempt.script, "hung", attempt.after_kill)
    return found


def expected_calls(run, order: str) -> int:
    return lab.EXPECTED_CALLS[run.merchant(order)] + sum(1 for o, _ in run.hung if o == order)


# -- the retry fields of a record (records.py reads every shape LAB.md accepts) ---------------------------

def lab_record(run, record) -> records.LabRecord:
    """`record` with its retry fields read (its retry_times, next_retry_time and due)."""
    return records.recognise(record, list(run.published))


def retry_records(state, order: str, on: str = lab.RETRY_TOPIC) -> list:
    """The records of `order` on callbacks.retry (or topic `on`), keyed by its order id, in offset order per
    partition."""
    return [r for (topic, _), records in sorted(state.records.items()) if topic == on
            for r in records if r.key == order.encode()]


def due(run, order: str, failures: int) -> float | None:
    """nextRetryTime (epoch seconds) of the order's retry record with retryTimes = `failures`."""
    read = [lab_record(run, r) for r in retry_records(run.state, order)]
    times = [r.due for r in read if r.retry_times == failures and r.due is not None]  # no time: nothing to be early for
    return min(times) if times else None


def early_retries(run) -> list[tuple[str, float, float]]:
    """(order, call time, due) of each call after the restart made before the retry it was was due."""
    found = []
    for order, calls in attempts(run).items():
        failures = 0
        for attempt in calls:
            if attempt.after_kill and failures:
                when = due(run, order, failures)
                if when is not None and attempt.t < when - EARLY_TOLERANCE:
                    found.append((order, attempt.t, when))
            failures += attempt.outcome == "error"
    return found


# -- handed on before committed ----------------------------------------------------------------------

@dataclass(frozen=True)
class EarlyCommit:
    script: str
    order: str
    topic: str          # where the committed record was
    partition: int
    offset: int
    stored_to: str      # where its retry or DLQ record went, after that commit


def _produced_offsets(request):
    """(topic, partition, offset) of every record a Produce request stored, from the broker's answer."""
    for batch in request.produced:
        ack = next((a for a in request.acked if a.topic == batch.topic and a.partition == batch.partition
                    and a.error == 0), None)
        if ack is not None and batch.records > 0:
            for i in range(batch.records):
                yield batch.topic, batch.partition, ack.base_offset + i


def _source(run, script: str, record) -> tuple[str, int, int] | None:
    """The record `record` (a retry or DLQ record) was made from: the callback for consumer.py, the retry
    record one attempt earlier for retry_consumer.py."""
    order = (record.key or b"").decode("utf-8", "replace")
    if script == lab.MAIN_SCRIPT:
        where = run.landed.get(order)
        return (lab.TOPIC, *where) if where else None
    failures = lab_record(run, record).retry_times
    earlier = [r for r in retry_records(run.state, order)
               if failures is not None and lab_record(run, r).retry_times == failures - 1]
    return (lab.RETRY_TOPIC, earlier[0].partition, earlier[0].offset) if earlier else None


def commits_before_handing_on(run) -> list[EarlyCommit]:
    """Records whose offset the script committed before the retry (or DLQ) record made from them was
    stored: a kill between the two loses the message. Judged per run of a script on what its relay saw, in
    the order it saw it (the producer's and the consumer's connections alike)."""
    records = {(r.topic, r.partition, r.offset): r for rs in run.state.records.values() for r in rs}
    found = []
    for half in (run.first, run.second):
        if half is None:
            continue
        for script, script_run in half.runs.items():
            commits = [(request.seq, c) for request in script_run.commands for c in request.commits]
            for request in script_run.commands:
                for topic, partition, offset in _produced_offsets(request):
                    record = records.get((topic, partition, offset))
                    if record is None or topic not in (lab.RETRY_TOPIC, lab.DLQ_TOPIC):
                        continue
                    source = _source(run, script, record)
                    if source is None:
                        continue
                    early = next((c for seq, c in commits if seq < request.seq and c.topic == source[0]
                                  and c.partition == source[1] and c.offset > source[2]), None)
                    if early is not None:
                        found.append(EarlyCommit(script, record.key.decode("utf-8", "replace"), *source, topic))
    return found
