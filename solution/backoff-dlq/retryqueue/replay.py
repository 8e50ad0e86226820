"""Moving dead letters back onto the queue: by hand, once, after the cause is fixed.

Never automatically: a DLQ consumer that replays on its own sends a message whose cause remains
around the retry loop forever. A run looks at the entries present when it starts, moves those
that match, reports each, and ends.
"""
import json
from dataclasses import dataclass

from . import dlq, keys, lua, messages

# Remove one exact entry from the DLQ and push its message onto the queue, as one step: a crash
# leaves the entry either still in the DLQ or already on the queue, never lost or doubled. If the
# entry is gone (another replay took it), nothing is pushed.
MOVE = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[2])
  return 1
end
return 0
"""
PAGE = 1000  # entries read per LRANGE


@dataclass(frozen=True)
class Selection:
    """Which entries to move: all of them unless narrowed."""
    ids: tuple = ()        # only entries whose payload id is one of these
    match: str = ""        # only entries whose JSON text contains this
    limit: int = None      # at most this many

    def wants(self, raw):
        if self.ids and dlq.message_id(raw) not in self.ids:
            return False
        return not self.match or self.match in raw.decode("utf-8", "replace")


@dataclass(frozen=True)
class Outcome:
    raw: bytes
    message: dict          # what was (or, in a dry run, would be) pushed; None if not replayable
    problem: str = ""      # why it was left in the DLQ
    moved: bool = False


def snapshot(r):
    """The DLQ as it is now; entries added later wait for the next run."""
    total = r.llen(keys.DLQ)
    entries = []
    for start in range(0, total, PAGE):
        entries += r.lrange(keys.DLQ, start, min(start + PAGE, total) - 1)
    return entries


def replay(r, selection=Selection(), dry_run=False):
    """Move the selected DLQ entries to the queue (attempts reset to 0); yield an Outcome for each."""
    move = lua.script(r, MOVE)
    taken = 0
    for raw in snapshot(r):
        if selection.limit is not None and taken >= selection.limit:
            return
        if not selection.wants(raw):
            continue
        message, problem = dlq.to_message(raw)
        if message is None:
            yield Outcome(raw, None, problem)  # left where it is, for a human to look at
            continue
        taken += 1
        if dry_run:
            yield Outcome(raw, message)
            continue
        moved = move(keys=[keys.DLQ, keys.QUEUE], args=[raw, messages.encode(message)]) == 1
        yield Outcome(raw, message, "" if moved else "already gone (replayed by someone else)", moved)


def describe(outcome, dry_run):
    if outcome.message is None or (not dry_run and not outcome.moved):
        return f"left in {keys.DLQ} ({outcome.problem}): {outcome.raw[:200].decode('utf-8', 'replace')}"
    verb = "would replay" if dry_run else "replayed"
    entry = dlq.parse(outcome.raw) or {}
    return (f"{verb} id={outcome.message.get('id')} -> {keys.QUEUE} attempts=0"
            f" (was: {json.dumps(entry.get('error', ''))[:120]})")
