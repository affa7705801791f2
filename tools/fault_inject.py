"""Run the real command line with one fault injected where it would strike: the fault page's driver.

    python -m tools.fault_inject [FAULT ...] -- train --corpus ... --out ...

Faults (each may be given more than once):

  --kill STEP:MOMENT   the process sends itself SIGKILL at that moment of step STEP: "after-step" (the
                       step computed, its metrics line not yet written), "mid-save" (half of the checkpoint
                       written to its temporary file) or "validation" (while the validation loss is computed)
  --poison N:VALUE     the N-th batch's gradient (counted from 1, skipped ones included) gets VALUE (nan,
                       inf) in its first entry of b0.wq
  --scale N:FACTOR     the N-th batch's gradients are all multiplied by FACTOR (1e200: huge but finite)

The faults reach the program through the training loop's hooks (`transformer.train.Hooks`, given to
`transformer.cli.main`), and only through them: everything else is the program itself, the same loop, the
same checks, the same files. A self-sent SIGKILL is the signal `kill -9` sends, at a moment chosen by the
caller, so that the page reads the same on every build; nothing can catch or delay it.
"""

import argparse
import io
import os
import signal
import sys

from transformer.checkpoint import write_npz
from transformer.cli import main as cli_main
from transformer.train import Hooks

MOMENTS = ("after-step", "mid-save", "validation")


def die():
    """What kill -9 does to this process."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def die_at(steps):
    """A hook called with a step that ends the process at each of `steps`; None when there are none."""
    if not steps:
        return None

    def hook(step):
        if step in steps:
            die()
    return hook


def half_written_at(steps):
    """A write_checkpoint hook: the save at each of `steps` writes half of its bytes into the temporary file,
    makes them durable, and dies; every other save is written whole. None when there are no such steps."""
    if not steps:
        return None

    def write(step, f, arrays):
        if step not in steps:
            return write_npz(f, arrays)
        whole = io.BytesIO()
        write_npz(whole, arrays)
        f.write(whole.getvalue()[: len(whole.getvalue()) // 2])
        f.flush()
        os.fsync(f.fileno())
        die()
    return write


def changed_at(changes):
    """A gradients hook: change(grads) applied to the gradients of the batch-th batch a run computes (counted
    from 1), for each (batch, change) in order; None when there are no changes."""
    if not changes:
        return None
    count = [0]

    def gradients(grads):
        count[0] += 1
        for batch, change in changes:
            if batch == count[0]:
                grads = change(grads)
        return grads
    return gradients


def poisoned(value):
    def change(grads):
        grads["b0.wq"] = grads["b0.wq"].copy()
        grads["b0.wq"].flat[0] = value
        return grads
    return change


def scaled(factor):
    return lambda grads: {k: g * factor for k, g in grads.items()}


def fault_hooks(kills, poisons, scales):
    """The loop's hooks that inject the faults: kills as (step, moment), poisons as (batch, value), scales as
    (batch, factor)."""
    at = {moment: {step for step, m in kills if m == moment} for moment in MOMENTS}
    changes = [(batch, poisoned(float(value))) for batch, value in poisons]
    changes += [(batch, scaled(float(factor))) for batch, factor in scales]
    return Hooks(step_taken=die_at(at["after-step"]), validating=die_at(at["validation"]),
                 write_checkpoint=half_written_at(at["mid-save"]), gradients=changed_at(changes))


def pair(text):
    head, _, tail = text.partition(":")
    return int(head), tail


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m tools.fault_inject", description=__doc__.splitlines()[0],
                                     usage="%(prog)s [FAULT ...] -- COMMAND LINE OF python -m transformer")
    parser.add_argument("--kill", type=pair, action="append", default=[], metavar="STEP:MOMENT")
    parser.add_argument("--poison", type=pair, action="append", default=[], metavar="N:VALUE")
    parser.add_argument("--scale", type=pair, action="append", default=[], metavar="N:FACTOR")
    args = parser.parse_args(argv[:split])
    if split == len(argv):
        parser.error("give the command line to run after --, as in: -- train --corpus FILE --out DIR")
    for step, moment in args.kill:
        if moment not in MOMENTS:
            parser.error(f"--kill {step}:{moment}: the moment is one of {', '.join(MOMENTS)}")
    return cli_main(argv[split + 1:], hooks=fault_hooks(args.kill, args.poison, args.scale))


if __name__ == "__main__":
    sys.exit(main())
