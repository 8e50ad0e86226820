"""Containment of learner scripts, run by run: no process survives a run (daemons, SIGTERM-ignorers,
fork bombs), every resource limit holds and is named, output is bounded without blocking, the
environment holds no secret, the copy is removed whatever the script did to it, the original is
never changed, and two gradings at once do not see each other's keys.

Where it matters, each test runs under the containment this machine allows and under the weaker
ones the sandbox falls back to elsewhere (root without a uid of its own; no cgroup either)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from helpers import alive, scripts_folder

from retrylab import sandbox, tempdirs
from retrylab.fixtures.backoff_dlq.corpus import REFERENCE
from retrylab.containment import NAMESPACES_VARIABLE, Containment
from retrylab.procfs import find_processes
from retrylab.sandbox import Limits, Sandbox

DETECTED = sandbox.containment()
PLAIN = dataclasses.replace(DETECTED, namespaces="", bwrap="")   # no namespaces: partial isolation
VARIANTS = {"own-uid": PLAIN,                                     # root: a fresh uid per run
            "no-own-uid": Containment(cgroups=DETECTED.cgroups),   # root: no capabilities, cgroup if any
            "bare": Containment(),                                 # subreaper and the supervisor's own count
            # namespaces of its own: both ways, wherever the machine has them (CI installs bubblewrap)
            "unshare": dataclasses.replace(PLAIN, namespaces="unshare")}
if shutil.which("bwrap"):
    VARIANTS["bwrap"] = dataclasses.replace(PLAIN, namespaces="bwrap", bwrap=shutil.which("bwrap"))
SECRET = "retrylab-containment-secret-0123456789"


@pytest.fixture(params=sorted(VARIANTS))
def variant(request) -> Containment:
    return VARIANTS[request.param]


@pytest.fixture
def tag(monkeypatch) -> str:
    """A marker in the environment of every process the test's runs start."""
    value = f"containment-{uuid.uuid4().hex}"
    monkeypatch.setenv(sandbox.RUN_TAG_VARIABLE, value)
    return value


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        h.update(str(path.relative_to(folder)).encode() + oct(path.lstat().st_mode).encode())
        if path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()


def _running_with(marker: str) -> list[int]:
    """Live processes whose command line holds `marker`: a pid a script prints is its PID
    namespace's, not the host's, when it has one of its own."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if marker.encode() in f.read() and alive(int(name)):
                    found.append(int(name))
        except (OSError, ValueError):
            continue
    return found


DAEMON = """
    import os, sys, time
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode())
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            # no environment: no marker of the run either
            os.execve(sys.executable, [sys.executable, "-c", "import time\\nwhile True: time.sleep(3600)  # MARKER"], {})
        os._exit(0)
    os.close(w)
    print(os.read(r, 32).decode(), flush=True)
    os.wait()
"""


@pytest.mark.parametrize("then", ["exits", "runs-on"])
def test_a_detached_daemon_does_not_survive_the_run(variant, tag, tmp_path, then):
    rest = "" if then == "exits" else "    while True:\n        time.sleep(3600)\n"
    folder = scripts_folder(tmp_path, daemon=DAEMON.replace("MARKER", tag) + rest)
    with Sandbox(folder, containment=variant) as box:
        result = box.run("daemon.py", env={}, timeout=2 if then == "runs-on" else 30)
    assert result.stdout.split()[0].isdigit(), result.stderr
    assert result.returncode == (0 if then == "exits" else None), result.stderr
    assert _running_with(tag) == [], "the daemon outlived the run"
    assert find_processes(tag) == []


def test_processes_that_ignore_sigterm_are_killed(variant, tag, tmp_path):
    folder = scripts_folder(tmp_path, stubborn="""
        import os, signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = os.fork()
        if child == 0:
            while True:
                pass
        print(os.getpid(), child, flush=True)
        while True:
            pass
    """)
    with Sandbox(folder, containment=variant) as box:
        result = box.run("stubborn.py", env={}, timeout=1.5)
    assert result.stopped == "timeout"
    if not variant.namespaces:  # else its pids are its namespace's: the marker in the environment tells
        assert not any(alive(int(pid)) for pid in result.stdout.split())
    assert find_processes(tag) == []


def test_a_fork_bomb_is_bounded_named_and_cleared(variant, tag, tmp_path):
    folder = scripts_folder(tmp_path, bomb="""
        import os
        while True:
            os.fork()
    """)
    with Sandbox(folder, Limits(processes=16), containment=variant) as box:
        result = box.run("bomb.py", env={}, timeout=30)
    assert result.limit == "the limit of 16 processes", result.describe()
    assert "the limit of 16 processes" in result.describe()
    if variant.unprivileged_uid or variant.cgroups or os.geteuid() != 0:  # a hard bound (else: counted)
        assert result.peak_processes is None or result.peak_processes <= 16
    assert find_processes(tag) == []


@pytest.mark.parametrize("limits, code, named", [
    (Limits(memory_bytes=256 << 20), "hoard = []\nwhile True:\n    hoard.append(b'x' * (16 << 20))\n",
     "was stopped: it exceeded the 256 MiB memory limit"),
    (Limits(file_bytes=4 << 20), "with open('big', 'wb') as f:\n    while True:\n        f.write(bytes(1 << 20))\n",
     "was stopped: it exceeded the 4 MiB file size limit"),
    (Limits(cpu_seconds=1), "while True:\n    pass\n", "was stopped: it exceeded the 1 s CPU time limit"),
], ids=["memory", "file-size", "cpu"])
def test_each_resource_limit_holds_and_is_named(limits, code, named, tmp_path, tag):
    folder = scripts_folder(tmp_path, greedy=code)
    with Sandbox(folder, limits) as box:
        result = box.run("greedy.py", env={}, timeout=60)
    assert result.stopped is None and result.crashed
    assert named in result.describe(), (result.describe(), result.stderr_tail())
    assert find_processes(tag) == []


def test_endless_output_neither_blocks_nor_grows_memory(tmp_path):
    folder = scripts_folder(tmp_path, flood="""
        import sys
        block = ("flood " * 100 + "\\n") * 100
        while True:
            sys.stdout.write(block)
            sys.stderr.write(block)
    """)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            with open("/proc/self/status") as f:
                rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
            peak[0] = max(peak[0], rss)
            time.sleep(0.02)

    with open("/proc/self/status") as f:
        before = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with Sandbox(folder, Limits(output_bytes=64 << 10)) as box:
        result = box.run("flood.py", env={}, timeout=2.5)
    done.set()
    sampler.join()
    assert result.stopped == "timeout"  # it kept writing all along: its pipes never filled up
    dropped = int(result.stdout.split("[... ")[1].split(" bytes")[0])
    assert dropped > 1 << 20, "the script could hardly write: the harness did not keep reading"
    assert len(result.stdout) < (64 << 10) + 200 and len(result.stderr) < (64 << 10) + 200
    assert peak[0] - before < 64 << 10, f"the harness grew by {(peak[0] - before) >> 10} MB while reading"


def test_no_secret_reaches_the_script(variant, tmp_path, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", SECRET)
    monkeypatch.setenv("RETRYLAB_SOMETHING_SECRET", SECRET)
    folder = scripts_folder(tmp_path, snoop="""
        import os
        print(dict(os.environ))
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) != os.getpid():
                try:
                    with open(f"/proc/{name}/environ", "rb") as f:
                        print(name, f.read())
                except OSError:
                    pass
    """)
    with Sandbox(folder, containment=variant) as box:
        result = box.run("snoop.py", env={"REDIS_URL": "redis://x"}, timeout=30)
    assert result.returncode == 0, result.stderr
    assert "REDIS_URL" in result.stdout and SECRET not in result.stdout + result.stderr
    assert "GITHUB_TOKEN" not in result.stdout.splitlines()[0]


MESS = """
    import os
    os.makedirs("mess/a/b", exist_ok=True)
    for path in ("mess/a/b/f", "mess/f", "top.txt"):
        with open(path, "w") as f:
            f.write("x")
        os.chmod(path, 0o444)
    os.mkfifo("mess/fifo")
    os.symlink("loop", "mess/loop")
    with open(os.fsencode("mess/") + b"\\xff\\xfe", "w") as f:
        f.write("x")
    for path in ("mess/a/b", "mess/a", "mess"):
        os.chmod(path, 0)
    os.remove("mess.py")
    os.chmod(".", 0o555)
    print(os.getcwd())
"""


def test_the_copy_is_removed_whatever_the_script_did_to_it(variant, tmp_path):
    folder = scripts_folder(tmp_path, mess=MESS)
    before = _digest(folder)
    with Sandbox(folder, containment=variant) as box:
        result = box.run("mess.py", env={}, timeout=30)
        root = box.root
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).parent == root
    assert not root.exists()
    assert _digest(folder) == before


def test_what_the_run_leaves_in_shared_scratch_folders_is_removed(tmp_path, tag):
    folder = scripts_folder(tmp_path, litter=f"""
        import os
        for top in ("/tmp", "/dev/shm"):
            if os.access(top, os.W_OK):
                os.makedirs(f"{{top}}/{tag}/deep", exist_ok=True)
                with open(f"{{top}}/{tag}.txt", "w") as f:
                    f.write("x")
                os.chmod(f"{{top}}/{tag}/deep", 0)
                print(top)
    """)
    with Sandbox(folder) as box:
        result = box.run("litter.py", env={}, timeout=30)
    assert result.returncode == 0, result.stderr
    tops = result.stdout.split()
    assert "/tmp" in tops
    left = [p for top in tops for p in (f"{top}/{tag}", f"{top}/{tag}.txt") if os.path.lexists(p)]
    if DETECTED.unprivileged_uid:  # the run's uid owns them: they go with the run
        assert left == []
    else:  # the harness's own user wrote them: nothing tells them from its own files
        assert len(left) == 2 * len(tops)
        for path in left:
            tempdirs.remove_tree(Path(path)) if os.path.isdir(path) else os.unlink(path)


def test_an_unprivileged_harness_removes_a_copy_made_undeletable(tmp_path):
    # Without root's right to bypass permissions the harness must restore them first. A script in
    # the sandbox has no such right (another uid, or root without capabilities): it plays the harness.
    folder = scripts_folder(tmp_path, cleaner="""
        import os
        from pathlib import Path
        from retrylab.tempdirs import remove_tree
        top = Path(os.environ["TMPDIR"]) / "run"
        (top / "a" / "b").mkdir(parents=True)
        (top / "a" / "b" / "f").write_text("x")
        os.chmod(top / "a" / "b" / "f", 0o444)
        for path in (top / "a" / "b", top / "a", top):
            os.chmod(path, 0)
        try:
            os.listdir(top / "a")
            print("privileged")
        except PermissionError:
            remove_tree(top)
            print("removed" if not top.exists() else "left")
    """)
    with Sandbox(folder, containment=PLAIN) as box:  # in namespaces it could not import the harness
        result = box.run("cleaner.py", env={}, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "removed"


NESTED_HARNESS = """
    import os, sys
    from pathlib import Path
    from retrylab import sandbox
    from retrylab.sandbox import Limits, Sandbox
    here = Path(os.environ["TMPDIR"]) / "inner"
    here.mkdir()
    (here / "daemon.py").write_text(sys.argv[1] if len(sys.argv) > 1 else open("daemon.txt").read())
    (here / "bomb.py").write_text("import os\\nwhile True:\\n    os.fork()\\n")
    (here / "mess.py").write_text(open("mess.txt").read())
    print("root" if os.geteuid() == 0 else "unprivileged", sandbox.containment().describe().splitlines()[0])
    print("namespaces", sandbox.containment().namespaces or "none")
    with Sandbox(here) as box:
        daemon = box.run("daemon.py", env={}, timeout=30)
    def alive_with(marker):  # its pid is its PID namespace's when it has one: look for its command line
        for name in filter(str.isdigit, os.listdir("/proc")):
            try:
                if marker in open(f"/proc/{name}/cmdline", "rb").read() and open(f"/proc/{name}/stat").read().split(") ")[1][0] != "Z":
                    return True
            except OSError:
                pass
        return False
    print("daemon", daemon.returncode, alive_with(open("marker.txt", "rb").read()))
    with Sandbox(here, Limits(processes=8)) as box:
        print("bomb", box.run("bomb.py", env={}, timeout=30).describe())
    with Sandbox(here) as box:
        result = box.run("mess.py", env={}, timeout=30)
        root = box.root
    print("mess", result.returncode, root.exists())
"""


@pytest.mark.parametrize("namespaces", ["bwrap", "unshare", "none"])
def test_a_harness_without_privileges_still_contains_its_scripts(tmp_path, namespaces):
    # A learner's own machine: the harness is not root. Run one inside the sandbox, which has no
    # privileges there (another uid, or root without capabilities), and let it contain scripts.
    # The outer run has no namespaces (the nested harness imports retrylab, which a sandbox hides);
    # the nested one makes its own: bubblewrap, or unshare(2) in a new user namespace, or none.
    if namespaces == "bwrap" and not shutil.which("bwrap"):
        pytest.skip("bubblewrap is not installed")
    marker = f"nested-daemon-{uuid.uuid4().hex}"
    folder = scripts_folder(tmp_path, nested=NESTED_HARNESS)
    (folder / "daemon.txt").write_text(textwrap.dedent(DAEMON).replace("MARKER", marker))
    (folder / "marker.txt").write_text(marker)
    (folder / "mess.txt").write_text(textwrap.dedent(MESS).replace('os.remove("mess.py")', "pass"))
    with Sandbox(folder, containment=PLAIN) as box:
        result = box.run("nested.py", env={NAMESPACES_VARIABLE: namespaces}, timeout=120)
    assert result.returncode == 0, result.stderr_tail(20)
    lines = dict(line.split(" ", 1) for line in result.stdout.strip().splitlines())
    assert lines["namespaces"] == namespaces, result.stdout
    if DETECTED.unprivileged_uid:
        assert "unprivileged" in lines, result.stdout
    assert lines["daemon"] == "0 False", result.stdout
    assert lines["bomb"].endswith("was stopped: it exceeded the limit of 8 processes"), result.stdout
    assert lines["mess"] == "0 False", result.stdout


def test_the_original_submission_cannot_be_changed_from_the_script(tmp_path):
    target = tmp_path / "submission" / "worker.py"
    folder = scripts_folder(tmp_path, worker="print('original')\n", attack=f"""
        import os
        changed = []
        for path in ({str(target)!r}, os.path.abspath("../../../" + {str(target.relative_to("/"))!r})):
            try:
                with open(path, "a") as f:
                    f.write("# changed")
                changed.append(path)
            except OSError as exc:
                print("refused:", exc.strerror)
        print("changed:", changed)
    """)
    before = _digest(folder)
    with Sandbox(folder) as box:
        result = box.run("attack.py", env={}, timeout=30)
    assert result.returncode == 0, result.stderr
    if DETECTED.unprivileged_uid:
        assert _digest(folder) == before, result.stdout
        assert "changed: []" in result.stdout
    else:  # the script runs as the harness's own user here: nothing but a separate uid protects it
        assert any("uid" in note or "not root" in note for note in DETECTED.notes), DETECTED.notes


def test_the_call_log_cannot_be_swapped_for_a_fifo(tmp_path):
    folder = scripts_folder(tmp_path, swap="""
        import os
        path = os.environ["RETRYLAB_CALL_LOG"]
        with open(path, "a") as f:
            f.write("written\\n")
        try:
            os.remove(path)
            os.mkfifo(path)
            print("swapped")
        except OSError as exc:
            print("refused:", exc.strerror)
    """)
    with Sandbox(folder) as box:
        log = box.log_file("calls.jsonl")
        result = box.run("swap.py", env={"RETRYLAB_CALL_LOG": str(log)}, timeout=30)
        assert result.returncode == 0, result.stderr
        if DETECTED.unprivileged_uid:  # writable, yet the harness's: a FIFO there would hang its reader
            assert "refused" in result.stdout and log.is_file() and log.read_text() == "written\n"
        else:
            assert log.exists() or "swapped" in result.stdout


def test_an_interrupted_run_leaves_no_process(variant, tag, tmp_path):
    folder = scripts_folder(tmp_path, busy="""
        import os
        os.fork()
        while True:
            pass
    """)

    def interrupt() -> bool:
        if len(find_processes(tag)) >= 2:
            raise KeyboardInterrupt  # e.g. Ctrl-C or a step's alarm while the sandbox waits
        return False

    with Sandbox(folder, containment=variant) as box, pytest.raises(KeyboardInterrupt):
        box.run("busy.py", env={}, timeout=30, stop_when=interrupt)
    assert find_processes(tag) == []


def test_the_containment_in_use_is_measured_and_explained():
    text = DETECTED.describe()
    assert "subreaper" in text
    if os.geteuid() == 0:
        assert DETECTED.unprivileged_uid or any("uid" in note for note in DETECTED.notes), text


NEIGHBOUR = """
import os, runpy, select
import redis


def now():  # real time on a clock every process shares (the learner's clocks are virtual)
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])


r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
me = "{name}"
seen = set()
began = now()
for _ in range(100):  # about 5 s of real time (select is not on the virtual clock), keys changing
    r.rpush(f"owner:{{me}}", "here")
    seen.update(k.decode() for k in r.keys("*"))
    select.select([], [], [], 0.05)
print("window", began, now(), "seen", sorted(k for k in seen if k.startswith("owner:")))
r.delete(f"owner:{{me}}")
runpy.run_path("reference_worker.py", run_name="__main__")
"""
GRADE = """
import json, sys
from pathlib import Path
from retrylab.grading import grade
report = grade(Path(sys.argv[1]), backend=sys.argv[2], steps=(1,))
print(json.dumps({"status": [r.status for r in report.lab_results], "output": "\\n".join(r.output for r in report.results)}))
"""


@pytest.mark.parametrize("backend", ["fake", "redis-server"])
def test_two_gradings_at_once_do_not_see_each_others_keys(backend, tmp_path):
    folders = {}
    for name in ("alice", "bob"):
        folder = tmp_path / name
        shutil.copytree(REFERENCE, folder, ignore=shutil.ignore_patterns("__pycache__", "__init__.py"))
        (folder / "reference_worker.py").write_bytes((folder / "worker.py").read_bytes())
        (folder / "worker.py").write_text(NEIGHBOUR.format(name=name))
        folders[name] = folder
    procs = {name: subprocess.Popen([sys.executable, "-c", GRADE, str(folder), backend], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
             for name, folder in folders.items()}
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        results[name] = json.loads(out.strip().splitlines()[-1])
    windows = {}
    for name, result in results.items():
        assert result["status"] == ["pass"], result["output"][-2000:]
        line = next(line for line in result["output"].splitlines() if line.startswith("window "))
        start, end, seen = line.split(" ", 4)[1], line.split(" ", 4)[2], line.split(" ", 4)[4]
        windows[name] = (float(start), float(end))
        assert seen == f"['owner:{name}']", f"{name} saw {seen}"
    (a_start, a_end), (b_start, b_end) = windows.values()
    assert a_start < b_end and b_start < a_end, "the two runs did not overlap: nothing was tested"
