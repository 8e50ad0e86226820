"""The learner's virtual clock (retrylab.learner_site.virtual_clock) reads the run's time from its first moment."""
import os
import subprocess
import sys

OFFSET = 1000.0
START_UP = 0.5      # real seconds a learner process spends before its first read of the time (imports, a client)

_PROCESS = f"""
import time
from time_machine import escape_hatch
from retrylab.learner_site import virtual_clock
virtual_clock.install()
virtual_clock._real_sleep({START_UP})
print(time.time() - escape_hatch.time.time())
"""


def test_the_clock_ticks_from_install_not_from_the_first_read():
    # time-machine starts ticking at the first read of the time: a process whose start-up ran before that read was
    # behind the run's clock by its start-up (seconds on a busy machine: a retry due after an interval came early)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRYLAB_")}
    env["RETRYLAB_CLOCK_OFFSET"] = str(OFFSET)
    out = subprocess.run([sys.executable, "-c", _PROCESS], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    ahead = float(out.stdout)
    assert abs(ahead - OFFSET) < START_UP / 2, f"the process's clock is {OFFSET - ahead:.3f} s behind the run's"
