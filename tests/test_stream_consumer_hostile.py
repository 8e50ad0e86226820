"""stream-consumer's hostile and bad-input submissions (fixtures/stream_consumer/submissions/hostile): a
consumer that deletes the group, trims the stream to nothing or floods it with 100k entries, a producer that
hangs deaf to SIGTERM, a lag.py that prints 10 MB of random bytes or nothing, dead letters with binary
fields or of the wrong type, `orders` turned into a hash, a producer adding binary entries without an
order_id, an empty directory. Each is graded through the CLI: its expected verdict per
step, exit status 1, failed steps with a message a learner can act on (what is wrong, then the hint), no
harness error or traceback, within the entry's bound."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from retrylab.fixtures.stream_consumer import corpus

ENTRIES = corpus.entries("hostile")
# these attack the harness's readers of the learner's streams, whose answers differ by backend: graded on both
BOTH_BACKENDS = {"group-destroyer", "stream-trimmer", "stream-flood", "dlq-binary-fields", "dlq-wrong-type",
                 "orders-wrong-type", "producer-binary-entries"}
CASES = [(e, "fake") for e in ENTRIES] + [(e, "redis-server") for e in ENTRIES if e.name in BOTH_BACKENDS]
# a traceback through the harness's own code (the learner-side stubs of learner_site may be in a learner's)
HARNESS_FRAME = re.compile(r'File "[^"]*/(?:retrylab|harness|checks)/(?!learner_site/)')
MESSAGE_BOUND = 6000


@pytest.mark.parametrize("entry, backend", CASES, ids=[f"{e.name}-{b}" for e, b in CASES])
def test_hostile_submission_fails_its_steps_cleanly_and_in_time(entry, backend, tmp_path):
    submission = entry.materialize(tmp_path / "submission")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "retrylab", "check", "--exercise", "stream-consumer",
                           str(submission), "--backend", backend, "--format", "exercism", "--lang", "en"],
                          capture_output=True, text=True, timeout=entry.max_seconds + 60,
                          env={**os.environ, "LANGUAGE": "", "LC_ALL": "", "LANG": "C.UTF-8"})
    seconds = time.monotonic() - started

    assert done.returncode == 1, done.stderr
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


def test_the_hostile_corpus_covers_the_attacks():
    names = {e.name for e in ENTRIES}
    assert {"group-destroyer", "stream-trimmer", "stream-flood", "producer-hangs", "lag-garbage-flood", "lag-silent",
            "empty-directory", "dlq-binary-fields", "dlq-wrong-type", "orders-wrong-type",
            "producer-binary-entries"} <= names
    assert all(e.max_seconds for e in ENTRIES)
    assert not names & {e.name for e in corpus.entries()}, "hostile entries stay out of the default corpus"
