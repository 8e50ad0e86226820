"""Make `import taskproc` give the harness's instrumented module in a learner process."""
import importlib.util
import sys


def install(path: str) -> None:
    if not path:
        return
    spec = importlib.util.spec_from_file_location("taskproc", path)
    module = importlib.util.module_from_spec(spec)
    # In sys.modules before any learner import runs, so `sys.path.insert(0, "/opt/app")` cannot shadow it.
    sys.modules["taskproc"] = module
    spec.loader.exec_module(module)
