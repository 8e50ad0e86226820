"""The instrumented taskproc's call log: one JSON line per call of process(msg)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Call:
    t: float              # virtual time when process was called
    id: str | None        # the message id process saw (top level, or in an envelope's payload)
    is_dict: bool
    arg: str              # the argument as JSON text (bounded)
    outcome: str          # "ok" | "error"
    error: str | None
    error_class: str | None = None   # the exception's class name (TimeoutError, HTTPError, ...)
    # The virtual clock's offset at entry: seconds this process had slept or spent in process calls.
    # t - offset is real time, so a gap between calls splits into sleeping and real work.
    offset: float | None = None


class CallLog:
    """Reads the log incrementally, so polling it while a worker runs stays cheap."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._offset = 0
        self._calls: list[Call] = []

    def calls(self) -> list[Call]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return list(self._calls)
        complete = data[:data.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.splitlines():
            call = _parse(line)
            if call is not None:
                self._calls.append(call)
        return list(self._calls)

    def __len__(self) -> int:
        return len(self.calls())


def _parse(line: bytes) -> Call | None:
    try:
        record = json.loads(line)
        return Call(t=float(record["t"]), id=record.get("id"), is_dict=bool(record.get("is_dict")),
                    arg=str(record.get("arg", "")), outcome=str(record["outcome"]),
                    error=record.get("error"), error_class=record.get("error_class"),
                    offset=float(record["offset"]) if record.get("offset") is not None else None)
    except (ValueError, KeyError, TypeError):
        return None  # a torn or foreign line: the log is the harness's, but never trust it blindly
