"""What a step's report says about the learner's scripts: how a run ended, and what it printed.

Every exercise's checks tell a learner the same things about a run that went wrong (it crashed, with the
end of its stderr; it ran out of time; it flooded the application module with calls), in the engine's
words for the grading's language; what it printed goes with the step for reporters that show output."""
from __future__ import annotations

from retrylab.appchannel import describe_call_limit
from retrylab.plugin import attach_output
from retrylab.runner import ScriptRun
from retrylab.verdict import indent


def how_it_ran(run: ScriptRun) -> str:
    """One or more lines about how the script ended, with the end of its stderr if it crashed, ran out of
    time or exited with an error status."""
    result = run.result
    if run.call_limit is not None:  # stopped by the harness for a flood of calls, not "settled"
        return describe_call_limit(result.script, run.call_limit)
    text = result.describe()
    if (result.crashed or result.stopped == "timeout" or result.returncode not in (0, None)) and result.stderr_tail():
        text += ":\n" + indent(result.stderr_tail())
    return text


def attach_runs(node, *runs: ScriptRun | None) -> None:
    """Attach what the runs printed (stdout, then stderr, each run's in turn) to the check `node`; when
    more than one printed something, each part is headed by its script's name."""
    printed = [(r.result.script, (r.result.stdout + r.result.stderr).strip())
               for r in runs if r is not None and r.result is not None]
    printed = [(script, text) for script, text in printed if text]
    if len(printed) == 1:
        attach_output(node, printed[0][1])
    elif printed:
        attach_output(node, "\n".join(f"--- {script}\n{text}" for script, text in printed))
