"""Brokers: each kind (redis, nats, kafka, ...) in a package of its own under harness/brokers/<kind>/.

The engine knows brokers only through this interface; an exercise names the kind it needs in its
exercise.toml (`broker = "redis"`). A broker package `retrylab.brokers.<kind>` exposes `BROKER`, a
`Broker`, which gives:

- its backends (kinds of private server: e.g. fake, redis-server, url, container) and the options
  they take (`retrylab.options.Option`, declared once for argparse and pytest);
- `fixtures`: the pytest plugin module with its fixtures (an exercise loads it through `pytest_plugins`);
- `learner_imports`: the client libraries learner code imports (the sandbox's probe checks them);
- `warm_imports`: those of them the warm learner template may import ahead (retrylab.warmstart): only a
  library its learner-side redirect patches in place. One whose redirect replaces names that the library's own
  modules bind while they load (confluent_kafka's C types) must be imported after the redirect, so cold;
- through its backends' private servers: `backend.private()` yields an endpoint whose
  `link(sandbox, run_clock)` is what a learner run needs of that server (the recording relay in front
  of it, the learner's environment, the commands seen, a snapshot of the state), see `LearnerLink`.
"""
from __future__ import annotations

import contextlib
import importlib
import threading
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Callable, Protocol


class BackendUnavailable(RuntimeError):
    """The harness cannot provide a server of this kind here (exit status 2, one line)."""


class LearnerLink(Protocol):
    """A learner run's way to its private server: `endpoint.link(sandbox, run_clock)`, a context manager
    entered for one run (inside the run's sandbox) and closed after it."""

    env: dict[str, str]                 # what the learner's process is given to reach the server (among
                                        # it RETRYLAB_BROKER_REDIRECT: the file of the learner-side redirect)
    broker_name: str                    # the broker's name as learners know it ("Redis"), for messages

    def started(self) -> bool:          # whether the learner has sent its first command
        ...

    def commands(self) -> list:         # what the learner sent, in order (the broker's own record type)
        ...

    def received(self) -> list:         # what the server sent the learner, where the relay records it ([]: not)
        ...

    def shape(self) -> Any:             # a cheap, comparable summary of the server's state (progress)
        ...

    def snapshot(self) -> dict:         # the server's whole state, bounded (what checks read)
        ...

    # What stop conditions need to tell a learner blocked in a read (retrylab.settle.blocked): the reads
    # still without a reply, if that is all the learner waits for (None otherwise), as an object with
    # `reads` (records with `read_timeout`, 0.0 for forever, and `same_read(other)`) and `state` (changes
    # whenever anything else crosses the relay); and whether those reads could be answered at once.
    def waiting(self) -> Any:
        ...

    def could_wake(self, reads: list) -> bool:
        ...


class Backend(Protocol):
    name: str
    independent_privates: bool          # two private servers may be in use at once

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def probe(self) -> None: ...        # BackendUnavailable, one line, when it cannot work here
    def private(self) -> contextlib.AbstractContextManager: ...   # yields an endpoint, fresh and empty,
                                                                  # with link(sandbox, run_clock) -> LearnerLink


@dataclass(frozen=True)
class Broker:
    kind: str                                   # "redis"
    backends: tuple[str, ...]                   # what --backend accepts for an exercise on this broker
    default_backend: str                        # the embedded one: needs nothing installed
    private_backends: tuple[str, ...]           # backends that start their own servers (batch, watch)
    make_backend: Callable[..., Backend]        # make_backend(name, **options from `options`)
    fixtures: str                               # pytest plugin module with this broker's fixtures
    learner_imports: tuple[str, ...] = ()       # client libraries learner code imports
    warm_imports: tuple[str, ...] = ()          # of those, what the warm template may import ahead
    # what a grading process imports ahead so that it may fork the servers of `forked_server_backends` rather than
    # start an interpreter for them (the fake Redis server): prepare_to_fork_servers, called by grade-batch's warm
    # processes for every grading they fork and by `retrylab check` before it starts one of those backends
    grading_warm_imports: tuple[str, ...] = ()
    forked_server_backends: tuple[str, ...] = ()
    options: tuple = field(default=())          # retrylab.options.Option, broker-specific (e.g. --redis-url)
    shown_name: str = ""                        # as learners know it ("Redis"), for messages
    # `retrylab verify`: the option (one of `options`) naming the learner's own server, and where that
    # server is when the lab platform names none
    live_option: Any = None
    live_default: str = ""


@cache
def get(kind: str) -> Broker:
    try:
        module = importlib.import_module(f"retrylab.brokers.{kind}")
    except ModuleNotFoundError as exc:
        if exc.name != f"retrylab.brokers.{kind}":
            raise
        raise LookupError(f"unknown broker {kind!r}") from None
    return module.BROKER


# -- the grading's backend, possibly started ahead of pytest ------------------------------------------------

# settings -> (set when the thread starting it is done, None if started in the caller's; [the backend or the exception
# it raised]). An event, not Thread.join(): in Python 3.11 a Ctrl-C landing in join() marks the thread ended while it
# still starts the backend, which then nobody stops (retrylab.background says more).
_early: dict[tuple, tuple[threading.Event | None, list]] = {}
_early_lock = threading.Lock()


def _settings(kind: str, name: str, options: dict) -> tuple:
    return kind, name, tuple(sorted((dest, value) for dest, value in options.items() if value is not None))


def _made_and_started(kind: str, name: str, options: dict) -> Backend:
    backend = get(kind).make_backend(name, **{dest: value for dest, value in options.items() if value is not None})
    backend.start()
    return backend


def start_early(kind: str, name: str, *, fork_servers: bool = False, **options) -> None:
    """Start, in the background, the backend a grading in this process is about to take (started_backend):
    `retrylab check` calls this as soon as it knows the exercise and backend, so the servers start while pytest is
    imported and the checks are collected (the fake Redis server is an interpreter of its own, about 0.25 s).
    `fork_servers`: the caller has no other thread yet (`retrylab check`, a grading forked by grade-batch's warm
    process), so a backend of the broker's `forked_server_backends` may fork its servers from this process rather
    than start interpreters for them: that one is started here, from this thread, before returning."""
    outcome: list = []
    began, done = threading.Event(), threading.Event()

    def start():
        began.set()
        try:
            outcome.append(_made_and_started(kind, name, options))
        except Exception as exc:       # BackendUnavailable among them: the grading that takes it says it
            outcome.append(exc)
        finally:
            done.set()

    in_this_thread = fork_servers and prepare_to_fork_servers(kind, name)
    thread = None if in_this_thread else threading.Thread(target=start, daemon=True, name=f"retrylab-start-{kind}")
    settings = _settings(kind, name, options)
    with _early_lock:
        if settings in _early:
            return
        _early[settings] = (None if thread is None else done, outcome)
    if thread is None:
        start()
        return
    try:
        thread.start()
    except BaseException as exc:
        # "can't start new thread" (the grading that takes it says so), or a Ctrl-C inside start(): unless the thread
        # runs after all, nothing would ever set `done`, and stop_unused() would wait for it for good
        if not began.wait(1.0):
            outcome.append(exc if isinstance(exc, Exception) else BackendUnavailable("the grading was interrupted"))
            done.set()
        if not isinstance(exc, RuntimeError):
            raise


def prepare_to_fork_servers(kind: str, name: str) -> bool:
    """Import what forking the servers of backend `name` needs (Broker.grading_warm_imports) when it is one of the
    broker's forked_server_backends and warm starts are on (RETRYLAB_WARM_START): measured, about 0.3 CPU-s less
    per grading than an interpreter of its own for the server. False when its servers start as interpreters, so
    nothing was imported for them. Whether a fork is safe is decided when a server starts (a single thread then)."""
    from retrylab import warmstart
    broker = get(kind)
    if name not in broker.forked_server_backends or not warmstart.enabled():
        return False
    try:
        for module in broker.grading_warm_imports:
            importlib.import_module(module)
    except ImportError:
        return False     # the interpreter-started server will say what is missing, as a failed grading
    return True


def started_backend(kind: str, name: str, **options) -> Backend:
    """The grading's backend, started: the one start_early began for the same settings (once it has started), else
    one made and started now. BackendUnavailable when it cannot work here."""
    settings = _settings(kind, name, options)
    with _early_lock:
        early = _early.pop(settings, None)
    if early is None:
        return _made_and_started(kind, name, options)
    done, outcome = early
    if done is not None:
        try:
            done.wait()
        except BaseException:   # a Ctrl-C while it starts: put back, for stop_unused() to stop it once started
            with _early_lock:
                _early.setdefault(settings, early)
            raise
    if isinstance(outcome[0], Exception):
        raise outcome[0]
    return outcome[0]


def stop_unused() -> None:
    """Stop what start_early began and no grading took (one that stopped before its first check)."""
    with _early_lock:
        left = list(_early.values())
        _early.clear()
    for done, outcome in left:
        if done is not None:
            done.wait()
        if outcome and not isinstance(outcome[0], Exception):
            outcome[0].stop()
