"""Running one learner script against a private Redis, and watching it while it runs.

`LearnerRunner.run` ties the pieces together: the sandbox (a contained subprocess in a copy of the
submission), the recording proxy in front of the private Redis (every command the script sends),
and the application channel (every call of the exercise's instrumented module, decided and recorded
by the harness, and the run's virtual clock). A stop condition sees a live `Progress` and decides
when a worker that never exits has done all it is going to do.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import redis

from retrylab import i18n, keyspace
from retrylab.appchannel import AppChannel, Application, RunClock, VirtualTime
from retrylab.backends import Endpoint
from retrylab.calllog import Call
from retrylab.limits import RUN_MARGIN, StepClock
from retrylab.proxy import Command, RecordingProxy
from retrylab.relay_guard import AdminGuard
from retrylab.sandbox import Limits, Sandbox, ScriptResult

# The application a run gets when its check names none (scripts that seed nothing: replay.py, tests):
# "module:factory", imported when first needed. A check passes its own with what it seeded.
DEFAULT_APPLICATION = "retrylab.fixtures.taskproc_app:TaskprocApp"


def default_application() -> Application:
    module, _, factory = DEFAULT_APPLICATION.partition(":")
    return getattr(importlib.import_module(module), factory)()


@dataclass(frozen=True)
class RunTiming:
    """Where one learner run's real time went, in seconds (for benchmarks; recording it is free)."""
    script: str
    prepare: float              # copying the submission, starting the recording proxy
    first_command: float | None  # process start to its first Redis command (interpreter, imports, connect)
    run: float                  # the process's whole life, start to exit or stop
    settle: float               # of `run`: waiting after the last change before deciding a worker had settled
    cleanup: float              # stopping the process group, closing the proxy, removing the copy


@dataclass(frozen=True)
class ScriptRun:
    """What one run of a learner script did."""
    result: ScriptResult | None     # None: the script does not exist in the submission
    calls: tuple[Call, ...]
    commands: tuple[Command, ...]
    timing: RunTiming | None = None
    call_limit: int | None = None   # the run was stopped for making more calls than this

    @property
    def missing(self) -> bool:
        return self.result is None


class Progress:
    """A live view of a running script, for stop conditions."""

    def __init__(self, client: redis.Redis, channel: AppChannel, proxy: RecordingProxy):
        self.client = client
        self.channel = channel
        self.proxy = proxy
        self._signature = None
        self._changed_at = time.monotonic()
        self.stopped_at: float | None = None    # when the stop condition said "settled"

    def calls(self) -> list[Call]:
        return self.channel.calls()

    def keyspace(self) -> dict[bytes, keyspace.KeyContent]:
        return keyspace.dump(self.client)

    def quiet_for(self) -> float:
        """Seconds since the keyspace's shape or the record of calls last changed."""
        signature = (keyspace.shape(self.client), len(self.channel.record))
        now = time.monotonic()
        if signature != self._signature:
            self._signature, self._changed_at = signature, now
        return now - self._changed_at

    def settle_wait(self) -> float:
        """How long the stop condition waited after the last change it saw."""
        if self.stopped_at is None or self._signature is None:  # exited by itself, or stopped on another ground
            return 0.0
        return max(0.0, self.stopped_at - self._changed_at)


StopCondition = Callable[[Progress], bool]


class LearnerRunner:
    def __init__(self, submission: Path, limits: Limits = Limits(), clock: StepClock | None = None):
        self.submission = Path(submission)
        self.limits = limits
        self.clock = clock      # the current step's time limit, when run under the plugin

    def run(self, script: str, endpoint: Endpoint, *, timeout: float,
            stop_when: StopCondition | None = None, app: Application | None = None,
            run_clock: RunClock | None = None) -> ScriptRun:
        """Run `script` until it exits, `stop_when` says it has settled, it makes more calls of the
        application than the channel allows, or `timeout` seconds pass (fewer if the current step's
        time limit comes first: the run is then cut short and the clock is told, so the step fails
        for its time limit). `app` decides the application module's calls (by default
        DEFAULT_APPLICATION's, knowing no seeded message); `run_clock` is the run's virtual clock."""
        if not (self.submission / script).is_file():
            return ScriptRun(result=None, calls=(), commands=())
        left = self.clock.remaining() if self.clock else None
        by_step_limit = left is not None and left - RUN_MARGIN < timeout
        if by_step_limit:
            timeout = max(0.0, left - RUN_MARGIN)
        began = time.monotonic()
        app = app or default_application()
        run_clock = run_clock or RunClock()
        # TIME answers in the run's virtual time (a worker may take first_seen_at from Redis)
        guard = VirtualTime(run_clock, AdminGuard(endpoint.db, shared=endpoint.shared))
        with RecordingProxy((endpoint.host, endpoint.port), intercept=guard) as proxy, \
                Sandbox(self.submission, self.limits) as sandbox, \
                AppChannel(sandbox.socket_path("app.sock"), app, run_clock) as channel, \
                endpoint.client() as client:
            progress = Progress(client, channel, proxy)
            env = {"RETRYLAB_REDIS_HOST": proxy.address[0], "RETRYLAB_REDIS_PORT": str(proxy.address[1]),
                   "RETRYLAB_REDIS_DB": str(endpoint.db),
                   "REDIS_URL": f"redis://{proxy.address[0]}:{proxy.address[1]}/{endpoint.db}",
                   "RETRYLAB_APP_MODULE": app.module, "RETRYLAB_APP_STUB": str(app.stub),
                   "RETRYLAB_APP_SOCKET": str(channel.path)}
            if sandbox.isolated:  # no network in its namespace: the relay's unix socket is the only way out
                socket_path = sandbox.socket_path("redis.sock")
                proxy.serve_unix(socket_path)
                env.update(RETRYLAB_REDIS_SOCKET=str(socket_path),
                           REDIS_URL=f"unix://{socket_path}?db={endpoint.db}")
            # a server the user named (url backend) may need them; the proxy relays bytes as they are
            env.update({f"RETRYLAB_REDIS_{k.upper()}": v for k, v in
                        (("username", endpoint.username), ("password", endpoint.password)) if v})

            def settled() -> bool:  # stop_when, noting when it said yes (for RunTiming.settle)
                if channel.over_limit:
                    return True     # a flood of calls: stopped whatever the learner is doing
                if stop_when is not None and stop_when(progress):
                    progress.stopped_at = time.monotonic()
                    return True
                return False
            prepared, wall_start = time.monotonic(), time.time()
            with self.clock.shielded() if self.clock else contextlib.nullcontext():
                result = sandbox.run(script, env=env, timeout=timeout, stop_when=settled)
            done = ScriptRun(result=result, calls=tuple(channel.calls()), commands=tuple(proxy.commands()),
                             call_limit=channel.record.limit if channel.over_limit else None)
            finished = time.monotonic()
        first = done.commands[0].at - wall_start if done.commands else None
        timing = RunTiming(script=script, prepare=prepared - began, first_command=first, run=result.seconds,
                           settle=progress.settle_wait(), cleanup=time.monotonic() - finished)
        if self.clock:
            self.clock.timings.append(timing)
            if by_step_limit and result.stopped == "timeout":
                self.clock.cut(i18n.label("run.cut", script=script))
        return dataclasses.replace(done, timing=timing)
