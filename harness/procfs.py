"""What the harness reads of other processes in Linux's /proc: one place for every scan of it.

A process can end between listing /proc and reading its files, so every read here treats a vanished
process as absent (None, or left out) instead of failing. The host's /proc sees into a learner's
namespaces, so these work on its processes too.

Besides the harness, the supervisor of a learner run (supervisor.py) imports this module as a top-level
`procfs` from its own folder: it may import only cheap standard modules.
"""
from __future__ import annotations

import os

_TICK = os.sysconf("SC_CLK_TCK")


def pids() -> list[int]:
    """Every process (not thread) there is, as far as /proc shows; [] without /proc."""
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def stat_fields(pid: int, tid: int | None = None) -> list[bytes] | None:
    """The fields of /proc/PID/stat (or of a thread's, /proc/PID/task/TID/stat) after the command
    name, which may hold spaces and parentheses: [0] is the state, [1] the parent pid, [11:15] the
    CPU times, [19] the start time. None if the process is gone."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        with open(path, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def parents() -> dict[int, int]:
    """pid -> parent pid of every process."""
    table = {}
    for pid in pids():
        fields = stat_fields(pid)
        if fields and len(fields) > 1:
            table[pid] = int(fields[1])
    return table


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`: from its threads' children lists where the kernel keeps
    them (cheaper than reading every process), else from the whole table."""
    if not os.path.exists(f"/proc/{pid}/task/{pid}/children"):
        return [child for child, parent in parents().items() if parent == pid]
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return found


def descendants(root: int) -> list[int]:
    """Every process below `root` in the process tree (one read of the table)."""
    below: dict[int, list[int]] = {}
    for pid, parent in parents().items():
        below.setdefault(parent, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in below.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def _tree(root: int) -> list[int]:
    """The processes below `root`, read from the children lists where there are some."""
    if not os.path.exists(f"/proc/{root}/task/{root}/children"):
        return descendants(root)
    found, todo = [], children(root)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children(pid))
    return found


def tree_cpu(root: int) -> float:
    """CPU seconds of every process below `root` (their own and their reaped children's), plus what
    `root` reaped (the supervisor, a subreaper, reaps whatever the script leaves): `root`'s own time
    is not counted."""
    own = stat_fields(root)
    if own is None:
        return 0.0
    ticks = int(own[13]) + int(own[14])
    for pid in _tree(root):
        fields = stat_fields(pid)
        ticks += sum(int(t) for t in fields[11:15]) if fields else 0
    return ticks / _TICK


def memory_below(root: int) -> int:
    """Bytes of memory the processes below `root` hold together: their anonymous and shared memory, resident or
    swapped, each page divided among the processes that share it (forked processes share their parent's pages
    until they write them), and the memfd files they have open, each file once (a mapped one is counted twice: an
    over-count only memfd's users pay). What resource limits do not see: they bound one process each, and count
    neither shared memory (RLIMIT_DATA) nor a memfd file that is not mapped (RLIMIT_AS)."""
    total, files = 0, {}
    for pid in _tree(root):
        total += _proportional_memory(pid)
        files.update(_memfd_files(pid))
    return total + sum(files.values())


def _proportional_memory(pid: int) -> int:
    """Pss_Anon + Pss_Shmem + SwapPss of `pid`, in bytes; 0 where smaps_rollup cannot be read (a process gone, a
    kernel before 4.14) or has no such lines (before 5.0)."""
    total = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith((b"Pss_Anon:", b"Pss_Shmem:", b"SwapPss:")):
                    total += int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass
    return total


def _memfd_files(pid: int) -> dict[tuple[int, int], int]:
    """(device, inode) -> bytes stored, of each memfd file `pid` has open."""
    found = {}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        path = f"/proc/{pid}/fd/{fd}"
        try:
            if os.readlink(path).startswith("/memfd:"):
                info = os.stat(path)
                found[(info.st_dev, info.st_ino)] = info.st_blocks * 512
        except OSError:
            continue
    return found


def threads(pid: int) -> list[int]:
    """The thread ids of process `pid` ([] if it is gone)."""
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def tree_running(root: int) -> bool:
    """Whether any thread of any process below `root` is running or runnable (state R)."""
    for pid in _tree(root):
        for tid in threads(pid):
            fields = stat_fields(pid, tid)
            if fields and fields[0] == b"R":
                return True
    return False


def tree_threads(root: int) -> int:
    """Threads of every process below `root`, as their /proc status counts them now."""
    total = 0
    for pid in _tree(root):
        threads = _status(pid, b"Threads:")
        total += int(threads[0]) if threads else 0
    return total


def own_threads() -> int:
    """Threads of this process as the kernel counts them: the interpreter's, and those a C library started on its
    own (a broker's client library may), which threading.active_count() does not see. A process about to fork
    must have only one: a lock another thread held would stay held in the child. Unreadable, it is taken as more
    than one."""
    threads = _status(os.getpid(), b"Threads:")
    return int(threads[0]) if threads else 2


def _status(pid: int, field: bytes) -> list[bytes] | None:
    """The values of one line of /proc/PID/status ("Uid:", "Threads:"), None if it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            return next((line.split()[1:] for line in f if line.startswith(field)), None)
    except OSError:
        return None


def processes_of_uid(uid: int) -> list[int]:
    """Processes whose real uid is `uid` (from /proc/PID/status: a process that made itself
    non-dumpable has its /proc folder owned by root)."""
    wanted = str(uid).encode()
    return [pid for pid in pids() if (_status(pid, b"Uid:") or [None])[0] == wanted]


def tasks_of_uid(uid: int) -> int:
    """How many tasks (threads) `uid` runs: what RLIMIT_NPROC counts."""
    total = 0
    for pid in processes_of_uid(uid):
        threads = _status(pid, b"Threads:")
        total += int(threads[0]) if threads else 1
    return total


def find_processes(marker: str) -> list[int]:
    """Processes (but this one) whose environment contains `marker` (e.g. a run id or a test's run tag)."""
    needle, me = marker.encode(), os.getpid()
    found = []
    for pid in pids():
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def cpu_wait(pid: int) -> float | None:
    """Seconds the threads of process `pid` have waited, runnable, for a CPU (their run_delay in the kernel's
    /proc/PID/task/TID/schedstat), summed; None if it is gone or the kernel keeps no schedstat. The sum of
    several threads can count one moment more than once: a measure of how much a busy machine may have
    delayed the process, never less than any one thread's wait."""
    total, seen = 0, False
    for tid in threads(pid):
        waited = _run_delay(f"/proc/{pid}/task/{tid}/schedstat")
        if waited is not None:
            total, seen = total + waited, True
    return total / 1e9 if seen else None


def own_cpu_wait() -> float | None:
    """Seconds the calling thread has waited, runnable, for a CPU; None where the kernel keeps no schedstat."""
    waited = _run_delay("/proc/thread-self/schedstat")
    return None if waited is None else waited / 1e9


def steal() -> float:
    """Seconds of CPU the machine's hypervisor gave to others while this machine wanted it (the steal column of
    /proc/stat, all CPUs together); 0.0 where it is not counted."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
        return int(fields[8]) / _TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def _run_delay(path: str) -> int | None:
    """The second field of a schedstat file: nanoseconds spent runnable but waiting for a CPU."""
    try:
        with open(path, "rb") as f:
            return int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None
