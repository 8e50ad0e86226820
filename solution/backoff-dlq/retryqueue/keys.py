"""Every Redis key the queue uses, named in one place.

The first two are the lab's; the others are the machinery that makes the queue reliable. They
share the `q:tasks` prefix so that `redis-cli --scan --pattern 'q:tasks*'` shows all of it.
"""
QUEUE = "q:tasks"                        # list: producers RPUSH, workers take from the left
DLQ = "q:tasks:dlq"                      # list of JSON dead-letter records
DELAYED = "q:tasks:delayed"              # sorted set: retries waiting, scored by due time
WORKERS = "q:tasks:workers"              # set: ids of workers that may hold messages in flight
_PROCESSING = "q:tasks:processing:"      # + worker id: list of that worker's message in flight
_HEARTBEAT = "q:tasks:heartbeat:"        # + worker id: string with a TTL, refreshed while alive


def processing(worker_id: str) -> str:
    return _PROCESSING + worker_id


def heartbeat(worker_id: str) -> str:
    return _HEARTBEAT + worker_id
