"""How an entry came back after a failure, read from the call log (Call.t, real time in these runs) and
the relay's command record (Command.at, the same clock): steps 2 and 3's evidence.

A redelivery is a call of effects.apply for an order that follows a failed call for it. A claim of the entry
is XCLAIM orders workers <consumer> <min-idle-ms> ... naming the entry's id, or XAUTOCLAIM orders workers
<consumer> <min-idle-ms> <start> ... whose start is at or before the entry's id.

A gap between two calls is not the entry's idle time: a consumer that reads a batch calls apply for the
flaky entry some time after it was delivered, and on a busy machine the call reaches the harness later still.
So each redelivery also keeps, from the relay's record, `delivered_at`: the last command before the failed call
that could have delivered the entry (an XREADGROUP of the stream, a claim). The server delivered it after that
command, and gave it back before the next call: `at - delivered_at` is at least the real wait, so "immediate"
judged on it never fails a correct consumer however slow the machine. The min-idle of a redelivery is that of
the last command between the calls that could give the entry back, when it is a claim: when it is a re-read of
a pending list, a claim sent before it took nothing. A growing wait seen only in the gaps is
still judged on the gaps between the calls (`call_gap`), the same measure on each side; see waits_grow for what
a busy machine can still do to that.
"""
from __future__ import annotations

from dataclasses import dataclass

from retrylab.checks.stream_consumer import lab, streams


@dataclass(frozen=True)
class Redelivery:
    failed_at: float                # Call.t of the failed call before it
    at: float                       # Call.t of this call
    min_idle_ms: int | None         # of the claim that brought it back (None: no claim seen, or a re-read did)
    delivered_at: float | None = None     # Command.at of the last command that could have delivered it before
    eager: bool = False             # claimed when due with min-idle_ms, polling toward it (claimed_when_due)
    # What of the gap between the calls a busy machine may have made longer: `stretched`, seconds the consumer
    # (and the harness thread that stamped its calls) waited for a CPU, with the machine's steal (Call.cpu_wait;
    # 0.0 where the kernel could not tell); `busy`, seconds in which the consumer worked on other orders
    # (other_work) or waited for a reply a quiet server gives sooner (slow_replies): a quiet machine does the one
    # in milliseconds and the other not at all, a busy one, whose server answers slowly, in hundreds.
    stretched: float = 0.0
    busy: float = 0.0

    @property
    def gap(self) -> float:
        """At least the real wait: from the entry's delivery (redeliveries() takes it at or before the failed call),
        or from the failed call when no delivering command was seen, to the next call."""
        return self.at - (self.failed_at if self.delivered_at is None else self.delivered_at)

    @property
    def call_gap(self) -> float:
        """From the failed call to this one."""
        return self.at - self.failed_at

    @property
    def quiet_gap(self) -> tuple[float, float]:
        """The least and the most the wait may have been on a quiet machine: the gap between the calls without
        what a busy machine may have added to it, and the gap from the entry's delivery (`gap`: a busy machine
        only lengthens it; from the failed call, a first delivery read in a batch would look shorter by the
        work on the entries before it)."""
        return max(0.0, self.call_gap - self.stretched - self.busy), self.gap


def _key(command) -> bytes | None:
    return command.args[1] if len(command.args) > 1 else None


def read_from(command) -> list[tuple[bytes, bytes]]:
    """(stream, id) for each stream an XREADGROUP reads (after STREAMS: keys, then as many ids); [] if it is none."""
    if command.name != "XREADGROUP":
        return []
    upper = [a.upper() for a in command.args]
    if b"STREAMS" not in upper[4:]:          # GROUP <group> <consumer> come first: a name may be "streams"
        return []
    rest = command.args[upper.index(b"STREAMS", 4) + 1:]
    if len(rest) % 2:
        return []
    half = len(rest) // 2
    return list(zip(rest[:half], rest[half:]))


def _delivers(command, entry_id: bytes) -> bool:
    """A command that could deliver the entry: a claim of it, or an XREADGROUP of the lab's stream."""
    return is_claim(command, entry_id) or any(key == lab.STREAM.encode() for key, _ in read_from(command))


def gives_back(command, entry_id: bytes, reader: bytes | None = None) -> bool:
    """A command that could give a pending entry of the lab's stream back: a claim of it, or an XREADGROUP of a
    pending list (an id other than `>`, which reads only new entries), by consumer `reader` when one is named (a
    pending list read is the reading consumer's own)."""
    if is_claim(command, entry_id):
        return True
    if reader is not None and command.args[3:4] != (reader,):
        return False
    return any(key == lab.STREAM.encode() and i != b">" for key, i in read_from(command))


def _autoclaim(command) -> bool:
    """An XAUTOCLAIM on the lab's stream that names its start."""
    return command.name == "XAUTOCLAIM" and _key(command) == lab.STREAM.encode() and len(command.args) > 5


def is_claim(command, entry_id: bytes) -> bool:
    """An XCLAIM of `entry_id`, or an XAUTOCLAIM whose start is at or before it, on the lab's stream (one that
    starts past the entry cannot take it: a claim sent for show, or the next page of a scan)."""
    if _autoclaim(command):
        return _at_or_after(entry_id, command.args[5])
    return command.name == "XCLAIM" and _key(command) == lab.STREAM.encode() and entry_id in command.args[5:]


def autoclaims_past(commands, entry_id: bytes, start: float, end: float) -> list:
    """The XAUTOCLAIMs on the lab's stream between `start` and `end` that start past the entry: none can take it."""
    return [c for c in commands if start <= c.at <= end and _autoclaim(c) and not is_claim(c, entry_id)]


def min_idle_ms(command) -> int | None:
    try:
        return int(command.args[4])
    except (IndexError, ValueError):
        return None


def acks(commands, entry_id: bytes) -> list:
    """The XACKs of `entry_id` on the lab's stream, in order."""
    return [c for c in commands if c.name == "XACK" and _key(c) == lab.STREAM.encode() and entry_id in c.args[3:]]


def claims_between(commands, entry_id: bytes, start: float, end: float) -> list:
    return [c for c in commands if start <= c.at <= end and is_claim(c, entry_id)]


def skipped(calls, commands, entry_id: bytes, pending) -> bool:
    """Whether the entry was delivered again after its last call of apply, and apply was not called:
    its pending entry counts more deliveries than calls, or an XCLAIM of it came after the last call
    (and before the XACK that ended it). `pending`: its streams.Pending at the end, None if not pending."""
    if pending is not None and pending.deliveries > len(calls):
        return True
    last = calls[-1].t
    acked = [a.at for a in acks(commands, entry_id) if a.at >= last]
    claims = claims_between(commands, entry_id, last, acked[0] if acked else float("inf"))
    return any(c.name == "XCLAIM" for c in claims)


def look_threshold(command, entry_id: bytes) -> int | None:
    """The idle threshold (ms) of a command that looks for the entry among the group's due pending entries: an
    XPENDING in its extended form (IDLE m, else 0) whose range holds the entry, a claim's min-idle; None for
    any other command."""
    if is_claim(command, entry_id):
        return min_idle_ms(command)
    args = command.args
    if command.name != "XPENDING" or args[1:3] != (lab.STREAM.encode(), lab.GROUP.encode()):
        return None
    threshold, rest = 0, args[3:]
    if rest[:1] and rest[0].upper() == b"IDLE":
        try:
            threshold, rest = int(rest[1]), rest[2:]
        except (IndexError, ValueError):
            return None
    if len(rest) < 3 or not (_at_or_after(entry_id, rest[0]) and _at_or_after(rest[1], entry_id)):
        return None
    return threshold


def _at_or_after(later: bytes, earlier: bytes) -> bool:
    """Whether id (or range bound) `later` is at or after `earlier` ("-" and "+" the ends; "(" ignored: a bound
    that excludes the entry itself still counts, so a look is never missed)."""
    low, high = streams.id_order(earlier, (0, 0)), streams.id_order(later, (2 ** 64, 2 ** 64))
    return low is not None and high is not None and high >= low


TRIGGER_GAP = 0.05          # seconds: an XPENDING this close before the claim is the look that found the entry


def claimed_when_due(commands, entry_id: bytes, start: float, failed_at: float, claim, applied_at: float) -> bool:
    """Whether the consumer took the entry back at its first look that could find it due, polling toward that
    moment, all with the claim's own threshold m, and applied it at once: its wait was then m, whatever the gap.

    Looks are the consumer's commands between the failed call and the claim (look_threshold). The claim, and an
    XPENDING with threshold m sent just before it, are the look that took the entry. Each earlier look could not
    find it due: sent under m after the entry's delivery (`start`). One sent m or more after the failed call surely
    found it due, and passing it by shows a schedule of the consumer's own (between the two: not known).
    What a busy machine cannot make, and a consumer with a schedule of its own would: a claim with no earlier
    look from half its min-idle on (a consumer that sleeps its wait out); a blocking read after the last earlier
    look that runs past the due time by MIN_RETRY_GAP (one that waits in XREADGROUP ... BLOCK until its retry);
    an entry held for MIN_RETRY_GAP or more between its claim and its call (claimed when due, applied later).
    Those are judged on their gaps."""
    m = min_idle_ms(claim)
    if m is None or applied_at - claim.at >= lab.MIN_RETRY_GAP:
        return False
    between = [c for c in commands if failed_at < c.at and c.seq < claim.seq]
    looks = [(c, look_threshold(c, entry_id)) for c in between]
    looks = [(c, t) for c, t in looks if t is not None]
    if looks and looks[-1][0].name == "XPENDING" and looks[-1][1] == m and claim.at - looks[-1][0].at < TRIGGER_GAP:
        looks.pop()
    if not looks or any(t != m or c.at - start >= m / 1000 for c, t in looks):
        return False
    last = looks[-1][0]
    if last.at - start < m / 2000:
        return False
    due = start + m / 1000
    reads = [c for c in between if c.seq > last.seq and c.read_timeout is not None]
    return not any(c.read_timeout == 0.0 or c.at + c.read_timeout >= due + lab.MIN_RETRY_GAP for c in reads)


def cpu_waited(earlier, later) -> float:
    """How long a busy machine kept the process that made call `later` from a CPU since call `earlier` (Call.cpu_wait);
    0.0 when the kernel could not tell, or the two calls came from different processes (Call.peer: the kernel's
    word, the pid whose counters cpu_wait reads)."""
    if (earlier is None or earlier.cpu_wait is None or later.cpu_wait is None or earlier.peer is None
            or earlier.peer != later.peer):
        return 0.0
    return max(0.0, later.cpu_wait - earlier.cpu_wait)


@dataclass(frozen=True)
class Orders:
    """Some orders, by their ids and their entries' ids in the stream (bytes)."""
    ids: frozenset = frozenset()
    entry_ids: frozenset = frozenset()

    def called(self, call) -> bool:
        """A call of apply for one of them."""
        return call.id is not None and call.id.encode() in self.ids

    def named(self, command) -> bool:
        """A command naming one of them: an argument that is one of their entry ids, or holds one of their order
        ids (a key such as orders:done:<order_id>)."""
        return any(a in self.entry_ids or any(i in a for i in self.ids) for a in command.args)


def other_work(calls, commands, start: float, end: float, theirs: Orders, ours: Orders) -> list[tuple[float, float]]:
    """The spans between `start` and `end` the consumer spent on other orders (`theirs`, and not `ours`): from each
    of its calls or commands about one of them to its next call or command, or `end`."""
    timed = sorted([(c.t, theirs.called(c) and not ours.called(c)) for c in calls] +
                   [(c.at, theirs.named(c) and not ours.named(c)) for c in commands])
    timed = [(at, other) for at, other in timed if start < at < end]
    ends = [at for at, _ in timed[1:]] + [end]
    return [(at, until) for (at, other), until in zip(timed, ends) if other]


# How late a reply may come on a quiet machine (seconds), measured through the relay: a command that does not block
# is answered within 2 ms (fake server, quiet 2-core machine: at most 1.8 ms, most under 0.5 ms), a blocking read
# that times out within 100 ms of its timeout (redis-server checks its blocked clients' timeouts with its 10 Hz
# timer: up to 59 ms seen).
QUIET_REPLY = 0.002
QUIET_TIMEOUT = 0.100


def slow_replies(commands, start: float, end: float) -> list[tuple[float, float]]:
    """The spans between `start` and `end` in which a command waited for a reply later than a quiet machine gives it
    (Command.answered_at): past QUIET_REPLY, or a blocking read past its timeout and QUIET_TIMEOUT (until then the
    consumer chose to wait; one that blocks for ever always does)."""
    spans = []
    for c in commands:
        timeout = c.read_timeout
        if c.answered_at is None or timeout == 0.0:
            continue
        late = c.at + (QUIET_REPLY if timeout is None else timeout + QUIET_TIMEOUT)
        if max(late, start) < min(c.answered_at, end):
            spans.append((max(late, start), min(c.answered_at, end)))
    return spans


def covered(spans) -> float:
    """Seconds that the spans (start, end) cover together: where they overlap, once."""
    total, reached = 0.0, float("-inf")
    for begin, end in sorted(spans):
        if end > reached:
            total += end - max(begin, reached)
            reached = end
    return total


def redeliveries(calls, commands, entry_id: bytes, every_call=(), others: Orders = Orders()) -> list[Redelivery]:
    """Each call that follows a failed call of the same order (`calls`: that order's, by time). With the run's
    calls of any order (`every_call`) and the other orders, each knows how much of its gap went on them, or on
    slow replies (Redelivery.busy)."""
    flaky = calls[0].id if calls else None
    ours = Orders(frozenset() if flaky is None else frozenset({flaky.encode()}), frozenset({entry_id}))
    found = []
    for before, call in zip(calls, calls[1:]):
        if before.outcome != "error":
            continue
        delivered = [c.at for c in commands if c.at <= before.t and _delivers(c, entry_id)]
        back = [c for c in commands if before.t <= c.at <= call.t and gives_back(c, entry_id)]
        # the min-idle of the claim that gave it back; none when the last thing that could was a re-read of a
        # pending list (a claim sent for show before it took nothing)
        claim = back[-1] if back and is_claim(back[-1], entry_id) else None
        delivered_at = delivered[-1] if delivered else None
        start = before.t if delivered_at is None else delivered_at
        eager = claim is not None and claimed_when_due(commands, entry_id, start, before.t, claim, call.t)
        busy = covered(other_work(every_call, commands, before.t, call.t, others, ours) +
                       slow_replies(commands, before.t, call.t))
        found.append(Redelivery(before.t, call.t, None if claim is None else min_idle_ms(claim), delivered_at, eager,
                                stretched=cpu_waited(before, call), busy=busy))
    return found


def claimed_with(redelivered: Redelivery) -> int | None:
    """The min-idle that brought the entry back, if the observed wait agrees with it: a claim with min-idle
    m takes an entry idle for m since its last delivery, which came just before the failed call; MIN_RETRY_GAP
    is allowed for the work between that delivery and the call. A wait much shorter than the min-idle says
    the claim did not take it (an XAUTOCLAIM sent for show, the entry re-read from the consumer's own list)."""
    m = redelivered.min_idle_ms
    if m is None or redelivered.gap < m / 1000 - lab.MIN_RETRY_GAP:
        return None
    return m


def waits_grow(first: Redelivery, second: Redelivery) -> bool | None:
    """Whether the second wait is longer than the first; None when a busy machine may have decided it.

    Longer by the min-idle the entry was claimed with (both at least MIN_RETRY_GAP, each agreeing with its
    wait: the server enforced them, whatever the machine did). Not longer when the consumer claimed each time at
    its first look that could find the entry due, with the same min-idle (claimed_when_due): it waited that
    min-idle both times, and a longer second gap is the machine's doing. Else on the gaps between the calls: the
    second longer by MIN_RETRY_GAP at least (a constant min-idle seen through a poll period of up to 100 ms must
    not pass by chance), judged on what each gap would have been on a machine that kept no one waiting for a
    CPU nor answered slowly (Redelivery.quiet_gap). A consumer kept from a CPU, or slowed by a slow server while
    it handled the orders added meanwhile, in its second wait shows a longer second gap (CI and
    bench/load_agreement.py saw a constant min-idle pass so), one slowed in its first a longer first gap: the gaps
    decide only when they would have decided the same way without that, and None says they could not (the run
    is made again). A slow server answering the consumer's own looks for the entry counts the same way
    (slow_replies)."""
    idle1, idle2 = claimed_with(first), claimed_with(second)
    if idle1 is not None and idle2 is not None and lab.MIN_RETRY_GAP * 1000 <= idle1 < idle2:
        return True
    if first.eager and second.eager and first.min_idle_ms == second.min_idle_ms:
        return False                    # each wait was the same min-idle: a longer second gap is the machine's doing
    (least1, most1), (least2, most2) = first.quiet_gap, second.quiet_gap
    if least2 >= most1 + lab.MIN_RETRY_GAP:
        return True
    if most2 < least1 + lab.MIN_RETRY_GAP:
        return False
    return None
