"""Loaded by every Python process a learner's script starts: its folder, and nothing else, is put
first on PYTHONPATH, so no harness module can shadow a learner's module of the same name.

Three things make learner code run unchanged yet hermetically and fast:
1. every connection of the broker's client library goes to the check's private server's recording
   relay, whatever host, port, URL or socket the learner's code names: the broker's redirect (a file
   named by RETRYLAB_BROKER_REDIRECT, see learner_site.broker_redirect) does it;
2. importing the exercise's application module (RETRYLAB_APP_MODULE) gives its stub (RETRYLAB_APP_STUB),
   so a real /opt/app on a lab machine cannot shadow it; it hands each call to the harness over the
   socket RETRYLAB_APP_SOCKET;
3. time is virtual: sleeping returns at once and moves the run's clock (kept by the harness) forward,
   so a worker that backs off for 15 s is graded in well under a second; unless the run is on real
   time (RETRYLAB_CLOCK_VIRTUAL=0: an exercise whose waits are the broker's own, see RunClock.real).
Everything here must be cheap: it runs at the start of every learner process.
"""
import os
import sys


def _install():
    if os.environ.get("RETRYLAB_SITE_ACTIVE") != "1":
        return
    from retrylab.learner_site import app_loader, broker_redirect, virtual_clock
    if os.environ.get("RETRYLAB_CLOCK_VIRTUAL") != "0":
        virtual_clock.install()
    app_loader.install(os.environ.get("RETRYLAB_APP_MODULE", ""), os.environ.get("RETRYLAB_APP_STUB", ""))
    broker_redirect.install(os.environ.get("RETRYLAB_BROKER_REDIRECT", ""))


try:
    _install()
except Exception as exc:  # never let the harness's own setup look like the learner's bug
    sys.stderr.write(f"retrylab: could not prepare the learner process: {exc!r}\n")
    os._exit(97)
