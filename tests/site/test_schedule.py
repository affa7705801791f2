"""The build's scheduler (site_scripts/schedule.py): what runs at once, what runs alone, what runs after what."""

import json
import os
import re
import subprocess

import pytest
from schedule_probe import blas_threads_seen, die, raise_two_part, record, write_pid
from sitebuild import ROOT

from site_scripts import build, registry
from site_scripts.schedule import Task, jobs_from_env, order, run


def task(folder, name, after=(), alone="", seconds=0.4, fail=False):
    """A task that records when it ran (schedule_probe.record)."""
    return Task(name, record, (str(folder), name, seconds, fail), frozenset(after), alone)


def intervals(folder):
    return {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")}


def overlap(a, b):
    return a[0] < b[1] and b[0] < a[1]


def test_one_job_runs_the_alone_tasks_first_and_each_task_after_those_it_comes_after(tmp_path):
    tasks = [task(tmp_path, "b", after=["c"]), task(tmp_path, "c"), task(tmp_path, "a", alone="times"),
             task(tmp_path, "d", after=["a"], alone="times")]
    assert [t.name for t in order(tasks)] == ["a", "d", "c", "b"]  # the alone ones first; b after c
    logged = []
    assert list(run(tasks, 1, logged.append)) == ["a", "d", "c", "b"]
    assert [line.split(" in ")[0] for line in logged] == ["a", "d", "c", "b"]
    ran = intervals(tmp_path)
    assert ran["a"][1] <= ran["d"][0] <= ran["d"][1] <= ran["c"][0] <= ran["c"][1] <= ran["b"][0]


def test_several_jobs_run_side_by_side_but_an_alone_task_runs_with_nothing_beside_it(tmp_path):
    tasks = [task(tmp_path, "b"), task(tmp_path, "c"), task(tmp_path, "d", after=["b"]),
             task(tmp_path, "timed", alone="it times what it runs"),
             task(tmp_path, "late", after=["c"], alone="it uses every core")]
    logged = []
    run(tasks, 2, logged.append)
    ran = intervals(tmp_path)
    assert set(ran) == {"b", "c", "d", "timed", "late"}
    assert overlap(ran["b"], ran["c"])  # two jobs: both ran at once
    assert ran["b"][1] <= ran["d"][0] and ran["c"][1] <= ran["late"][0]
    for name in ("timed", "late"):
        assert not any(overlap(ran[name], ran[other]) for other in ran if other != name), name
    assert ran["timed"][1] <= min(ran[n][0] for n in ("b", "c"))  # the alone task first, on an idle machine
    assert "late in " in " ".join(logged) and "(alone: it uses every core)" in " ".join(logged)


def test_tasks_side_by_side_share_the_cores_for_blas_and_an_alone_task_has_them_all(tmp_path, monkeypatch):
    """Each of two tasks side by side may use half the cores for BLAS threads, in its process and in those it
    starts; an alone task every core; and the worker's own setting is back once a task ends."""
    monkeypatch.setattr("site_scripts.schedule.cores", lambda: 4)
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    tasks = [Task(name, blas_threads_seen, (str(tmp_path), name), alone=alone)
             for name, alone in (("a", ""), ("b", ""), ("timed", "it times what it runs"))]
    run(tasks, 2, lambda line: None)
    seen = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*.threads")}
    assert seen == {"a": ["2", [2]], "b": ["2", [2]], "timed": ["4", [4]]}
    blas_threads_seen(tmp_path, "here")  # the one-job path leaves this process as it was
    assert json.loads((tmp_path / "here.threads").read_text())[0] is None


def test_a_failing_task_stops_the_run_with_its_error_and_nothing_after_it_starts(tmp_path):
    tasks = [task(tmp_path, "broken", seconds=0.1, fail=True), task(tmp_path, "slow", seconds=1.0),
             task(tmp_path, "next", after=["broken"])]
    with pytest.raises(RuntimeError, match="task broken failed on purpose"):
        run(tasks, 2, lambda line: None)
    assert set(intervals(tmp_path)) == {"slow"}  # the running one was waited for; the one after never started
    with pytest.raises(RuntimeError, match="task broken failed on purpose"):
        run(tasks, 1, lambda line: None)


def test_an_error_that_cannot_travel_back_and_a_dead_worker_are_named(tmp_path):
    logged = []
    with pytest.raises(RuntimeError, match=r"odd: TwoPartError: probe: its arguments do not rebuild it\n.*Traceback"):
        run([Task("odd", raise_two_part), task(tmp_path, "other")], 2, logged.append)
    assert "odd failed" in logged
    with pytest.raises(RuntimeError, match="a worker process died while these ran: (b, )?dead "):
        run([Task("dead", die), task(tmp_path, "b", seconds=0.1)], 2, logged.append)


def test_fresh_runs_even_one_job_in_a_worker_process_of_its_own(tmp_path):
    run([Task("here", write_pid, (str(tmp_path), "here"))], 1, lambda line: None)
    run([Task("fresh", write_pid, (str(tmp_path), "fresh"))], 1, lambda line: None, fresh=True)
    assert (tmp_path / "here.pid").read_text() == str(os.getpid()) != (tmp_path / "fresh.pid").read_text()


def test_tasks_that_cannot_be_scheduled_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="b comes after nothing"):
        order([task(tmp_path, "b", after=["nothing"])])
    with pytest.raises(ValueError, match="in a circle: a, b"):
        order([task(tmp_path, "a", after=["b"]), task(tmp_path, "b", after=["a"])])
    with pytest.raises(ValueError, match="share a name"):
        order([task(tmp_path, "a"), task(tmp_path, "a")])


def test_the_number_of_jobs_comes_from_site_jobs_else_the_cores(monkeypatch):
    monkeypatch.delenv("SITE_JOBS", raising=False)
    assert jobs_from_env() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("SITE_JOBS", "3")
    assert jobs_from_env() == 3
    for bad in ("0", "two", "-1", "1.5"):
        monkeypatch.setenv("SITE_JOBS", bad)
        with pytest.raises(ValueError, match=f"SITE_JOBS='{re.escape(bad)}': give a whole number"):
            jobs_from_env()


@pytest.mark.parametrize("args", [["--jobs", "0"], ["--jobs=x"], ["--jobs"]])
def test_scripts_site_refuses_a_bad_job_count_before_it_sets_anything_up(args):
    result = subprocess.run(["bash", str(ROOT / "scripts" / "site"), *args], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2
    assert re.fullmatch(r"scripts/site: --jobs (needs a number|\(SITE_JOBS\) must be a whole number).*\n",
                        result.stderr, flags=re.S)


TIMES = re.compile(r"perf_counter|time\.time\(|tokens_per_s")


def test_every_page_and_notebook_that_times_what_it_runs_is_marked_alone():
    """A timing taken beside another job measures the other job too: a page whose own code reads the clock (its
    generator and the helpers of site_scripts/pages it imports; a notebook's source) must run alone. (The memory
    policies, timed by tools/memory_policies.py, are measured by a task of their own, before the pages that show
    them: build.SHARED_RESULTS.)"""
    timing = set()
    for page in registry.PAGES:
        if page.notebook:
            files = [ROOT / "notebooks" / f"{page.id}.py"]
        elif page.generated and build.generator_path(page.id):
            files = [f for f in build.page_sources(page.id) if f.parent == ROOT / "site_scripts" / "pages"]
        else:
            continue
        if any(TIMES.search(f.read_text()) for f in files):
            timing.add(page.id)
    assert timing == {"kvcache", "serving", "autograd", "qlora", "shakespeare", "finetune"}
    assert {p.id for p in registry.PAGES if p.alone} == timing | {"mutants"}  # its mutation run uses every core
    memory = [alone for _, file, _, alone in build.SHARED_RESULTS if file == "memory.py"]
    assert len(memory) == 1 and memory[0]  # tools/memory_policies.py times each policy
