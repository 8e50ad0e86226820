"""The task RQ runs in the benchmark: the stand-in taskproc's process(), by message kind."""
from taskproc import process as _process


def process(msg):
    _process(msg)
