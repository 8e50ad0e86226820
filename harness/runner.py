"""Running one learner script against a private Redis, and watching it while it runs.

`LearnerRunner.run` ties the pieces together: the sandbox (a contained subprocess in a copy of the
submission), the recording proxy in front of the private Redis (every command the script sends),
and the instrumented taskproc's call log. A stop condition sees a live `Progress` and decides when
a worker that never exits has done all it is going to do.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import redis

from retrylab import keyspace
from retrylab.backends import Endpoint
from retrylab.calllog import Call, CallLog
from retrylab.proxy import Command, RecordingProxy
from retrylab.sandbox import Limits, Sandbox, ScriptResult

TASKPROC = Path(__file__).resolve().parent.parent / "fixtures" / "taskproc.py"
try:  # installed (non-editable): fixtures live inside the package
    import retrylab.fixtures as _fixtures
    TASKPROC = Path(_fixtures.__file__).resolve().parent / "taskproc.py"
except ImportError:  # pragma: no cover
    pass


@dataclass(frozen=True)
class ScriptRun:
    """What one run of a learner script did."""
    result: ScriptResult | None     # None: the script does not exist in the submission
    calls: tuple[Call, ...]
    commands: tuple[Command, ...]

    @property
    def missing(self) -> bool:
        return self.result is None


class Progress:
    """A live view of a running script, for stop conditions."""

    def __init__(self, client: redis.Redis, calllog: CallLog, proxy: RecordingProxy):
        self.client = client
        self.calllog = calllog
        self.proxy = proxy
        self._signature = None
        self._changed_at = time.monotonic()

    def calls(self) -> list[Call]:
        return self.calllog.calls()

    def keyspace(self) -> dict[bytes, keyspace.KeyContent]:
        return keyspace.dump(self.client)

    def quiet_for(self) -> float:
        """Seconds since the keyspace's shape or the call log last changed."""
        signature = (keyspace.shape(self.client), len(self.calllog.calls()))
        now = time.monotonic()
        if signature != self._signature:
            self._signature, self._changed_at = signature, now
        return now - self._changed_at


StopCondition = Callable[[Progress], bool]


class LearnerRunner:
    def __init__(self, submission: Path, limits: Limits = Limits()):
        self.submission = Path(submission)
        self.limits = limits

    def run(self, script: str, endpoint: Endpoint, *, timeout: float,
            stop_when: StopCondition | None = None) -> ScriptRun:
        if not (self.submission / script).is_file():
            return ScriptRun(result=None, calls=(), commands=())
        with tempfile.TemporaryDirectory(prefix="retrylab-log-") as logdir, \
                RecordingProxy((endpoint.host, endpoint.port)) as proxy, \
                Sandbox(self.submission, self.limits) as sandbox, \
                endpoint.client() as client:
            calllog = CallLog(Path(logdir) / "calls.jsonl")
            progress = Progress(client, calllog, proxy)
            env = {"RETRYLAB_REDIS_HOST": proxy.address[0], "RETRYLAB_REDIS_PORT": str(proxy.address[1]),
                   "REDIS_URL": f"redis://{proxy.address[0]}:{proxy.address[1]}/0",
                   "RETRYLAB_TASKPROC": str(TASKPROC), "RETRYLAB_CALL_LOG": str(calllog.path)}
            condition = (lambda: stop_when(progress)) if stop_when else None
            result = sandbox.run(script, env=env, timeout=timeout, stop_when=condition)
            return ScriptRun(result=result, calls=tuple(calllog.calls()), commands=tuple(proxy.commands()))
