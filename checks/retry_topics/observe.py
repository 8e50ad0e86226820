"""Reading what the learner's scripts did, in the lab's terms, with messages a learner can act on."""
from __future__ import annotations

from retrylab.appchannel import describe_call_limit, describe_malformed
from retrylab.calllog import MALFORMED
from retrylab.checks.retry_topics import lab
from retrylab.checks.retry_topics.catalog import tr
from retrylab.plugin import attach_output
from retrylab.runner import ScriptRun
from retrylab.verdict import fail, indent


def attach(node, *runs: ScriptRun | None) -> None:
    parts = []
    for run in runs:
        if run is not None and run.result is not None:
            text = (run.result.stdout + run.result.stderr).strip()
            if text:
                parts.append(f"--- {run.result.script}\n{text}")
    if parts:
        attach_output(node, "\n".join(parts))


def how_it_ran(run: ScriptRun) -> str:
    """One or more lines about how the script ended, with the end of its stderr if it crashed."""
    result = run.result
    if run.call_limit is not None:
        return describe_call_limit(result.script, run.call_limit)
    text = result.describe()
    if (result.crashed or result.stopped == "timeout" or result.returncode not in (0, None)) and result.stderr_tail():
        text += ":\n" + indent(result.stderr_tail())
    return text


def how_both_ran(main_run) -> str:
    return "\n".join(how_it_ran(r) for r in (main_run.main, main_run.retry) if not r.missing)


def require_script(run: ScriptRun | None, script: str) -> None:
    if run is None or run.missing:
        fail(tr("observe.script_missing", script=script))


def require_honest_calls(run: ScriptRun) -> None:
    if run.call_limit is not None:
        fail(describe_call_limit(run.result.script, run.call_limit))
    for call in run.calls:
        if call.outcome == MALFORMED:
            fail(tr("observe.malformed", problem=describe_malformed(call)))
        if call.altered is not None:
            fail(tr("observe.altered", id=call.id, key=call.altered))


def require_main(main_run) -> None:
    """consumer.py exists, its calls are the harness's callbacks, and it fetched from callbacks at all."""
    require_script(main_run.main, lab.MAIN_SCRIPT)
    require_honest_calls(main_run.main)
    if main_run.fetching.get(lab.MAIN_SCRIPT) is None and not main_run.main.calls:
        fail(tr("observe.never_fetched", script=lab.MAIN_SCRIPT, group=lab.MAIN_GROUP, topic=lab.TOPIC,
                how=how_it_ran(main_run.main)))


def require_pair(main_run) -> None:
    """Both scripts exist and their calls are honest (steps that need the retry consumer too)."""
    require_main(main_run)
    require_script(main_run.retry, lab.RETRY_SCRIPT)
    require_honest_calls(main_run.retry)


def require_state(main_run) -> None:
    if main_run.state is None or not main_run.state.complete:
        fail(tr("observe.unreadable"))
