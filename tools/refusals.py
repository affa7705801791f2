"""Run a bad input through the library and through the real command line, and refuse
to report one that was not refused properly.

A library call must raise a TransformerError (a ValueError) whose message mentions
what the case names. A command (`python -m transformer ...` in a subprocess) must
exit with status 2 and print exactly one line, `error: ...`, on stderr, nothing on
stdout and no traceback. Neither may change or remove a file that was there, nor
leave a checkpoint (or a checkpoint's temporary file) behind. Anything else raises
RuntimeError, which stops the build (site_scripts/hook.py turns it into an error).

Every run happens in its own copy of a folder of fixtures, with paths relative to
it, so the messages name no temporary folder and two builds print the same text.
"""

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from transformer.cli import EXIT_USER_ERROR
from transformer.errors import TransformerError

from tools.common import ROOT

CHECKPOINT_LEFTOVERS = (".npz", ".tmp")  # a refused run must leave neither behind
TIMEOUT_S = 300  # per process: a bad input that makes a command hang stops the build after this long


@dataclass(frozen=True)
class Case:
    slug: str  # the anchor of the case on the page
    title: str
    call: str = ""  # a library call, evaluated in setup()'s namespace; "" for command-line-only cases
    # The command line after `python -m transformer`, as typed in a shell (shlex splits it); None for
    # library-only cases, "" for the command with no arguments at all.
    cli: str | None = None
    names: tuple = ()  # what the message must mention, so that the right error is shown
    tests: tuple = ()  # the names of the test functions that check this case (their files are found)

    @property
    def argv(self):
        return shlex.split(self.cli or "")  # never shlex.split(None), which would read stdin

    @property
    def command(self):
        return shlex.join(["python", "-m", "transformer", *self.argv])


@dataclass
class Ran:
    """What one refused input did: the exception (library) or the exit status and stderr (command)."""
    raised: str = ""  # exception class
    message: str = ""
    status: int | None = None
    stderr: str = ""
    kept: list = field(default_factory=list)  # files that were there before and are byte for byte the same
    created: list = field(default_factory=list)


@contextmanager
def working_directory(folder):
    old = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(old)


def snapshot(folder):
    """{path relative to folder: sha256 of its bytes} of every file under folder."""
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def check_files(where, before, after):
    """(kept, created): refuse a run that changed or removed a file, or left a checkpoint behind."""
    changed = [p for p in before if p in after and after[p] != before[p]]
    removed = [p for p in before if p not in after]
    created = [p for p in after if p not in before]
    leftovers = [p for p in created if p.endswith(CHECKPOINT_LEFTOVERS)]
    if changed or removed or leftovers:
        raise RuntimeError(f"{where} lost or left files: changed {changed}, removed {removed}, "
                           f"left behind {leftovers}")
    return [p for p in before if after.get(p) == before[p]], created


def check_mentions(said, text, names):
    """Refuse a message that does not mention what the case names: it could be the wrong error."""
    missing = [n for n in names if n not in text]
    if missing:
        raise RuntimeError(f"{said}; it does not mention {missing}")


def check_raised(case, error):
    """Refuse a library call that raised nothing, raised something that is not a TransformerError,
    or whose message does not mention what the case names."""
    where = f"bad input {case.slug!r}: `{case.call}`"
    if error is None:
        raise RuntimeError(f"{where} was accepted: it raised no error")
    if not isinstance(error, TransformerError):
        raise RuntimeError(f"{where} raised {type(error).__name__}: {error}; the library must raise a "
                           "TransformerError (a ValueError) that the command line prints as one line")
    check_mentions(f"{where} raised {type(error).__name__}: {error}", str(error), case.names)


def check_command(case, status, stdout, stderr):
    """Refuse a command that exited 0 or with another status than 2, printed a traceback, printed
    anything but one `error: ...` line, or whose line does not mention what the case names."""
    where = f"bad input {case.slug!r}: `{case.command}`"
    if "Traceback" in stderr:
        raise RuntimeError(f"{where} printed a traceback:\n{stderr}")
    if status == 0:
        raise RuntimeError(f"{where} exited with status 0: the bad input was accepted\n{stdout}{stderr}")
    if status != EXIT_USER_ERROR:
        raise RuntimeError(f"{where} exited with status {status}, not {EXIT_USER_ERROR}\n{stderr}")
    lines = stderr.splitlines()
    if stdout or len(lines) != 1 or not lines[0].startswith("error: "):
        raise RuntimeError(f"{where} must print one line `error: ...` on stderr and nothing on stdout; "
                           f"it printed {stdout!r} and {stderr!r}")
    check_mentions(f"{where} printed {lines[0]!r}", lines[0], case.names)


def run_call(case, namespace, folder):
    """Evaluate the case's library call in folder (its working directory) and check how it failed."""
    before, error = snapshot(folder), None
    with working_directory(folder):
        try:
            eval(case.call, dict(namespace))  # noqa: S307 - the calls are this page's own source
        except Exception as e:  # noqa: BLE001 - check_raised judges what was raised
            error = e
    check_raised(case, error)
    kept, created = check_files(f"`{case.call}`", before, snapshot(folder))
    return Ran(raised=type(error).__name__, message=str(error), kept=kept, created=created)


def python(args, folder, what):
    """Run this checkout's Python in folder: its package first, no corpus from the environment."""
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMER_CORPUS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    try:
        return subprocess.run([sys.executable, *args], cwd=folder, capture_output=True, text=True, env=env,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what} ran past {TIMEOUT_S} s") from None


def run_command(case, folder):
    """Run `python -m transformer <argv>` in folder and check how it failed."""
    before = snapshot(folder)
    result = python(["-m", "transformer", *case.argv], folder, f"bad input {case.slug!r}: `{case.command}`")
    check_command(case, result.returncode, result.stdout, result.stderr)
    kept, created = check_files(f"`{case.command}`", before, snapshot(folder))
    return Ran(status=result.returncode, stderr=result.stderr.strip(), kept=kept, created=created)


def run_all(cases, namespace, fixtures, workdir):
    """{slug: (library Ran or None, command Ran or None)}: each run in its own copy of fixtures.

    The library calls run one after another (each changes the working directory); the commands,
    each a separate process, run side by side.
    """
    def copy(kind, case):
        folder = Path(workdir) / kind / case.slug
        shutil.copytree(fixtures, folder)
        return folder

    library = {c.slug: run_call(c, namespace, copy("library", c)) for c in cases if c.call}
    commands = [c for c in cases if c.cli is not None]
    folders = [copy("command", c) for c in commands]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        ran = dict(zip([c.slug for c in commands], pool.map(run_command, commands, folders), strict=True))
    return {c.slug: (library.get(c.slug), ran.get(c.slug)) for c in cases}


OPTIMIZED_SCRIPT = """\
{setup}
import json
import sys
from transformer.errors import TransformerError

if __debug__:
    sys.exit("not running under python -O")
raised = []
for call in [
{calls}
]:
    try:
        eval(call)
        raised.append(None)
    except TransformerError as e:
        raised.append([type(e).__name__, str(e)])
print(json.dumps(raised))
"""


def run_optimized(cases, setup, folder, expected):
    """Run every library call again under `python -O` (asserts removed) in a fresh process in folder, and
    refuse any that did not raise what it raised in the build, expected[slug] = (class, message).
    Returns the script, which the page shows."""
    calls = [c for c in cases if c.call]
    script = OPTIMIZED_SCRIPT.format(setup=setup.rstrip(), calls="\n".join(f"    {c.call!r}," for c in calls))
    result = python(["-O", "-c", script], folder, "the library calls under python -O")
    if result.returncode != 0:
        raise RuntimeError(f"the library calls under python -O failed:\n{result.stderr}")
    raised = dict(zip([c.slug for c in calls], json.loads(result.stdout), strict=True))
    accepted = [c.call for c in calls if raised[c.slug] is None]
    if accepted:
        raise RuntimeError(f"under python -O these bad inputs were accepted: {accepted}")
    differ = [c.slug for c in calls if tuple(raised[c.slug]) != expected[c.slug]]
    if differ:
        raise RuntimeError(f"under python -O these calls raised something else: {differ}")
    return script
