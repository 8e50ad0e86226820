"""notify, with retries that hang: the application of step 7's run (run_durable.py).

While `armed`, the second call for a target order never returns (NotifierApp.hang: the learner's process
blocks in it, in real time), so the harness can kill the consumers in the middle of a retry. The hang is
decided in the same breath as the call (under one lock, whichever consumer's channel asks), so a retry that
comes a millisecond after the first failure cannot slip past it; once disarmed (before the restart) no call
hangs any more.
"""
from __future__ import annotations

import threading

from retrylab.appchannel import Argument, Decision
from retrylab.fixtures.retry_topics.notifier_app import NotifierApp

HUNG_CALL = 2       # the first retry: the one a retry topic (or a thread in memory) makes


class HangingRetries:
    def __init__(self, notifier: NotifierApp):
        self.notifier = notifier
        self.module, self.stub, self.functions = notifier.module, notifier.stub, notifier.functions
        self.targets: set[str] = set()
        self.armed = True
        self._lock = threading.Lock()

    @property
    def hung(self) -> list[tuple[str, int]]:
        """(order id, call number) of every call that hung."""
        return list(self.notifier.hung)

    def target(self, *order_ids: str) -> None:
        with self._lock:
            self.targets.update(order_ids)

    def disarm(self) -> None:
        with self._lock:
            self.armed = False

    def decide(self, fn: str, args: tuple[Argument, ...]) -> Decision:
        payload = args[0].value if len(args) == 1 and args[0].decoded else None
        order = payload.get("orderId") if isinstance(payload, dict) else None
        with self._lock:
            if self.armed and order in self.targets and self.notifier.calls[order] == HUNG_CALL - 1:
                self.notifier.hang(order)
            return self.notifier.decide(fn, args)
