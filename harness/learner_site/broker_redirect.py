"""Load the broker's learner-side redirect and install it.

The file the run's link names in RETRYLAB_BROKER_REDIRECT (a module of retrylab.brokers.<kind>) sends its
client library's connections to the run's recording relay. It is loaded by its path: the sandbox shows a
learner process the files its environment names, and of the harness nothing else but this folder."""
import importlib.util


def install(path: str) -> None:
    if not path:
        return
    spec = importlib.util.spec_from_file_location("retrylab_broker_redirect", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.install()
