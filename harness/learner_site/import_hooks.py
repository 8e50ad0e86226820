"""Run a function right after a module is first imported, without importing it eagerly.

Importing a broker's client library or asyncio in every learner process just to patch them would cost most of a
process's start-up; a learner script that never uses them should not pay for it.
"""
import sys

_callbacks: dict = {}


class _AfterImportFinder:  # a meta path finder; not subclassing importlib.abc saves its import
    def find_spec(self, fullname, path, target=None):
        if fullname not in _callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                _wrap_loader(spec, _callbacks.pop(fullname))
                return spec
        return None


def _wrap_loader(spec, callback) -> None:
    exec_module = spec.loader.exec_module

    def exec_then_patch(module):
        exec_module(module)
        callback(module)

    spec.loader.exec_module = exec_then_patch


def after_import(name: str, callback) -> None:
    if name in sys.modules:
        callback(sys.modules[name])
        return
    _callbacks[name] = callback
    if not any(isinstance(f, _AfterImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImportFinder())
