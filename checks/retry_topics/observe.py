"""Reading what the learner's scripts did, in the lab's terms, with messages a learner can act on."""
from __future__ import annotations

from typing import NoReturn

from retrylab.appchannel import describe_call_limit, describe_malformed
from retrylab.calllog import MALFORMED
from retrylab.checks.retry_topics import lab, pair
from retrylab.checks.retry_topics.catalog import tr
from retrylab.runner import ScriptRun
from retrylab.runreport import how_it_ran
from retrylab.verdict import cannot_judge, fail

# virtual seconds: a retry due this long before a cut was only just due (a correct pair notifies it within a real
# moment of its clock reaching it: at 20 virtual s per real s, 60 s is 3 real seconds), so the pair was still at it
DUE_SLACK = 60.0


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


def incomplete(run, message: str) -> NoReturn:
    """Fail with `message`, something the pair had not done when the harness stopped it. Only for what a correct
    pair does later: a wrong thing done is judged however the run ended. A limit of the harness that cut the pair
    while its clock still moved toward a due time changes that (`run.cut`, and a retry record due within the next
    interval, or only just due: DUE_SLACK; a correct pair's records are due an interval after they were made): at
    pair.MIN_PACE or faster a busy machine may have slowed a correct pair, which is no verdict; slower, the pair
    crawls (each poll of its paused consumer costs more real time than its timeout is worth), which the message
    says. A clock moved past every due time, or toward one further than an interval (a retry a hundred years
    ahead), waits for nothing a correct pair waits for: a plain failure."""
    cut = run.cut
    if cut is None or not any(-DUE_SLACK < due - cut.clock <= lab.INTERVAL + DUE_SLACK for due in run.due_times()):
        fail(message)
    facts = dict(seconds=f"{cut.limit:.0f}", pace=f"{cut.pace:.1f}")
    if cut.pace >= pair.MIN_PACE:
        cannot_judge(tr("observe.cut_short", **facts))
    fail(f"{message}\n{tr('observe.crawled', **facts)}")


def require_state(main_run) -> None:
    if main_run.state is None or not main_run.state.complete:
        fail(tr("observe.unreadable"))
