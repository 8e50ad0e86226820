"""The lab's names and numbers (LAB.md, "Exercise `retry-topics`"; seed 004)."""

TOPIC = "callbacks"
RETRY_TOPIC = "callbacks.retry"
DLQ_TOPIC = "callbacks.dlq"
PARTITIONS = {TOPIC: 3, RETRY_TOPIC: 3, DLQ_TOPIC: 1}   # the harness creates the three topics so
MAIN_GROUP = "notifier"             # consumer.py's group, on callbacks
RETRY_GROUP = "notifier-retry"      # retry_consumer.py's group, on callbacks.retry
MAIN_SCRIPT = "consumer.py"
RETRY_SCRIPT = "retry_consumer.py"

MAX_ATTEMPTS = 3                    # notification attempts per message, the first included
RETRY_INTERVAL_MS = 600_000         # ten minutes of the run's virtual clock; learners read RETRY_INTERVAL_MS
INTERVAL = RETRY_INTERVAL_MS / 1000
NEXT_TIME_TOLERANCE = 5.0           # seconds of virtual time: nextRetryTime = failure time + interval, within it
RETRY_TIMES = "retryTimes"          # failed attempts so far: 1 and 2 on the retry topic, 3 on the DLQ record
NEXT_RETRY_TIME = "nextRetryTime"   # epoch milliseconds at which the next attempt is due
INTERVAL_VARIABLE = "RETRY_INTERVAL_MS"
BOOTSTRAP_VARIABLE = "KAFKA_BOOTSTRAP_SERVERS"

# The merchants of the callbacks the harness produces (fixtures/retry_topics/notifier_app.py)
OK, FLAKY_1, FLAKY_2, DOWN = "ok", "flaky-1", "flaky-2", "down"
EXPECTED_CALLS = {OK: 1, FLAKY_1: 2, FLAKY_2: 3, DOWN: 3}    # notifications per callback of a correct pair
