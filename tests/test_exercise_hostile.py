"""Each exercise's hostile and bad-input submissions (fixtures/<exercise>/submissions/hostile), graded through
the CLI: its expected verdict per step, exit status 1, failed steps with a message a learner can act on (what
is wrong, then the hint), no harness error or traceback, within the entry's bound, and no process of the
grading's left behind (its private broker above all). backoff-dlq's hostile corpus has tests of its own
(test_hostile.py): its entries attack the sandbox and the call channel, and are judged beyond the verdicts.

jetstream-dlq: an empty directory, a worker that never connects, one bound to a stream that does not exist,
one that deletes stream EVENTS or the consumer, a DLQ service that publishes garbage and messages at (and over)
the server's max_payload, one that floods the advisory subject with 50,000 fakes, a worker deaf to SIGTERM.
retry-topics: an empty directory, scripts that crash at import, a main consumer that never joins its group,
consumers that hang deaf to SIGTERM (one spinning, one blocked), one that commits garbage offsets (far past the
ends, on partitions and topics that do not exist), one that produces to topics that do not exist, one that
floods callbacks.dlq with 100,000 junk records.
stream-consumer: a consumer that deletes the group, trims the stream to nothing or floods it with 100k
entries, a producer deaf to SIGTERM, a lag.py that prints 10 MB of random bytes or nothing, dead letters with
binary fields or of the wrong type, `orders` turned into a hash, a producer adding binary entries without an
order_id, an empty directory."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from retrylab import procfs
from retrylab.fixtures.jetstream_dlq import corpus as jetstream_dlq
from retrylab.fixtures.retry_topics import corpus as retry_topics
from retrylab.fixtures.stream_consumer import corpus as stream_consumer

# the attacks each exercise's hostile corpus must hold (more may come)
ATTACKS = {
    "jetstream-dlq": (jetstream_dlq, {"empty-directory", "worker-never-connects", "worker-wrong-stream",
                                      "stream-deleter", "consumer-deleter", "dlq-garbage-huge", "advisory-flood",
                                      "worker-hangs"}),
    "retry-topics": (retry_topics, {"empty-directory", "crash-at-import", "never-joins", "hangs",
                                    "commits-garbage-offsets", "produces-to-missing-topics", "floods-a-topic"}),
    "stream-consumer": (stream_consumer, {"group-destroyer", "stream-trimmer", "stream-flood", "producer-hangs",
                                          "lag-garbage-flood", "lag-silent", "empty-directory", "dlq-binary-fields",
                                          "dlq-wrong-type", "orders-wrong-type", "producer-binary-entries"}),
}
# stream-consumer's entries that attack the harness's readers of the learner's streams, whose answers differ by
# backend, are graded on redis-server too; every entry is graded on its exercise's default backend
ON_REDIS_SERVER_TOO = {"group-destroyer", "stream-trimmer", "stream-flood", "dlq-binary-fields", "dlq-wrong-type",
                       "orders-wrong-type", "producer-binary-entries"}
CASES = [(exercise, entry, None) for exercise, (corpus, _) in ATTACKS.items() for entry in corpus.entries("hostile")]
CASES += [("stream-consumer", e, "redis-server") for e in stream_consumer.entries("hostile")
          if e.name in ON_REDIS_SERVER_TOO]

# a traceback through the harness's own code (the learner-side stubs of learner_site may be in a learner's)
HARNESS_FRAME = re.compile(r'File "[^"]*/(?:retrylab|harness|checks)/(?!learner_site/)')
MESSAGE_BOUND = 6000
MARK = "RETRYLAB_HOSTILE_TEST_RUN"


def left_behind(mark: str) -> list[str]:
    """The processes still alive that inherited this grading's environment mark: "pid command" each."""
    found = []
    for pid in procfs.find_processes(f"{MARK}={mark}"):
        fields = procfs.stat_fields(pid)
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields is not None and fields[0] != b"Z":
            found.append(f"{pid} {command[:200]}")
    return found


@pytest.mark.parametrize("exercise, entry, backend", CASES,
                         ids=[f"{x}-{e.name}" + (f"-{b}" if b else "") for x, e, b in CASES])
def test_hostile_submission_fails_its_steps_cleanly_and_in_time(exercise, entry, backend, tmp_path):
    submission = entry.materialize(tmp_path / "submission")
    mark = uuid.uuid4().hex
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "retrylab", "check", "--exercise", exercise, str(submission),
                           *(("--backend", backend) if backend else ()), "--format", "exercism", "--lang", "en"],
                          capture_output=True, text=True, timeout=entry.max_seconds + 60,
                          env={**os.environ, "LANGUAGE": "", "LC_ALL": "", "LANG": "C.UTF-8", MARK: mark})
    seconds = time.monotonic() - started

    assert done.returncode == 1, done.stdout[-2000:] + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    results = json.loads(done.stdout)
    tests = {t["task_id"]: t for t in results["tests"] if "task_id" in t}
    explain = "\n".join(f"step {n} {t['status']}: {t.get('message', '')[:600]}" for n, t in tests.items())
    assert {n: t["status"] for n, t in tests.items()} == entry.expect, f"{entry.why}\n{explain}"
    assert seconds < entry.max_seconds, f"grading took {seconds:.1f} s, over its bound of {entry.max_seconds} s"
    for number, test in tests.items():
        if test["status"] == "fail":
            message = test["message"]
            assert "Hint:" in message and len(message) < MESSAGE_BOUND, message[:300]
            assert not HARNESS_FRAME.search(message), message
            assert message.split("Hint:")[0].strip(), f"step {number} fails without saying why"
    time.sleep(0.2)     # a SIGKILLed child is reaped by init a moment later
    assert left_behind(mark) == [], "the grading left processes behind"


@pytest.mark.parametrize("exercise", sorted(ATTACKS))
def test_the_hostile_corpus_covers_the_attacks(exercise):
    corpus, attacks = ATTACKS[exercise]
    entries = corpus.entries("hostile")
    names = {e.name for e in entries}
    assert attacks <= names
    assert all(e.max_seconds for e in entries)
    steps = sorted(entries[0].expect)
    assert steps == list(range(1, len(steps) + 1)) and all(sorted(e.expect) == steps for e in entries), \
        "a verdict for every step"
    assert not names & {e.name for e in corpus.entries()}, "hostile entries stay out of the default corpus"


def test_the_mark_finds_a_process_left_behind():
    """left_behind is no assertion of nothing: it finds a marked process that is still running."""
    mark = uuid.uuid4().hex
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env={**os.environ, MARK: mark})
    try:
        assert any(line.startswith(f"{sleeper.pid} ") for line in left_behind(mark))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert left_behind(mark) == []
