"""What containment this machine allows a learner's script: measured by trying each way, strongest first.

As root, a fresh unprivileged uid per run; a pids cgroup per run where one can be made; namespaces of
its own through bubblewrap where it is installed, else unshare(2) directly. A way counts only if a
learner process really runs with it (`detect` is given that test: the sandbox runs a probe script).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass
from typing import Callable

from retrylab import cgroups, warmstart

NAMESPACES_VARIABLE = "RETRYLAB_NAMESPACES"  # "bwrap", "unshare" or "none": use only that (CI runs each)
_NAMESPACE_KINDS = ("bwrap", "unshare")


@dataclass(frozen=True)
class Containment:
    """How learner scripts are contained here. `detect()` measures it; tests may force a weaker one."""
    unprivileged_uid: bool = False    # root: run each script as a fresh uid (needs the probe to pass)
    cgroups: tuple[str, ...] = ()     # parent directories under which a pids cgroup per run is made
    notes: tuple[str, ...] = ()       # why something is not used (shown by `describe`)
    namespaces: str = ""              # "bwrap", "unshare" (own mount/net/IPC/PID/UTS namespaces), "": none
    bwrap: str = ""                   # the bubblewrap executable (namespaces == "bwrap")
    transient: bool = False           # a stronger way failed for a transient reason (TransientProblem): not kept

    @property
    def isolated(self) -> bool:
        """Whether the script has namespaces of its own (else isolation is partial: it shares the
        machine's network, /proc, IPC and scratch folders)."""
        return bool(self.namespaces)

    def describe(self) -> str:
        parts = ["supervisor with subreaper (kills every descendant)"]
        if self.namespaces:
            how = "bubblewrap" if self.namespaces == "bwrap" else "unshare(2)"
            parts.append(f"own mount, network, IPC, PID and UTS namespaces ({how}): no network but its "
                         f"broker's unix socket")
        else:
            parts.append("isolation is partial: no namespaces of its own")
        if self.unprivileged_uid:
            parts.append("a fresh unprivileged uid per run (RLIMIT_NPROC, kill by uid)")
        else:
            if os.geteuid() == 0:
                parts.append("root without capabilities")
            else:
                parts.append("this user's own uid (RLIMIT_NPROC above the tasks it runs)")
            if self.cgroups:
                parts.append(f"a pids cgroup per run under {', '.join(self.cgroups)}")
            elif os.geteuid() == 0:
                parts.append("no cgroup: the supervisor counts processes")
        return "; ".join(parts) + "".join(f"\n  note: {n}" for n in self.notes)


class TransientProblem(str):
    """Why a way did not work that says nothing lasting of the machine: the probe ran out of time, was killed, or
    met a machine out of processes, memory or descriptors at that moment (a busy machine; a learner's run beside
    it, even). The weaker containment it leads to serves the process that measured it for a minute at most
    (sandbox.containment), not the gradings it forks, and containment_cache does not keep it: the next grading
    measures again rather than run weaker for a while."""


def detect(problem: Callable[[Containment], str]) -> Containment:
    """The strongest containment that works here; `problem(candidate)` is '' if a learner process
    runs with `candidate`, else the reason it does not (a TransientProblem where that reason may not last)."""
    transient = False

    def tried(candidate: Containment) -> str:
        nonlocal transient
        why = problem(candidate)
        transient = transient or isinstance(why, TransientProblem)
        return why

    found = _strongest(tried)
    return dataclasses.replace(found, transient=True) if transient else found


def _strongest(problem: Callable[[Containment], str]) -> Containment:
    if os.geteuid() != 0:
        base = Containment(cgroups=cgroups.usable(), notes=("not root: scripts run as this user",))
        return _with_namespaces(base, problem)
    notes = []
    usable = cgroups.usable()
    if not usable:
        notes.append("no writable pids cgroup: the supervisor counts processes instead")
    why = problem(Containment(unprivileged_uid=True, cgroups=usable))
    if why:
        notes.append(f"an unprivileged uid does not work here ({why}): scripts run as root "
                     f"without capabilities")
        return _with_namespaces(Containment(cgroups=usable, notes=tuple(notes)), problem)
    return _with_namespaces(Containment(unprivileged_uid=True, cgroups=usable, notes=tuple(notes)), problem)


def _with_namespaces(base: Containment, problem: Callable[[Containment], str]) -> Containment:
    """`base` with the first way of giving scripts namespaces of their own that works here:
    bubblewrap where it is installed, else unshare(2) directly (RETRYLAB_NAMESPACES picks one)."""
    wanted = os.environ.get(NAMESPACES_VARIABLE, "").strip().lower()
    # warm start forks learner processes from a template: bubblewrap, which must exec, would start them cold
    preferred = tuple(reversed(_NAMESPACE_KINDS)) if warmstart.enabled() else _NAMESPACE_KINDS
    kinds = preferred if wanted in ("", "auto") else tuple(k for k in _NAMESPACE_KINDS if k == wanted)
    notes = list(base.notes)
    for kind in kinds:
        bwrap = (shutil.which("bwrap") or "") if kind == "bwrap" else ""
        if kind == "bwrap" and not bwrap:
            notes.append("bubblewrap (bwrap) is not installed")
            continue
        candidate = dataclasses.replace(base, namespaces=kind, bwrap=bwrap)
        why = problem(candidate)
        if not why:
            return dataclasses.replace(candidate, notes=tuple(notes))
        notes.append(f"namespaces through {kind} do not work here ({why})")
    if wanted == "none":
        notes.append(f"namespaces turned off ({NAMESPACES_VARIABLE}=none)")
    elif wanted and wanted not in ("auto", *_NAMESPACE_KINDS):
        notes.append(f"{NAMESPACES_VARIABLE}={wanted!r} is not one of bwrap, unshare, none")
    return dataclasses.replace(base, notes=tuple(notes))
