"""Run the real command line with one fault injected where it would strike: the fault page's driver.

    python -m tools.fault_inject [FAULT ...] -- train --corpus ... --out ...

Faults (each may be given more than once):

  --kill STEP:MOMENT   the process sends itself SIGKILL at that moment of step STEP: "after-step" (the
                       step computed, its metrics line not yet written), "mid-save" (half of the checkpoint
                       written to its temporary file) or "validation" (while the validation loss is computed)
  --poison N:VALUE     the N-th batch's gradient (counted from 1, skipped ones included) gets VALUE (nan,
                       inf) in its first entry of b0.wq
  --scale N:FACTOR     the N-th batch's gradients are all multiplied by FACTOR (1e200: huge but finite)

Everything else is the program itself: the same loop, the same checks, the same files. A self-sent SIGKILL
is the signal `kill -9` sends, at a moment chosen by the caller, so that the page reads the same on every
build; nothing can catch or delay it.
"""

import argparse
import io
import os
import signal
import sys

import numpy as np

import transformer.checkpoint as checkpoint_module
import transformer.train as train_module
from transformer.cli import main as cli_main

MOMENTS = ("after-step", "mid-save", "validation")


def die():
    """What kill -9 does to this process."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def kill_at(step, moment):
    """Patch the moment of `step` to end the process with SIGKILL."""
    if moment == "after-step":
        real_step = train_module.train_step

        def train_step(run, *args):
            record = real_step(run, *args)
            if run.step == step:
                die()
            return record
        train_module.train_step = train_step
    elif moment == "validation":
        real_validate = train_module.Session.validate

        def validate(self):
            if self.run.step == step:
                die()
            return real_validate(self)
        train_module.Session.validate = validate
    else:
        kill_mid_save(step)


def kill_mid_save(step):
    """The save after `step` writes half of its bytes into the temporary file, makes them durable, and dies."""
    real_savez, real_save = np.savez, train_module.Session.save

    def save(self):
        if self.run.step == step:
            checkpoint_module.np.savez = half_savez
        real_save(self)

    def half_savez(f, **arrays):
        whole = io.BytesIO()
        real_savez(whole, **arrays)
        f.write(whole.getvalue()[: len(whole.getvalue()) // 2])
        f.flush()
        os.fsync(f.fileno())
        die()
    train_module.Session.save = save


def change_gradients(batch, change):
    """Apply change(grads) to the gradients of the batch-th batch a run computes (counted from 1)."""
    real, count = train_module.Run.loss_and_grads, [0]

    def loss_and_grads(self, x, y):
        loss, grads = real(self, x, y)
        count[0] += 1
        return (loss, change(grads)) if count[0] == batch else (loss, grads)
    train_module.Run.loss_and_grads = loss_and_grads


def poisoned(value):
    def change(grads):
        grads["b0.wq"] = grads["b0.wq"].copy()
        grads["b0.wq"].flat[0] = value
        return grads
    return change


def scaled(factor):
    return lambda grads: {k: g * factor for k, g in grads.items()}


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
        kill_at(step, moment)
    for batch, value in args.poison:
        change_gradients(batch, poisoned(float(value)))
    for batch, factor in args.scale:
        change_gradients(batch, scaled(float(factor)))
    return cli_main(argv[split + 1:])


if __name__ == "__main__":
    sys.exit(main())
