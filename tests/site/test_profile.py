"""The build's profile (site_scripts/profile.py): parts that end at once all keep their times."""

import json
import multiprocessing
import threading

from site_scripts import profile


def record_many(tag, count):
    for i in range(count):
        profile.record(f"{tag} {i}", i / 10)


def test_parts_that_end_at_once_in_threads_and_processes_are_all_kept(tmp_path, monkeypatch):
    """Two processes, each with four threads recording fifty parts: every part is in the file at the end, and no
    reader ever found it half-written (which raised an error in a CI run, when the two reports ended in two
    threads at once). Without the locks and the whole-file replace this fails at once, on a lost part or a
    half-written file."""
    monkeypatch.setattr(profile, "path", lambda: tmp_path / "profile-full.json")

    def one_process(name):
        threads = [threading.Thread(target=record_many, args=(f"{name} thread {t}", 50)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    context = multiprocessing.get_context("fork")  # the child keeps the patched path
    child = context.Process(target=one_process, args=("child",))
    child.start()
    one_process("parent")
    child.join()
    assert child.exitcode == 0
    stored = json.loads((tmp_path / "profile-full.json").read_text())
    expected = {f"{p} thread {t} {i}" for p in ("parent", "child") for t in range(4) for i in range(50)}
    assert set(stored) == expected
