"""The progress displays (orchestrator/ui/progress.py) on a clock the test moves: the plain lines cron and CI
read, the live table's columns and estimate, and the one auto | rich | plain choice."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from orchestrator.ui.progress import Bar, CompileBar, SweepProgress, clock


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def plain() -> Console:
    return Console(file=io.StringIO(), width=200)


def lines(console: Console) -> list[str]:
    return console.file.getvalue().splitlines()


def test_clock_format():
    assert [clock(s) for s in (0, 59.9, 61, 3599, 3600, 3723)] == [
        "00:00",
        "00:59",
        "01:01",
        "59:59",
        "1:00:00",
        "1:02:03",
    ]


def test_plain_sweep_lines_are_stamped_and_step_lines_throttled():
    t, out = Clock(), plain()
    with SweepProgress("plain", out, get_time=t) as p:
        p.add("a", "ring L=512", steps=100)
        p.add("b", "usp L=512", steps=100, state="infeasible", note="needs 9 GiB")  # no line: ruled out
        t.now += 5
        p.update("a", state="running")
        t.now += 10
        p.update("a", step=1, loss=6.0, tokens_per_s=50.0)  # within 30 s of the last line: quiet
        t.now += 25
        p.update("a", step=2, loss=5.0, tokens_per_s=1500.0)
        t.now += 1
        p.update("a", step=3, loss=4.5)  # quiet again
        t.now += 60
        p.event("a", "attempt 1 on s0: 0=pid 11@10.0.0.2")
        p.update("a", state="done", step=100, loss=4.0)
    assert lines(out) == [
        "[00:05] ring L=512: running",
        "[00:40] ring L=512: step 2/100 loss=5.0000 1,500 tok/s",
        "[01:41] ring L=512: attempt 1 on s0: 0=pid 11@10.0.0.2",
        "[01:41] ring L=512: done loss=4.0000 (attempt 1 on s0: 0=pid 11@10.0.0.2)",  # the note stays
    ]


def test_a_retried_trial_runs_on_a_fresh_clock_and_the_table_has_the_columns():
    t, out = Clock(), Console(file=io.StringIO(), width=200)
    with SweepProgress("rich", out, get_time=t) as p:
        p.add("a", "ring L=512", steps=4)
        p.add("b", "usp L=512 [x]", steps=4, state="infeasible", note="needs 9 GiB")
        p.update("a", state="running")
        t.now += 50
        p.update("a", state="queued", retries=1, note="preempted: retrying")
        assert p.task(p.keys["a"]).elapsed is None  # queued again: no time shown
        t.now += 30
        p.update("a", state="running", note="on local")
        t.now += 10
        p.update("a", step=2, loss=5.25, tokens_per_s=1234.0)
        assert "running 1" in p._title([]) and "eta -" in p._title([])  # one sample: no rate yet
        t.now += 10
        p.update("a", step=3, loss=5.0, tokens_per_s=1234.0)
        # 0.5 -> 0.75 of the sweep in 10 s: a quarter left at that rate
        assert p._title([]) == "sweep  elapsed 01:40  eta 00:10  |  infeasible 1  running 1"
        t.now += 7
        p.update("a", state="done")
        assert p.task(p.keys["a"]).elapsed == 27  # this attempt's time, frozen when it finished
        assert p._eta() == "-"  # all done
    text = out.file.getvalue()
    header = next(ln for ln in text.splitlines() if "trial" in ln)
    assert header.split()[1:-1:2] == [
        "trial",
        "state",
        "step",
        "loss",
        "tokens/s",
        "elapsed",
        "retries",
        "note",
    ]
    row = next(ln for ln in text.splitlines() if "ring L=512" in ln)
    assert [c.strip() for c in row.split("│")[1:-1]] == [
        "ring L=512",
        "done",
        "",
        "5.0000",
        "1,234",
        "00:27",
        "1",
        "on local",
    ]
    assert "usp L=512 [x]" in text  # a label is text, never rich markup
    assert "sweep  elapsed 01:47  eta -  |  done 1  infeasible 1" in text


def test_compile_bar_plain_lines():
    t, out = Clock(), plain()
    with CompileBar(3, 2, "plain", out, get_time=t) as bar:
        bar.set_running(2)
        t.now += 65
        bar.finished("ring x", "compiled in 64 s", failed=False, hit=False)
        bar.set_running(2)
        bar.finished("ring y", "compiled (cache hit)", failed=False, hit=True)
        t.now += 3600
        bar.finished("ring z", "failed: [b]OOM[/] :boom:", failed=True, hit=False)
    assert lines(out) == [
        "[00:00] aot: 3 to compile, 2 at once",
        "[01:05] aot: 1/3 ring x: compiled in 64 s  [0 cache hits  0 failed  1 running]",
        "[01:05] aot: 2/3 ring y: compiled (cache hit)  [1 cache hits  0 failed  1 running]",
        "[1:01:05] aot: 3/3 ring z: failed: [b]OOM[/] :boom:  [1 cache hits  1 failed  0 running]",
        "[1:01:05] aot: done: 1 cache hits  1 failed  0 running",
    ]


def test_any_long_wait_gets_a_bar():
    """A third display from the same parts (issue #41: corpus builds, first compiles)."""
    t, out = Clock(), plain()
    with Bar("corpus build", "corpus", 2, "plain", out, get_time=t) as bar:
        t.now += 2
        bar.advance("shard-0.arrayrecord", counts="100 documents")
        bar.advance("shard-1.arrayrecord", counts="200 documents")
        assert (bar.done, bar.total) == (2, 2)
    assert lines(out) == [
        "[00:02] corpus: 1/2 shard-0.arrayrecord",
        "[00:02] corpus: 2/2 shard-1.arrayrecord",
    ]
    rich = Console(file=io.StringIO(), width=120)
    with Bar("corpus build", "corpus", 4, "rich", rich, get_time=t) as bar:
        bar.advance("shard-0", counts="100 documents")
    assert "corpus build" in rich.file.getvalue() and "1/4 100 documents 00:00" in rich.file.getvalue()


@pytest.mark.parametrize("display", [SweepProgress, lambda mode, console: CompileBar(1, 1, mode, console)])
def test_one_choice_of_display(display):
    interactive = Console(file=io.StringIO(), force_terminal=True, force_interactive=True)
    assert display("auto", plain()).rich is False  # a pipe or a file: log lines
    assert display("auto", interactive).rich is True
    assert display("plain", interactive).rich is False
    assert display("rich", plain()).rich is True
