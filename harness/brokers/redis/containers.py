"""Redis containers on a Docker engine, for `--backend container` (docker-py, the Docker SDK).

Why not testcontainers' RedisContainer: it pulls a missing image behind the caller's back, polls
readiness once a second and waits two minutes on a container that has already exited, and its
reaper (Ryuk) is an image of its own, which an engine without a registry cannot pull. Here:

- the image must be on the engine (`retrylab/redis`, made by `python -m retrylab.brokers.redis.container_image`
  from this machine's redis-server) or be pullable; otherwise one line says which and how to fix it;
- a container is ready when its Redis answers through the mapped port (polled every 50 ms); one that
  exits first is reported at once with the last line it logged;
- the port is published on 127.0.0.1 only (an unauthenticated Redis is not for the network) when the
  engine is on this machine;
- every container carries labels naming the grading process that owns it (machine, pid, start time).
  The grading removes its containers when it ends, also on SIGTERM and at interpreter exit; one
  killed outright (SIGKILL) leaves them behind, and the next grading on this machine removes every
  labelled container whose owner process is gone (`sweep_stale`).
"""
from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import threading
import time
import uuid
import urllib.parse

import redis

from retrylab.brokers import BackendUnavailable
from retrylab.brokers.redis.endpoint import Endpoint
from retrylab.brokers.redis.container_image import DEFAULT_IMAGE, REPOSITORY

REDIS_PORT = "6379/tcp"
# --save "" / --appendonly no: nothing on disk; protected mode off: clients come through the port
# mapping (docker-proxy or NAT), not from the container's loopback.
REDIS_COMMAND = ["redis-server", "--port", "6379", "--bind", "0.0.0.0", "--protected-mode", "no",
                 "--save", "", "--appendonly", "no"]
LABEL_MACHINE = "org.retrylab.owner.machine"
LABEL_PID = "org.retrylab.owner.pid"
LABEL_STARTED = "org.retrylab.owner.started"   # the owner's start time (clock ticks since boot): a reused pid is not it
LABEL_REQUEST = "org.retrylab.request"         # the create request that made it (a container whose id never arrived)
READY_LIMIT = 60.0       # wall seconds for a started container to answer: an outer bound for a loaded machine
PING_TIMEOUT = 10.0      # seconds for the engine to answer a ping
API_TIMEOUT = 120.0      # seconds for any other engine request (creating a container on a loaded machine)
REMOVE_LIMIT = 30.0      # seconds to wait for a container being removed to be gone
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", ""}


def image_name() -> str:
    """The image the backend runs: RETRYLAB_REDIS_IMAGE, else the one made from this machine's redis-server."""
    return os.environ.get("RETRYLAB_REDIS_IMAGE") or DEFAULT_IMAGE


def whole_reason(exc: BaseException) -> str:
    """An engine error on one line, whole (the engine's own explanation rather than the HTTP wrapper)."""
    text = getattr(exc, "explanation", None) or str(exc)
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return " ".join(str(text).split()) or type(exc).__name__


def docker_engine():
    """A docker-py client for an engine that answers, or BackendUnavailable (within seconds)."""
    try:
        import docker
    except ImportError:
        raise BackendUnavailable("the container backend needs the Docker SDK:"
                                 " pip install 'retrylab[container]'") from None
    try:
        engine = docker.from_env(timeout=PING_TIMEOUT)
        engine.ping()
    except Exception as exc:  # docker.errors.DockerException, requests' errors: all mean "no engine"
        raise BackendUnavailable(f"no Docker engine answers ({whole_reason(exc)}); the container backend"
                                 " needs one: use --backend redis-server or fake") from None
    engine.api.timeout = API_TIMEOUT
    return engine


def ensure_image_present(engine, image: str) -> None:
    """The image is on the engine, pulled now if need be; else BackendUnavailable with the fix."""
    import docker
    try:
        engine.images.get(image)
        return
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.APIError as exc:
        raise BackendUnavailable(f"the Docker engine cannot look up image {image}: {whole_reason(exc)}") from None
    if image.split(":")[0] == REPOSITORY:   # made here, never pulled
        raise BackendUnavailable(f"no image {image} on the Docker engine: make it from this machine's redis-server"
                                 " with `python -m retrylab.brokers.redis.container_image`, or name another image in"
                                 " RETRYLAB_REDIS_IMAGE")
    repository, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "latest")
    try:
        engine.images.pull(repository, tag=tag)
    except docker.errors.APIError as exc:
        raise BackendUnavailable(f"cannot pull image {image}: {whole_reason(exc)}; make the local image with"
                                 " `python -m retrylab.brokers.redis.container_image` and unset RETRYLAB_REDIS_IMAGE") from None


# --------------------------------------------------------------------------------------------
# who owns a container

def _machine() -> str:
    """This machine (and boot): pids mean something only here, and until the next boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}"


def _started(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (field 22 of /proc/PID/stat); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def owner_labels() -> dict[str, str]:
    pid = os.getpid()
    return {LABEL_MACHINE: _machine(), LABEL_PID: str(pid), LABEL_STARTED: _started(pid) or "?"}


def sweep_stale(engine) -> int:
    """Remove this machine's labelled containers whose grading process is gone; how many."""
    # the plain listing: docker-py's containers.list() inspects each one, and fails on one that another
    # grading removes meanwhile
    listed = engine.api.containers(all=True, filters={"label": f"{LABEL_MACHINE}={_machine()}"})
    stale = []
    for container in listed:
        labels = container.get("Labels") or {}
        pid = labels.get(LABEL_PID, "")
        started = _started(int(pid)) if pid.isdigit() else None
        if started is None or started != labels.get(LABEL_STARTED):   # its grading is gone
            stale.append(container["Id"])
    remove_containers(stale)
    return len(stale)


# --------------------------------------------------------------------------------------------
# containers this process must remove, however it ends

class _Owned:
    """This process's containers. Removed by their backend's stop(); whatever is left at interpreter
    exit or on SIGTERM (whose default action would skip every cleanup) is removed then."""

    def __init__(self):
        self._lock = threading.RLock()   # re-entered by the SIGTERM handler if it interrupts add()
        self._ids: set[str] = set()
        self._creating: set[tuple] = set()   # (thread, token) of create requests on their way (set ops need no lock)
        self._hooked = False

    @contextlib.contextmanager
    def creating(self):
        token = (threading.get_ident(), object())
        self._creating.add(token)
        try:
            yield
        finally:
            self._creating.discard(token)

    def add(self, container_id: str) -> None:
        with self._lock:
            self._ids.add(container_id)
            if not self._hooked:
                atexit.register(self.remove_all)
                self._hooked = True

    def discard(self, container_id: str) -> None:
        with self._lock:
            self._ids.discard(container_id)

    def wait_for_other_creates(self) -> None:
        """Until create requests on their way in other threads have their answer (API_TIMEOUT at most):
        a container is created by the engine before its id reaches this process."""
        me = threading.get_ident()
        deadline = time.monotonic() + API_TIMEOUT
        while any(thread != me for thread, _ in list(self._creating)) and time.monotonic() < deadline:
            time.sleep(0.02)

    def remove_all(self) -> None:
        with self._lock:
            ids, self._ids = set(self._ids), set()
        if ids:
            remove_containers(ids)

    def on_sigterm(self, signum, frame) -> None:
        # Let containers being created by other threads come into being (this thread's own request,
        # if it was interrupted, cannot finish before this returns), remove every container labelled
        # as this process's, then die of SIGTERM as this process would have without the handler,
        # whatever happened meanwhile.
        try:
            self.wait_for_other_creates()
            self.remove_all()
            remove_containers(_labelled_as_mine())
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)


def _labelled_as_mine() -> list[str]:
    import docker
    labels = owner_labels()
    with contextlib.suppress(Exception), contextlib.closing(docker.from_env(timeout=API_TIMEOUT)) as engine:
        return [c["Id"] for c in engine.api.containers(all=True, filters={"label": [
            f"{LABEL_MACHINE}={labels[LABEL_MACHINE]}", f"{LABEL_PID}={labels[LABEL_PID]}"]})]
    return []


OWNED = _Owned()


def _remove_made_by(request: str) -> None:
    """Remove the container a create request labelled `request` made, if the engine made one: the request
    was cut (Ctrl-C, SIGTERM, an error) after the engine had acted, so its id may never have arrived and
    it would stay behind, "Created"."""
    import docker
    with contextlib.suppress(Exception), contextlib.closing(docker.from_env(timeout=API_TIMEOUT)) as engine:
        made = [c["Id"] for c in engine.api.containers(all=True, filters={"label": f"{LABEL_REQUEST}={request}"})]
        remove_containers(made)
        for container_id in made:
            OWNED.discard(container_id)


@contextlib.contextmanager
def removed_on_sigterm():
    """While inside, SIGTERM removes this process's containers before it ends the process. Only where
    nothing else handles SIGTERM (a caller that does, e.g. by unwinding, ends the grading properly),
    and only in the main thread (the only one that may set handlers)."""
    installed = False
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, OWNED.on_sigterm)
        installed = True
    try:
        yield
    finally:
        if installed and signal.getsignal(signal.SIGTERM) == OWNED.on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def remove_containers(ids) -> None:
    """Force-remove containers by id and wait until they are gone, with a client of its own (callable
    from a signal handler: the one the interrupted code was using may be mid-request)."""
    import docker
    ids = list(ids)
    if not ids:
        return
    try:
        engine = docker.from_env(timeout=API_TIMEOUT)
    except Exception:  # noqa: BLE001 - the engine went away: nothing more can be done from here
        return
    with contextlib.closing(engine):
        removers = [threading.Thread(target=_remove, args=(engine, i), daemon=True) for i in ids]
        for remover in removers:   # at once: each removal waits on the engine, not on this machine's CPU
            remover.start()
        for remover in removers:
            remover.join()


def _remove(engine, container_id: str) -> None:
    import docker
    deadline = time.monotonic() + REMOVE_LIMIT
    while time.monotonic() < deadline:
        try:
            engine.api.remove_container(container_id, force=True, v=True)
        except docker.errors.NotFound:
            return
        except docker.errors.APIError:   # "removal already in progress" (another caller): wait for it
            pass
        except Exception:  # noqa: BLE001 - the engine went away
            return
        time.sleep(0.1)


# --------------------------------------------------------------------------------------------
# one container

def _engine_host(engine) -> str:
    """Where published ports of this engine are reached from here."""
    parts = urllib.parse.urlsplit(engine.api.base_url)
    if parts.scheme == "http+docker" or (parts.hostname or "") in LOCAL_HOSTS:   # unix socket, or this machine
        return "127.0.0.1"
    return parts.hostname


def start_redis_container(image: str) -> tuple[str, Endpoint]:
    """Start a Redis container from `image` and wait until it answers: (its id, where it answers).
    BackendUnavailable with the whole reason if it cannot."""
    engine = docker_engine()
    import docker
    with contextlib.closing(engine):
        host = _engine_host(engine)
        binding = ("127.0.0.1",) if host == "127.0.0.1" else None
        request = uuid.uuid4().hex
        try:
            with OWNED.creating():
                container = engine.containers.create(image, command=REDIS_COMMAND,
                                                     labels={**owner_labels(), LABEL_REQUEST: request},
                                                     ports={REDIS_PORT: binding}, detach=True)
                OWNED.add(container.id)
        except BaseException as exc:
            _remove_made_by(request)
            if isinstance(exc, docker.errors.APIError):
                raise BackendUnavailable(f"could not create a Redis container from {image}:"
                                         f" {whole_reason(exc)}") from None
            raise
        try:
            container.start()
            endpoint = Endpoint(host, _published_port(container, image))
            _wait_ready(container, endpoint, image)
        except BaseException as exc:
            OWNED.discard(container.id)
            with contextlib.suppress(Exception):
                container.remove(force=True, v=True)
            if isinstance(exc, docker.errors.APIError):
                raise BackendUnavailable(f"could not start a Redis container from {image}:"
                                         f" {whole_reason(exc)}") from None
            raise
        return container.id, endpoint


def _published_port(container, image: str) -> int:
    container.reload()
    bindings = (container.attrs["NetworkSettings"]["Ports"] or {}).get(REDIS_PORT)
    if not bindings:
        _raise_if_stopped(container, image)   # an exited container publishes nothing
        raise BackendUnavailable(f"the engine published no port for Redis ({REDIS_PORT}) of container"
                                 f" {container.short_id} (state: {container.status})")
    return int(bindings[0]["HostPort"])


def _wait_ready(container, endpoint: Endpoint, image: str) -> None:
    """Until Redis answers PING through the published port. A port mapping accepts connections before
    Redis listens (and closes them): only an answer counts."""
    deadline = time.monotonic() + READY_LIMIT
    while True:
        try:
            with endpoint.client(socket_connect_timeout=2) as client:
                if client.ping():
                    return
        except redis.RedisError:
            pass
        container.reload()
        _raise_if_stopped(container, image)
        if time.monotonic() > deadline:
            raise BackendUnavailable(f"the Redis container from {image} did not answer on {endpoint.url} within"
                                     f" {READY_LIMIT:g} s: {_last_log_line(container)}")
        time.sleep(0.05)


def _raise_if_stopped(container, image: str) -> None:
    if container.status not in ("created", "running"):
        code = container.attrs["State"].get("ExitCode")
        raise BackendUnavailable(f"the Redis container from {image} stopped (exit code {code}) before it"
                                 f" answered: {_last_log_line(container)}")


def _last_log_line(container) -> str:
    with contextlib.suppress(Exception):
        lines = container.logs(tail=5).decode(errors="replace").strip().splitlines()
        if lines:
            return " ".join(lines[-1].split())
    return "it logged nothing"
