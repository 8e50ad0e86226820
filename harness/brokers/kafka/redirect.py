"""Send every Kafka client of a learner process to the check's private broker: the kafka broker's
learner-side redirect, which the learner site loads by its path (RETRYLAB_BROKER_REDIRECT, set by KafkaLink).

Whatever bootstrap address the learner wrote (or KAFKA_BOOTSTRAP_SERVERS said), confluent-kafka, kafka-python
and aiokafka clients bootstrap from RETRYLAB_KAFKA_BOOTSTRAP, in plain text (TLS and SASL settings are
dropped); the harness's relay there rewrites the broker address in metadata to the same one, so no client
leaves that way. Every consumer gets session.timeout.ms of RETRYLAB_KAFKA_SESSION_TIMEOUT_MS at most (and a
heartbeat a third of it): Tansu takes about half the session timeout to complete a group join. Where
RETRYLAB_KAFKA_AUTO_COMMIT_MS is set, auto-commit runs that often at least.

In a sandbox with its own network namespace (RETRYLAB_KAFKA_SOCKET set) there is no network: this process
listens on RETRYLAB_KAFKA_BOOTSTRAP itself, on loopback, and forwards each connection to the relay's unix
socket (librdkafka speaks TCP only). That needs the namespace's loopback up, with a second address (see
`_resolvable`); where this process may not set that up, it first moves into a network namespace of its own
(in a user namespace, where it may); processes it starts inherit it. The first process of a namespace to
listen serves the others.

On the run's virtual clock (retrylab.learner_site.virtual_clock), the clients' own waits stay real (their
backoffs and heartbeat loops would otherwise move the run's clock on: time no learner code waited for), and
an empty poll of a consumer with paused partitions is a virtual wait of its timeout (see `_paused_polls`):
pausing and polling until a record is due is one of the ways a consumer waits.

Cheap and self-contained: imports the standard library and learner_site only, and patches the client
libraries when (if ever) the learner imports them.
"""
import math
import os
import socket
import threading
import time
from collections.abc import Mapping

from retrylab.learner_site.client_waits import real_waits, virtual_clock
from retrylab.learner_site.import_hooks import after_import

_TLS_SASL = ("ssl.", "sasl.")
_PY_TLS_SASL = ("ssl_", "sasl_")


def _int(value, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


# -- polls of paused consumers: virtual waits -----------------------------------------------------------
# A consumer that pauses its partitions and polls until a record is due waits in its poll timeouts, in
# real time: ten minutes of it would cost a grading ten minutes. So, on the virtual clock, an empty poll
# of a consumer with a paused partition really waits a slice of at most _SLICE_MAX, and then moves the
# run's clock on by the rest of its timeout, in steps. Only while a partition is paused: an idle poll of a
# consumer that waits for nothing gains no time (it would let a consumer that never waits seem to).
_SLICE_MAX = 0.005  # real seconds: long enough to be a real wait in the client (no spinning: at most 200
                    # wake-ups a second) and to return a record, rebalance or error that comes meanwhile;
                    # short enough that ten minutes polled at 1 s cost about 3 s (600 slices plus overhead)
_SLICE_MIN = 0.0002 # a poll with a short timeout pays this real wait and the poll's own cost for its timeout
                    # of virtual time: at 1 ms, a retry consumer polling at 50 ms moved the clock 34 s per second
                    # (1200 s of a grading's waits took 35 s, at the harness's limits); at 0.2 ms, 160-190
_SPEEDUP = 200      # a slice is the step / _SPEEDUP: polls with short timeouts cost as little per virtual second
_STEP_MAX = 1.0     # virtual seconds after each empty slice, at most


def _step(session_ms) -> float:
    """The clock's step after an empty slice. kafka-python and aiokafka time their heartbeats and session
    on the process's monotonic clock, which follows the virtual one: a step of a sixth of the session
    (half a heartbeat interval, which the redirect keeps at a third of it at most) gives them a few
    chances to heartbeat before the session would seem to have expired."""
    return min(_STEP_MAX, max(0.001, _int(session_ms, 6000) / 6000))


def _paused_polls(timeout, paused, step: float):
    """How to make one poll of `timeout` seconds of a consumer while `paused()` says it has a paused
    partition: None when it is a plain real poll (not on the virtual clock, nothing paused, or no finite
    positive timeout: a poll that blocks until something comes is left as it is, as no virtual time would
    bring anything). Otherwise a generator of the real timeouts of the polls to make; send it whether each
    returned anything; it ends when the caller is to return the last poll's result (something came, or
    the timeout passed on the run's clock). A consumer resumed meanwhile (by another thread) waits the
    rest in real time."""
    clock = virtual_clock()
    if (clock is None or isinstance(timeout, bool) or not isinstance(timeout, (int, float))
            or not 0 < timeout < math.inf or not paused()):
        return None
    return _slices(clock, timeout, paused, step)


def _slices(clock, timeout: float, paused, step: float):
    deadline = time.monotonic() + timeout   # the process's monotonic clock follows the run's
    left = timeout
    while True:
        if not paused():
            yield left
            return
        if (yield min(left, max(_SLICE_MIN, min(_SLICE_MAX, min(step, left) / _SPEEDUP)))):
            return
        left = deadline - time.monotonic()
        if left > 0:
            clock.advance(min(step, left))
            left = deadline - time.monotonic()
        if left <= 0:
            return


def _poll_through(plan, poll, empty):
    """Run `plan` (from _paused_polls) with `poll(timeout)`; return the last result."""
    result, timeout = None, next(plan)
    while True:
        result = poll(timeout)
        try:
            timeout = plan.send(not empty(result))
        except StopIteration:
            return result


async def _poll_through_async(plan, poll, empty):
    result, timeout = None, next(plan)
    while True:
        result = await poll(timeout)
        try:
            timeout = plan.send(not empty(result))
        except StopIteration:
            return result


# -- confluent-kafka (librdkafka settings) -----------------------------------------------------------
def _librdkafka_conf(conf: dict, bootstrap: str, session_ms: int, consumer: bool) -> dict:
    conf = {k: v for k, v in conf.items() if not (isinstance(k, str) and k.startswith(_TLS_SASL))}
    conf.pop("metadata.broker.list", None)
    conf.update({"bootstrap.servers": bootstrap, "security.protocol": "plaintext", "broker.address.family": "v4"})
    if consumer:
        if str(conf.get("group.protocol", "classic")).lower() != "classic":
            conf["group.protocol"] = "classic"   # the broker has no KIP-848 consumer groups
        session = min(_int(conf.get("session.timeout.ms"), 45000), session_ms)
        conf["session.timeout.ms"] = session
        conf["heartbeat.interval.ms"] = max(1, min(_int(conf.get("heartbeat.interval.ms"), 3000), session // 3))
        if _auto_commit_ms:
            conf["auto.commit.interval.ms"] = min(_int(conf.get("auto.commit.interval.ms"), 5000), _auto_commit_ms)
    return conf


def _patch_confluent(cimpl, bootstrap: str, session_ms: int) -> None:
    # The C types' own names: confluent_kafka's __init__ (and SerializingProducer, AdminClient, the asyncio
    # wrappers) take them from cimpl right after it loads, so they all get these subclasses.
    for name in ("Producer", "Consumer", "ShareConsumer", "_AdminClientImpl"):
        base = getattr(cimpl, name, None)
        if base is None:
            continue
        consumer = name == "Consumer"   # a classic group consumer (a share group has no session timeout)

        def __init__(self, *args, _base=base, _consumer=consumer, **kwargs):
            given = bool(args) and isinstance(args[0], Mapping)
            conf = dict(args[0]) if given else {}
            rest = args[1:] if given else args
            for key in [k for k in kwargs if "." in k]:   # Producer(**{"bootstrap.servers": ...})
                conf[key] = kwargs.pop(key)
            conf = _librdkafka_conf(conf, bootstrap, session_ms, _consumer)
            _base.__init__(self, conf, *rest, **kwargs)
            if _consumer:
                self._retrylab_paused = set()
                self._retrylab_step = _step(conf["session.timeout.ms"])

        methods = {"__init__": __init__, "__doc__": base.__doc__, "__module__": base.__module__}
        if consumer:
            methods.update(_confluent_waits(base))
        patched = type(name, (base,), methods)
        patched.__qualname__ = base.__qualname__
        setattr(cimpl, name, patched)


def _partition_keys(partitions) -> set:
    try:
        return {(tp.topic, tp.partition) for tp in partitions}
    except (TypeError, AttributeError):
        return set()


def _confluent_waits(base) -> dict:
    """A Consumer's poll() and consume() as virtual waits while a partition is paused (see _paused_polls).
    librdkafka cannot say which partitions are paused, so pause() and resume() are followed, of the
    partitions assigned when paused: librdkafka keeps a partition paused while it is revoked and assigned
    again (measured with 2.16, after unassign()+assign() and after a rebalance), so a followed partition
    counts as paused while it is assigned."""
    def assigned(self) -> set:
        try:
            return _partition_keys(base.assignment(self))
        except Exception:   # noqa: BLE001 - closed, or failing: its poll and pause say so themselves
            return set()

    def has_paused(self) -> bool:
        return bool(self._retrylab_paused and assigned(self) & self._retrylab_paused)

    def pause(self, *args, **kwargs):
        base.pause(self, *args, **kwargs)
        self._retrylab_paused |= _partition_keys(args[0] if args else kwargs.get("partitions", ())) & assigned(self)

    def resume(self, *args, **kwargs):
        base.resume(self, *args, **kwargs)
        self._retrylab_paused -= _partition_keys(args[0] if args else kwargs.get("partitions", ()))

    def poll(self, *args, **kwargs):
        plan = None
        if len(args) + len(kwargs) <= 1 and set(kwargs) <= {"timeout"}:
            plan = _paused_polls(args[0] if args else kwargs.get("timeout"), lambda: has_paused(self),
                                 self._retrylab_step)
        if plan is None:
            return base.poll(self, *args, **kwargs)
        return _poll_through(plan, lambda timeout: base.poll(self, timeout), lambda message: message is None)

    def consume(self, *args, **kwargs):
        plan = None
        if len(args) <= 2 and set(kwargs) <= {"num_messages", "timeout"}:
            given = dict(zip(("num_messages", "timeout"), args), **kwargs)
            count = given.get("num_messages", 1)
            plan = _paused_polls(given.get("timeout"), lambda: has_paused(self), self._retrylab_step)
        if plan is None:
            return base.consume(self, *args, **kwargs)
        return _poll_through(plan, lambda timeout: base.consume(self, count, timeout), lambda messages: not messages)

    return {"pause": pause, "resume": resume, "poll": poll, "consume": consume}


# -- kafka-python and aiokafka (keyword arguments) ------------------------------------------------------
def _python_configs(configs: dict, bootstrap: str, session_ms: int, consumer: bool) -> dict:
    configs = {k: v for k, v in configs.items() if not k.startswith(_PY_TLS_SASL)}
    configs.update(bootstrap_servers=bootstrap, security_protocol="PLAINTEXT")
    if consumer:
        session = min(_int(configs.get("session_timeout_ms"), session_ms), session_ms)
        configs["session_timeout_ms"] = session
        configs["heartbeat_interval_ms"] = max(1, min(_int(configs.get("heartbeat_interval_ms"), 3000), session // 3))
        if _auto_commit_ms:
            configs["auto_commit_interval_ms"] = min(_int(configs.get("auto_commit_interval_ms"), 5000), _auto_commit_ms)
    return configs


def _patch_classes(classes, bootstrap: str, session_ms: int) -> None:
    for cls, consumer in classes:
        if cls is None or getattr(cls.__init__, "_retrylab", False):
            continue
        original = cls.__init__

        def __init__(self, *args, _original=original, _consumer=consumer, **configs):
            configs = _python_configs(configs, bootstrap, session_ms, _consumer)
            _original(self, *args, **configs)
            if _consumer:
                self._retrylab_step = _step(configs["session_timeout_ms"])

        __init__._retrylab = True
        cls.__init__ = __init__


def _seconds(timeout_ms):
    """A timeout in ms as seconds, or None for what is no number (the client's own call then refuses it)."""
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)):
        return None
    return timeout_ms / 1000


def _patch_kafka_python(module, bootstrap: str, session_ms: int) -> None:
    consumer = getattr(module, "KafkaConsumer", None)
    _patch_classes([(getattr(module, "KafkaProducer", None), False), (consumer, True),
                    (getattr(module, "KafkaAdminClient", None), False), (getattr(module, "KafkaClient", None), False)],
                   bootstrap, session_ms)
    real_waits("kafka")
    if consumer is None or getattr(consumer.poll, "_retrylab", False):
        return
    original = consumer.poll

    # its iterator polls through poll() too (with consumer_timeout_ms, or no timeout: a real wait)
    def poll(self, timeout_ms=0, max_records=None, update_offsets=True):
        def poll_for(seconds):
            return original(self, timeout_ms=seconds * 1000, max_records=max_records, update_offsets=update_offsets)
        plan = _paused_polls(_seconds(timeout_ms), lambda: bool(self.paused()),
                             getattr(self, "_retrylab_step", _STEP_MAX))
        if plan is None:
            return original(self, timeout_ms=timeout_ms, max_records=max_records, update_offsets=update_offsets)
        return _poll_through(plan, poll_for, lambda records: not records)

    poll._retrylab = True
    poll.__doc__ = original.__doc__
    consumer.poll = poll


def _patch_aiokafka(module, bootstrap: str, session_ms: int) -> None:
    # the producer, the consumer and the admin client all bootstrap through AIOKafkaClient
    consumer = getattr(module, "AIOKafkaConsumer", None)
    _patch_classes([(getattr(module, "AIOKafkaClient", None), False), (getattr(module, "AIOKafkaProducer", None), False),
                    (consumer, True)], bootstrap, session_ms)
    real_waits("aiokafka")
    # the admin client's modules are imported apart, when a learner first asks for them: theirs too
    after_import("aiokafka.admin.client", lambda admin: real_waits("aiokafka"))
    if consumer is None or getattr(consumer.getmany, "_retrylab", False):
        return
    original = consumer.getmany

    # getone() has no timeout: it waits for a record, which no virtual time brings
    async def getmany(self, *partitions, timeout_ms=0, max_records=None):
        def poll_for(seconds):
            return original(self, *partitions, timeout_ms=seconds * 1000, max_records=max_records)
        plan = _paused_polls(_seconds(timeout_ms), lambda: bool(self.paused()),
                             getattr(self, "_retrylab_step", _STEP_MAX))
        if plan is None:
            return await original(self, *partitions, timeout_ms=timeout_ms, max_records=max_records)
        return await _poll_through_async(plan, poll_for, lambda records: not records)

    getmany._retrylab = True
    getmany.__doc__ = original.__doc__
    consumer.getmany = getmany


# -- the loopback forwarder (sandboxes with their own network namespace) ------------------------------
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _SIOCSIFADDR, _IFF_UP = 0x8913, 0x8914, 0x8916, 0x1


def _resolvable() -> bool:
    """Whether librdkafka can resolve 127.0.0.1 here. It asks getaddrinfo with AI_ADDRCONFIG, which glibc
    answers only where an IPv4 address other than 127.0.0.1 is configured: in a namespace that has just its
    loopback interface (up or not), "127.0.0.1" is "Name or service not known"."""
    try:
        socket.getaddrinfo("127.0.0.1", None, socket.AF_INET, socket.SOCK_STREAM, 0, socket.AI_ADDRCONFIG)
        return True
    except socket.gaierror:
        return False


def _configure_loopback() -> None:
    """Bring the loopback interface up and give it a second address, 127.0.0.2 (see _resolvable). Raises
    PermissionError without the right to (CAP_NET_ADMIN over this network namespace)."""
    import errno
    import fcntl
    import struct
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock, _SIOCGIFFLAGS, struct.pack("16sH22x", b"lo", 0)))[1]
        if not flags & _IFF_UP:
            fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))
        try:
            fcntl.ioctl(sock, _SIOCSIFADDR, struct.pack("16sHH4s16x", b"lo:retrylab", socket.AF_INET, 0,
                                                        socket.inet_aton("127.0.0.2")))
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                raise


def _own_network_namespace() -> None:
    """Move this (still single-threaded) process into new user and network namespaces, keeping its uid and
    gid, where it may bring its own loopback up: no capability is needed for that, and it reaches nothing
    the namespace it leaves could reach (which was nothing at all)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(0x10000000 | 0x40000000) != 0:     # CLONE_NEWUSER | CLONE_NEWNET
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER|CLONE_NEWNET)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    for sock in (src, dst):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _serve(listener: socket.socket, socket_path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(socket_path)
        except OSError:
            client.close()
            upstream.close()
            continue
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_pipe, args=(client, upstream), daemon=True).start()
        threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()


def _forward(bootstrap: str, socket_path: str) -> None:
    host, _, port = bootstrap.rpartition(":")
    if not _resolvable():
        try:
            _configure_loopback()
        except PermissionError:
            _own_network_namespace()
            _configure_loopback()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, int(port)))
    except OSError:             # another process of this run listens there already and serves this one too
        listener.close()
        return
    listener.listen(128)
    threading.Thread(target=_serve, args=(listener, socket_path), daemon=True, name="retrylab-kafka-forward").start()


# auto-commit every this many ms at most (RETRYLAB_KAFKA_AUTO_COMMIT_MS; 0: the client's own, 5000 in all three):
# a check of what a kill loses sees an offset auto-committed before its record was handled within a second
_auto_commit_ms = 0


def install() -> None:
    global _auto_commit_ms
    bootstrap = os.environ.get("RETRYLAB_KAFKA_BOOTSTRAP", "")
    if not bootstrap:
        return
    _auto_commit_ms = max(0, _int(os.environ.get("RETRYLAB_KAFKA_AUTO_COMMIT_MS"), 0))
    session_ms = _int(os.environ.get("RETRYLAB_KAFKA_SESSION_TIMEOUT_MS"), 6000)
    socket_path = os.environ.get("RETRYLAB_KAFKA_SOCKET", "")
    if socket_path:
        _forward(bootstrap, socket_path)
    after_import("confluent_kafka.cimpl", lambda m: _patch_confluent(m, bootstrap, session_ms))
    after_import("kafka", lambda m: _patch_kafka_python(m, bootstrap, session_ms))
    after_import("aiokafka", lambda m: _patch_aiokafka(m, bootstrap, session_ms))
