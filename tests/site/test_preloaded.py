"""The launcher of the mutation run (tools/preloaded.py): a check forked from it is what `python -m` in the
copy would be."""

import time
from pathlib import Path

import pytest

from tools.preloaded import Launcher, available
from tools.project_copy import project_copy

pytestmark = pytest.mark.skipif(not available(), reason="a launcher forks, and this system cannot")

PROBE = '''import os, sys
import transformer
print(transformer.__file__)
print(os.getcwd())
print(os.environ["OMP_NUM_THREADS"], sys.dont_write_bytecode)
from threadpoolctl import threadpool_info
print(sorted({p["num_threads"] for p in threadpool_info()}))
print("to stderr", file=sys.stderr)
raise SystemExit(int(sys.argv[1]))
'''


@pytest.fixture(scope="module")
def launcher():
    with Launcher(threads=1) as launcher:
        yield launcher


@pytest.fixture
def copy():
    with project_copy(lambda c: (c / "transformer" / "probe.py").write_text(PROBE), prefix="launcher-") as copy:
        yield copy


def test_a_forked_check_imports_the_copys_package_in_the_copy_with_one_thread(launcher, copy):
    """The probe exists only in the copy, so finding it already shows where `transformer` comes from."""
    result = launcher.run(copy, "transformer.probe", ["0"], timeout=60)
    where, cwd, settings, blas, _ = result.stdout.split("\n")
    assert result.returncode == 0, result.stderr
    assert where == str(copy / "transformer" / "__init__.py")
    assert cwd == str(copy)
    assert settings == "1 True" and blas == "[1]"
    assert result.stderr == "to stderr\n"


def test_a_forked_check_exits_with_its_status_and_a_crash_with_its_traceback(launcher, copy):
    assert launcher.run(copy, "transformer.probe", ["3"], timeout=60).returncode == 3
    crashed = launcher.run(copy, "transformer.probe", ["not a number"], timeout=60)
    assert crashed.returncode == 1
    assert crashed.stderr.rstrip().splitlines()[-1].startswith("ValueError: invalid literal for int()")
    missing = launcher.run(copy, "transformer.no_such_module", [], timeout=60)
    assert missing.returncode == 1 and "No module named transformer.no_such_module" in missing.stderr


def test_a_check_past_its_time_is_killed_and_the_launcher_serves_the_next(launcher, copy):
    (copy / "transformer" / "hang.py").write_text("import time\ntime.sleep(60)\n")
    assert launcher.run(copy, "transformer.hang", [], timeout=0.5) is None
    assert launcher.run(copy, "transformer.probe", ["0"], timeout=60).returncode == 0


def test_a_forked_pytest_run_reports_what_a_new_process_would(launcher, copy):
    from tools.project_copy import run_pytest

    test = copy / "tests" / "unit" / "test_launched.py"
    test.write_text("def test_passes():\n    pass\n\ndef test_fails():\n    assert 1 == 2\n")
    forked = run_pytest(copy, [str(test)], timeout=120, launcher=launcher)
    new = run_pytest(copy, [str(test)], timeout=120, threads=1)
    assert forked.returncode == new.returncode == 1
    assert forked.failures == new.failures == ("tests/unit/test_launched.py::test_fails",)
    assert forked.reasons == new.reasons == ("assert 1 == 2",)  # what the mutation run's detail quotes


def test_checks_that_end_at_once_are_answered_at_once_one_after_another(launcher, copy):
    """A check that ends before the launcher answers must not leave its answer unread for the next one."""
    (copy / "transformer" / "quick.py").write_text("import sys\nraise SystemExit(int(sys.argv[1]))\n")
    assert [launcher.run(copy, "transformer.quick", [str(code)], timeout=60).returncode
            for code in range(8)] == list(range(8))


def test_a_check_past_its_time_is_killed_with_every_process_it_started(launcher, copy, tmp_path):
    pid_file = tmp_path / "pid"
    (copy / "transformer" / "spawns.py").write_text(
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen(['sleep', '60'])\nopen({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n")
    assert launcher.run(copy, "transformer.spawns", [], timeout=1.0) is None
    status = Path(f"/proc/{pid_file.read_text()}/status")
    for _ in range(100):  # killed at once; reaped by whoever inherits it soon after
        if not status.exists() or "State:\tZ" in status.read_text():
            break
        time.sleep(0.02)
    assert not status.exists() or "State:\tZ" in status.read_text()


def test_a_forked_check_ends_as_a_new_process_would_and_draws_its_own_random_numbers(launcher, copy):
    (copy / "transformer" / "ends.py").write_text(
        "import atexit, random\nimport numpy as np\n"
        "atexit.register(lambda: print('atexit ran'))\nprint(random.random(), np.random.random())\n")
    first, second = (launcher.run(copy, "transformer.ends", [], timeout=60).stdout.split("\n") for _ in range(2))
    assert first[1] == second[1] == "atexit ran"
    a, b = (line.split() for line in (first[0], second[0]))
    assert a[0] != b[0] and a[1] != b[1]
