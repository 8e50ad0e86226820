"""The lab's names and numbers (LAB.md, "Exercise `jetstream-dlq`"; seed 003)."""

STREAM = "EVENTS"
STREAM_SUBJECTS = ["events.>"]
SUBJECT = "events.created"
CONSUMER = "worker-consumer"
DLQ_STREAM = "DLQ"
DLQ_SUBJECT = "dlq.events"
TERMINATED_SUBJECT = "dlq.terminated"
MAX_DELIVERIES_ADVISORY = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{STREAM}.{CONSUMER}"
TERMINATED_ADVISORY = f"$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{STREAM}.{CONSUMER}"
ACK_PREFIX = f"$JS.ACK.{STREAM}.{CONSUMER}."

MAX_DELIVER = 3
BACKOFF_NS = [500_000_000, 1_000_000_000]   # [0.5 s, 1 s] as ConsumerInfo reports it (nanoseconds)
ACK_WAIT_NS = 30_000_000_000                # as configured; nats-server 2.15 stores BackOff[0] instead: both pass
MIN_REDELIVERY_GAP = 0.4                    # seconds between two deliveries of the poison
DUPLICATE_WINDOW = 120                      # seconds: the re-sent advisory comes well inside it
MSG_ID_HEADER = "Nats-Msg-Id"
