"""The lab's names and numbers (LAB.md, "Exercise `stream-consumer`"; seed 001)."""

STREAM = "orders"
GROUP = "workers"
DLQ = "orders:dlq"
REFUSED = "orders:refused"

MAX_DELIVERIES = 3          # the poison entry's deliveries before it is dead-lettered
FLAKY_FAILURES = 2          # a flaky entry fails this many deliveries, then its effect applies
MIN_RETRY_GAP = 0.100       # seconds: a redelivery sooner than this after the failure is an immediate retry
DLQ_FIELDS = ("error", "deliveries", "source_id")   # what a dead letter adds to the entry's fields

LAG_PERIOD = 0.5            # seconds between two lines of lag.py
LAG_WINDOW = 0.35           # seconds: a line is compared with the harness's samples this close in time
LAG_AGREEMENT = 0.8         # share of lines that must agree with the harness's samples
POLICIES = ("block", "shed", "reject")
