"""Which of the package's functions a check's run calls, and whether a mutant changes only functions it never calls.

A check of the mutation run (tools/mutants.py) runs a command, `python -m transformer train ...` say, against a
copy of the package. When a mutant changes nothing but the bodies of functions that the same command never
called on the unchanged code, the command runs exactly the same code on the mutant: the same statements, in
the same order, on the same data. Its result is the unchanged code's, and the mutation run reports that result
instead of paying for the run again (the training check on a mutant of the KV cache, say: the training
command never builds a cache).

The record is made in the child that runs the check (tools/preloaded.py), for the unchanged code only:

- `sys.settrace` and `threading.settrace` install a function that notes the code object of every new frame and
  traces nothing inside it, so the command runs at almost its usual speed;
- an audit hook notes whether the command started another process (a subprocess, a fork, a spawn, os.system):
  what runs there is not seen, so such a record is not used.

A record is refused as well when the command took the trace function away (a debugger, a coverage tool).

Deciding, for each edit of a mutant, in the unchanged source (`unreached`):

- the edit must lie inside the body of a `def` (module level and class bodies run at import; the signature and
  the decorators are evaluated where the function is defined);
- the innermost such function must be absent from the record, matched by its file, name and first line (the
  first decorator's, as Python numbers a code object).

A function inside a reached function counts as reached (its body may run whenever the outer one does).

    start_recording(root, path)             # in the check's process: note what runs, write it to path at exit
    reached = read_record(path)             # the set of (file, name, first line) called, or None if unusable
    why = unreached(spans, reached)         # None: some edit may run; else the functions never called
"""

import ast
import atexit
import json
import sys
import threading
from pathlib import Path

PACKAGE = "transformer"
# Audit events of starting a process (https://docs.python.org/3/library/audit_events.html).
SPAWNS = ("subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system", "os.exec",
          "os.startfile", "pty.spawn")


def start_recording(root, path):
    """In the check's own process, before it runs: note every function of root/PACKAGE that runs from now on,
    and write the record to `path` at exit. Returns the writer, which atexit also calls."""
    root = str(Path(root)) + "/"
    prefix = root + PACKAGE + "/"
    called, spawned = set(), []

    def note(frame, event, arg):
        called.add(frame.f_code)
        return None  # nothing traced inside the frame: only calls are noted

    def audit(event, args):
        if event in SPAWNS:
            spawned.append(event)

    def write():
        intact = sys.gettrace() is note
        sys.settrace(None)
        threading.settrace(None)
        functions = sorted({(c.co_filename[len(root):], c.co_name, c.co_firstlineno)
                            for c in called.copy() if c.co_filename.startswith(prefix)})  # a copy: threads may run
        Path(path).write_text(json.dumps({"functions": functions, "spawned": spawned, "intact": intact}))

    sys.addaudithook(audit)  # for good: the process ends with the check
    threading.settrace(note)
    sys.settrace(note)
    atexit.register(write)
    return write


def read_record(path):
    """The functions a recorded run called, as a set of (path under the root, name, first line), or None when
    the record cannot say what did not run: missing, the command started another process, or the trace
    function was taken away."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if record["spawned"] or not record["intact"]:
        return None
    return {tuple(f) for f in record["functions"]}


def merged(records):
    """The union of several records of one check (a check may run its command twice); None if any is None, or
    there is none (a check that runs no recorded command, the unit tests, says nothing of what it calls)."""
    if not records or any(r is None for r in records):
        return None
    return set().union(*records)


def enclosing_function(tree, first, last):
    """The innermost `def` whose body holds lines first..last (1-based), as (name, first line of the def or its
    first decorator), or None when the lines are not all inside one body."""
    found = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            if node.body[0].lineno > node.lineno and node.body[0].lineno <= first and last <= node.end_lineno:
                if found is None or node.lineno > found.lineno:  # nested: starts later
                    found = node
    if found is None:
        return None
    return found.name, min([found.lineno, *(d.lineno for d in found.decorator_list)])


def unreached(spans, reached):
    """Why every edit is where the recorded run never went: the functions that hold them, "path:name, ...";
    None when some edit may run, or there is no usable record. `spans`: for each edit, (its file's path under the
    root, the file's unchanged source, the edit's first and last line in it)."""
    if reached is None or not spans:
        return None
    names = []
    for path, source, first, last in spans:
        if Path(path).parts[0] != PACKAGE:
            return None
        where = enclosing_function(ast.parse(source), first, last)
        if where is None or (path, *where) in reached:
            return None
        names.append(f"{path}:{where[0]}")
    return ", ".join(dict.fromkeys(names))
