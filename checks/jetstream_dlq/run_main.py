"""Steps 3-7's run: the learner's setup.py, then worker.py and dlq_service.py side by side, on a private
nats-server where the harness made stream EVENTS and published good-1, poison, good-2 and corrupt.

Beside the learner's scripts, the harness listens to every consumer advisory itself (what the server
published, when), and once the poison's MAX_DELIVERIES advisory has been seen and a dead letter is stored
(or DEAD_LETTER_WAIT has passed), it publishes the very same advisory again, once, while the learner's
listener still runs: a service without a Nats-Msg-Id then stores a second copy (step 5).

The worker run ends (real time: the server's redelivery waits are real) when
- its work is done: the goods processed, the advisory re-sent RESEND_SETTLE ago, the consumer with nothing
  pending or unacknowledged (the reference: about 3.5 s of worker, 4.5 s for the whole run);
- nothing changed for QUIET seconds (process calls, the server's streams and consumers, advisories) while
  the worker was idle: not while a thread of it waits for a CPU (a busy machine), nor before a redelivery it
  asked for with nak(delay=d) is due. With the consumer clean, it is done (DONE_IDLE); with messages still
  pending or unacknowledged it stopped pulling or waits for what never comes (CAP, said so);
- one message was delivered more than RETRIES_FOREVER times (a consumer without MaxDeliver), or processed
  more than CALLS_FOREVER times (a worker retrying in its own loop): CAP;
- it spins without progress (no_progress), it exits, or at RUN_TIMEOUT.
Then the DLQ service is stopped and the server read.
"""
from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest

from retrylab.checks.jetstream_dlq import deliveries, lab, server
from retrylab.background import Beside, without_step_clock
from retrylab.checks.jetstream_dlq.catalog import tr
from retrylab.checks.jetstream_dlq.run_setup import publish_after_setup, run_setup_script
from retrylab.checks.jetstream_dlq.runs import RUNS
from retrylab.fixtures.jetstream_dlq import events
from retrylab.fixtures.jetstream_dlq.taskproc_app import TaskprocApp
from retrylab.runner import ScriptRun
from retrylab.settle import Reason, no_progress, when

SERVICE_HEAD_START = 2.0    # real seconds the worker waits for dlq_service.py's first subscription or publish
RUN_TIMEOUT = 12.0          # real seconds: the reference's worker needs about 3.5 (BackOff 0.5 + 1 + 1 s, the re-send)
DEAD_LETTER_WAIT = 2.0      # real seconds after the advisory before the harness re-sends it anyway
RESEND_SETTLE = 0.6         # real seconds after the re-send before the run may end (a duplicate is stored by then)
QUIET = 2.5                 # real seconds without change: more than BackOff's longest wait (1 s) and a fetch timeout
RETRIES_FOREVER = 4         # deliveries of one message: beyond MaxDeliver 3 (stopped at the 5th)
CALLS_FOREVER = 20          # calls of process for one event: a worker that retries in its own loop without end
STUCK_CPU = 3.0
NAK_LATE = 0.6              # real seconds a redelivery asked for with nak(delay=d) may come after d (measured: 0.5)


@dataclass(frozen=True)
class Advisory:
    at: float
    subject: str
    data: bytes
    by_harness: bool = False    # the harness's re-send

    @property
    def kind(self) -> str:
        """MAX_DELIVERIES, MSG_TERMINATED... ($JS.EVENT.ADVISORY.CONSUMER.<kind>.<stream>.<consumer>)."""
        parts = self.subject.split(".")
        return parts[4] if len(parts) > 4 else ""

    @property
    def stream_seq(self) -> int | None:
        try:
            seq = json.loads(self.data).get("stream_seq")
        except (ValueError, AttributeError):
            return None
        return seq if isinstance(seq, int) else None


@dataclass(frozen=True)
class MainRun:
    published: tuple[dict, ...]             # the events, in the order published
    seqs: dict[str, int]                    # event id -> its stream sequence in EVENTS
    setup: ScriptRun
    worker: ScriptRun
    dlq_service: ScriptRun | None           # None: no dlq_service.py (its logic may live in worker.py)
    advisories: tuple[Advisory, ...]
    resent_at: float | None                 # when the harness re-sent the MAX_DELIVERIES advisory
    consumer: dict | None                   # ConsumerInfo of worker-consumer at the end
    consumers: tuple[str, ...]              # every consumer on EVENTS at the end
    events_left: tuple[dict, ...]           # EVENTS' stored messages at the end
    dlq: tuple[dict, ...]                   # DLQ's stored messages at the end
    streams: tuple[str, ...]
    published_at: float = 0.0
    extra: dict = field(default_factory=dict)

    def event(self, kind: str) -> dict:
        return next(e for e in self.published if e["kind"] == kind)

    def calls_for(self, event: dict) -> list:
        return [c for c in self.worker.calls if c.id == event["id"]]

    def call_counts(self) -> Counter:
        return Counter(c.id for c in self.worker.calls)

    def delivered(self) -> list[deliveries.Delivery]:
        """Every delivery from EVENTS the worker received, from any consumer, in order."""
        return deliveries.deliveries(self.worker.received)

    def answered(self) -> list[deliveries.Answer]:
        """Every answer (ack, nak, term...) the worker published on a `$JS.ACK...` subject, in order."""
        return deliveries.answers(self.worker.commands)

    def ack_policy(self) -> str | None:
        """worker-consumer's AckPolicy at the end of the run (None: no such consumer then)."""
        return ((self.consumer or {}).get("config") or {}).get("ack_policy") if self.consumer else None

    def advisories_for(self, kind: str, stream_seq: int) -> list[Advisory]:
        """The server's own advisories of a kind (MAX_DELIVERIES, MSG_TERMINATED) about one message of EVENTS."""
        return [a for a in self.advisories if not a.by_harness and a.kind == kind and a.stream_seq == stream_seq]


def main_batch() -> list[dict]:
    return [events.new_event(kind) for kind in ("good", "poison", "good", "corrupt")]


class AdvisoryWatch:
    """The harness's own subscription to every consumer advisory, and the one re-send (see the module)."""

    def __init__(self, endpoint, poison_seq: int):
        self.endpoint = endpoint
        self.poison_seq = poison_seq
        self.advisories: list[Advisory] = []
        self.resent_at: float | None = None
        self.ready = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, cancelled: threading.Event) -> None:
        with self.endpoint.admin() as admin, self.endpoint.admin() as reader:
            sid = admin.subscribe("$JS.EVENT.ADVISORY.CONSUMER.>")
            self.ready.set()
            seen_at = original = None
            echo_pending = False
            while not cancelled.is_set():
                for message in admin.received(sid, wait=0.05):
                    # the re-sent advisory comes back on this very subscription: that copy is the re-send
                    echo = echo_pending and (message.subject, message.data) == (original.subject, original.data)
                    echo_pending = echo_pending and not echo
                    with self._lock:
                        self.advisories.append(Advisory(time.time(), message.subject, message.data, by_harness=echo))
                    if seen_at is None and self._is_poison_exhausted(message):
                        seen_at, original = time.monotonic(), message
                if seen_at is not None and self.resent_at is None and (
                        time.monotonic() - seen_at >= DEAD_LETTER_WAIT
                        or server.messages(reader, lab.DLQ_STREAM, limit=1)):
                    echo_pending = True
                    admin.publish(original.subject, original.data)
                    self.resent_at = time.time()

    def _is_poison_exhausted(self, message) -> bool:
        if message.subject != lab.MAX_DELIVERIES_ADVISORY:
            return False
        try:
            return json.loads(message.data).get("stream_seq") == self.poison_seq
        except (ValueError, AttributeError):
            return False

    def snapshot(self) -> tuple[Advisory, ...]:
        with self._lock:
            return tuple(self.advisories)


def _worker_settled(batch, watch: AdvisoryWatch, admin_for_progress, cancelled) -> object:
    """When to stop worker.py (see the module's text): its work done; nothing changing for QUIET seconds; one
    message delivered beyond MaxDeliver, or processed in an endless loop; no progress while it spins."""
    goods = [e["id"] for e in batch if e["kind"] == "good"]
    quiet = {"since": None, "signature": None}
    naks = {"read": 0, "due": 0.0}     # the learner's commands read so far; when its latest nak(delay) comes due
    seen = {"read": 0, "most": 0}      # deliveries read so far; the highest delivery count among them

    def nak_due(progress) -> float:
        """The real time by which every redelivery the worker asked for with nak(delay=d) has come (measured:
        d after the nak, and 0.5 s more for a second one): no quiet is counted before it. Read from the relay's
        record itself, as most_delivered does."""
        commands = progress.link.relay.commands()
        for answer in deliveries.answers(commands[naks["read"]:]):
            if answer.kind == deliveries.NAK and answer.delay:
                naks["due"] = max(naks["due"], answer.at + min(answer.delay, RUN_TIMEOUT) + NAK_LATE)
        naks["read"] = len(commands)
        return naks["due"]

    def clean() -> bool:
        info = server.consumer_info(admin_for_progress)
        return info is None or (info.get("num_pending") == 0 and info.get("num_ack_pending") == 0)

    def done(progress) -> bool:
        ok = {c.id for c in progress.calls() if c.outcome == "ok"}
        if not all(g in ok for g in goods) or watch.resent_at is None:
            return False
        return time.time() - watch.resent_at >= RESEND_SETTLE and clean()

    def quiet_for_long(progress) -> bool:
        """Nothing changed (process calls, the server's streams and consumers, the advisories) for QUIET real
        seconds since the worker's first command, while it was idle: a worker the machine keeps waiting for
        a CPU (a thread ready to run) is not idle, so on a busy machine this waits for it."""
        if not progress.started():
            return False
        signature = (len(progress.calls()), progress.link.shape(), len(watch.snapshot()))
        now = time.monotonic()
        if signature != quiet["signature"] or progress.sandbox is not None and progress.sandbox.learner_running() \
                or time.time() < nak_due(progress):
            quiet["signature"], quiet["since"] = signature, now
            return False
        return now - quiet["since"] >= QUIET

    def most_delivered(progress) -> int:
        """The highest delivery count the server has given one message so far (read from the relay's record
        itself, not through the link, which would wait for connections the learner is closing)."""
        frames = progress.link.relay.deliveries()
        for delivery in deliveries.deliveries(frames[seen["read"]:]):
            seen["most"] = max(seen["most"], delivery.delivered)
        seen["read"] = len(frames)
        return seen["most"]

    def most_calls(progress) -> int:
        counts = Counter(c.id for c in progress.calls())
        return counts.most_common(1)[0][1] if counts else 0

    # quiet with the consumer clean: the work is done (nothing more will come); quiet with messages still
    # pending or unacknowledged: the worker stopped pulling, or waits for something that never comes
    return (when(lambda progress: cancelled is not None and cancelled.is_set(), Reason.CANCELLED)
            | when(done, Reason.DONE_IDLE, lambda progress: f"{progress.cpu_since_change():.1f}")
            | when(lambda progress: most_delivered(progress) > RETRIES_FOREVER, Reason.CAP,
                   lambda progress: tr("main.retries_forever", count=seen["most"], most=lab.MAX_DELIVER))
            | when(lambda progress: most_calls(progress) > CALLS_FOREVER, Reason.CAP,
                   lambda progress: tr("main.calls_forever", count=most_calls(progress)))
            | when(lambda progress: quiet_for_long(progress) and clean(), Reason.DONE_IDLE,
                   lambda progress: f"{progress.cpu_since_change():.1f}")
            # (quiet_for_long was asked just before, in this very look: its answer is in `quiet`)
            | when(lambda progress: quiet["since"] is not None and time.monotonic() - quiet["since"] >= QUIET,
                   Reason.CAP, lambda progress: tr("main.quiet", seconds=QUIET))
            | no_progress(cpu=STUCK_CPU))


@RUNS.observer("main_run")
def observe_main(learner, nats_backend, cancelled=None) -> MainRun:
    batch = main_batch()
    cancelled = cancelled or threading.Event()
    with nats_backend.private() as endpoint, endpoint.admin() as admin:
        created = server.create_events_stream(admin)
        setup = run_setup_script(learner, endpoint, cancelled)
        seqs = publish_after_setup(admin, created, batch)
        published_at = time.time()
        watch = AdvisoryWatch(endpoint, seqs[next(e["id"] for e in batch if e["kind"] == "poison")])
        with Beside(watch, "retrylab-advisories") as watcher:
            watch.ready.wait(5)
            listening = threading.Event()

            def stopped_or_listening(stop):
                def predicate(progress) -> bool:
                    if not listening.is_set() and any(f.op in ("SUB", "PUB", "HPUB") for f in progress.commands()):
                        listening.set()
                    return stop.is_set() or cancelled.is_set()
                return when(predicate, Reason.CANCELLED)

            def run_service(stop):
                try:
                    return without_step_clock(learner).run("dlq_service.py", endpoint, timeout=RUN_TIMEOUT + 5,
                                                           stop_when=stopped_or_listening(stop))
                finally:
                    listening.set()

            service = Beside(run_service, "retrylab-dlq-service")
            # the worker starts once the DLQ service listens (or after SERVICE_HEAD_START): a service on a plain
            # subscription must not miss the corrupt event's MSG_TERMINATED advisory, sent at the first fetch
            listening.wait(SERVICE_HEAD_START)
            try:
                with endpoint.admin() as progress_admin:
                    worker = learner.run("worker.py", endpoint, timeout=RUN_TIMEOUT,
                                         stop_when=_worker_settled(batch, watch, progress_admin, cancelled),
                                         app=TaskprocApp(published=batch))
            finally:
                service.cancel()    # waited for on every path: nothing of its run outlives the private server
            dlq_service = service.result()
            watcher.cancelled.set()
        return MainRun(
            published=tuple(batch), seqs=seqs, setup=setup, worker=worker,
            dlq_service=None if dlq_service.missing else dlq_service,
            advisories=watch.snapshot(), resent_at=watch.resent_at,
            consumer=server.consumer_info(admin), consumers=tuple(server.consumer_names(admin, lab.STREAM)),
            events_left=tuple(server.messages(admin, lab.STREAM)), dlq=tuple(server.messages(admin, lab.DLQ_STREAM)),
            streams=tuple(server.stream_names(admin)), published_at=published_at)


@pytest.fixture(scope="session")
def main_run(request, learner, nats_backend) -> MainRun:
    return RUNS.record(request, "main_run", learner, nats_backend)
