"""Send every Kafka client of a learner process to the check's private broker: the kafka broker's
learner-side redirect, which the learner site loads by its path (RETRYLAB_BROKER_REDIRECT, set by KafkaLink).

Whatever bootstrap address the learner wrote (or KAFKA_BOOTSTRAP_SERVERS said), confluent-kafka, kafka-python
and aiokafka clients bootstrap from RETRYLAB_KAFKA_BOOTSTRAP, in plain text (TLS and SASL settings are
dropped); the harness's relay there rewrites the broker address in metadata to the same one, so no client
leaves that way. Every consumer gets session.timeout.ms of RETRYLAB_KAFKA_SESSION_TIMEOUT_MS at most (and a
heartbeat a third of it): Tansu takes about half the session timeout to complete a group join.

In a sandbox with its own network namespace (RETRYLAB_KAFKA_SOCKET set) there is no network: this process
listens on RETRYLAB_KAFKA_BOOTSTRAP itself, on loopback, and forwards each connection to the relay's unix
socket (librdkafka speaks TCP only). That needs the namespace's loopback up, with a second address (see
`_resolvable`); where this process may not set that up, it first moves into a network namespace of its own
(in a user namespace, where it may); processes it starts inherit it. The first process of a namespace to
listen serves the others.

Cheap and self-contained: imports the standard library and learner_site only, and patches the client
libraries when (if ever) the learner imports them.
"""
import os
import socket
import threading
from collections.abc import Mapping

from retrylab.learner_site.import_hooks import after_import

_TLS_SASL = ("ssl.", "sasl.")
_PY_TLS_SASL = ("ssl_", "sasl_")


def _int(value, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


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
    return conf


def _patch_confluent(cimpl, bootstrap: str, session_ms: int) -> None:
    # The C types' own names: confluent_kafka's __init__ (and SerializingProducer, AdminClient, the asyncio
    # wrappers) take them from cimpl right after it loads, so they all get these subclasses.
    for name in ("Producer", "Consumer", "ShareConsumer", "_AdminClientImpl"):
        base = getattr(cimpl, name, None)
        if base is None:
            continue

        # a classic group consumer (a ShareConsumer's share group has no session timeout to set)
        def __init__(self, *args, _base=base, _consumer=name == "Consumer", **kwargs):
            given = bool(args) and isinstance(args[0], Mapping)
            conf = dict(args[0]) if given else {}
            rest = args[1:] if given else args
            for key in [k for k in kwargs if "." in k]:   # Producer(**{"bootstrap.servers": ...})
                conf[key] = kwargs.pop(key)
            _base.__init__(self, _librdkafka_conf(conf, bootstrap, session_ms, _consumer), *rest, **kwargs)

        patched = type(name, (base,), {"__init__": __init__, "__doc__": base.__doc__, "__module__": base.__module__})
        patched.__qualname__ = base.__qualname__
        setattr(cimpl, name, patched)


# -- kafka-python and aiokafka (keyword arguments) ------------------------------------------------------
def _python_configs(configs: dict, bootstrap: str, session_ms: int, consumer: bool) -> dict:
    configs = {k: v for k, v in configs.items() if not k.startswith(_PY_TLS_SASL)}
    configs.update(bootstrap_servers=bootstrap, security_protocol="PLAINTEXT")
    if consumer:
        session = min(_int(configs.get("session_timeout_ms"), session_ms), session_ms)
        configs["session_timeout_ms"] = session
        configs["heartbeat_interval_ms"] = max(1, min(_int(configs.get("heartbeat_interval_ms"), 3000), session // 3))
    return configs


def _patch_classes(classes, bootstrap: str, session_ms: int) -> None:
    for cls, consumer in classes:
        if cls is None or getattr(cls.__init__, "_retrylab", False):
            continue
        original = cls.__init__

        def __init__(self, *args, _original=original, _consumer=consumer, **configs):
            _original(self, *args, **_python_configs(configs, bootstrap, session_ms, _consumer))

        __init__._retrylab = True
        cls.__init__ = __init__


def _patch_kafka_python(module, bootstrap: str, session_ms: int) -> None:
    _patch_classes([(getattr(module, "KafkaProducer", None), False), (getattr(module, "KafkaConsumer", None), True),
                    (getattr(module, "KafkaAdminClient", None), False), (getattr(module, "KafkaClient", None), False)],
                   bootstrap, session_ms)
    _real_event_waits("kafka")


def _real_event_waits(package: str) -> None:
    """Give the package's modules a `threading` whose Event waits in real time. The virtual clock makes a
    timed Event.wait a virtual sleep (learner code's `stop.wait(backoff)`); kafka-python waits that way for
    its own I/O thread (flush, send().get(), metadata before a send), which then failed at once."""
    import sys
    import threading
    import types

    class Event(threading.Event):
        def wait(self, timeout=None):   # CPython's own Event.wait
            with self._cond:
                signaled = self._flag
                if not signaled:
                    signaled = self._cond.wait(timeout)
                return signaled

    shim = types.ModuleType("threading")
    shim.__dict__.update(threading.__dict__)
    shim.Event = Event
    for name, module in list(sys.modules.items()):
        if (name == package or name.startswith(package + ".")) and getattr(module, "threading", None) is threading:
            module.threading = shim


def _patch_aiokafka(module, bootstrap: str, session_ms: int) -> None:
    # the producer, the consumer and the admin client all bootstrap through AIOKafkaClient
    _patch_classes([(getattr(module, "AIOKafkaClient", None), False), (getattr(module, "AIOKafkaProducer", None), False),
                    (getattr(module, "AIOKafkaConsumer", None), True)], bootstrap, session_ms)


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


def install() -> None:
    bootstrap = os.environ.get("RETRYLAB_KAFKA_BOOTSTRAP", "")
    if not bootstrap:
        return
    session_ms = _int(os.environ.get("RETRYLAB_KAFKA_SESSION_TIMEOUT_MS"), 6000)
    socket_path = os.environ.get("RETRYLAB_KAFKA_SOCKET", "")
    if socket_path:
        _forward(bootstrap, socket_path)
    after_import("confluent_kafka.cimpl", lambda m: _patch_confluent(m, bootstrap, session_ms))
    after_import("kafka", lambda m: _patch_kafka_python(m, bootstrap, session_ms))
    after_import("aiokafka", lambda m: _patch_aiokafka(m, bootstrap, session_ms))
