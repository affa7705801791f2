"""Generator of the "What survives a fault" page: every fault of tools/fault_cases.py injected into real runs
of the command line at build time, with what the program said and what its folder kept. A fault that the
program does not survive as the page says stops the build."""

import math
import tempfile
from pathlib import Path

import numpy as np

from tools import fault_cases as fc
from transformer.optim import clip_grads, global_norm

from .. import sections

PAGE = "faults"


def code(text):
    return f"`{text}`" if text else "(nothing)"


def said(ran):
    """What a command printed: stderr and stdout, each line a code span (a run time reads `t`)."""
    lines = [f"stderr: {code(line)}" for line in ran.stderr.splitlines()]
    lines += [f"stdout: {code(line)}" for line in ran.stdout.splitlines()]
    return "<br>".join(lines) or "(nothing)"


def status(ran):
    return "killed by SIGKILL (status −9)" if ran.status == -9 else f"exit status {ran.status}"


def files(kept):
    return ", ".join(f"`{name}`" for name in kept.files)


def require(ok, what):
    """Stop the build when a fault was not survived as the page would say."""
    if not ok:
        raise RuntimeError(f"fault page: {what}")


def equal_text(equal):
    same, count = equal
    return f"{'**equal**' if same else '**not equal**'}, bit for bit, in all {count} arrays (parameters and both AdamW moments)"


def kill_md(rounds, last, equal, same_losses):
    rows = []
    for i, r in enumerate(rounds, 1):
        require(r.ran.status == -9 and r.kept.loads, f"kill {i} did not leave a loadable checkpoint")
        stale = [f for f in r.kept.files if f.endswith(".tmp")]
        rows.append([str(i), f"step {r.step}, {r.moment}", status(r.ran), f"step {r.kept.step}" + (
            f"; also the torn temporary file {code(stale[0])}" if stale else ""), files(r.kept)])
    require(last.status == 0 and equal[0] and same_losses, "the resumed run does not equal the straight one")
    return (sections.md_table(["Kill", "Moment", "The process", "Checkpoint kept", "Files in the folder"], rows)
            + f"\nAfter each kill the next round was `python -m transformer train --resume --out killed`; the last "
            f"one ran to the end ({status(last)}), and removed what a torn save had left. Its final checkpoint "
            f"against the uninterrupted run's: {equal_text(equal)}; every step's training loss in `metrics.jsonl` "
            f"is equal too, each step logged once.\n")


def disk_md(case):
    if case.skipped:
        return (f"**Not run on this build machine**: mounting a {case.size:,}-byte tmpfs was refused "
                f"({code(case.skipped)}). The build goes on without this case.\n")
    require(case.ran.status == 2 and case.kept.step == fc.CKPT_EVERY and case.equal[0],
            "the full disk was not survived as described")
    rows = [["What was done", f"`--out` on a tmpfs of {case.size:,} bytes: room for one checkpoint "
                              f"(about {case.checkpoint_bytes // 1024} KiB) and a half, so the save at step "
                              f"{2 * fc.CKPT_EVERY} (a temporary file beside the kept one) fills it"],
            ["Command", code(case.ran.command)],
            ["What the program said", said(case.ran) + f"<br>{status(case.ran)}"],
            ["What was kept", f"the checkpoint of step {case.kept.step} (it loads); files: {files(case.kept)}: no "
                              "half-written file"],
            ["Then", f"the folder copied to a roomy disk and resumed: {code(case.resumed.command)}, "
                     f"{status(case.resumed)}; its end against the uninterrupted run's: {equal_text(case.equal)}"]]
    return sections.md_table(["", "At build time"], rows)


def lock_md(case):
    require(case.pid_named and case.one_run and case.loser.stdout == "", "the second run was not refused cleanly")
    rows = [["What was done", "the same command started twice at the same moment, into one `--out`, each "
                              "stopping after 3 seconds (`--max-minutes 0.05`)"],
            ["Command", code(case.winner.command)],
            ["The run that took the folder", status(case.winner)],
            ["The other", said(case.loser) + f"<br>{status(case.loser)}; **P** is the PID of the run that took "
                                              "the folder (checked now, then replaced: it differs every build)"],
            ["What was kept", "one run: `metrics.jsonl` holds each of its steps once, from step 1"]]
    return sections.md_table(["", "At build time"], rows)


def nonfinite_md(case):
    p = fc.POISONED_BATCH
    require(case.stopped.status == 2 and case.stopped_kept.step == p - 1 and case.same_losses,
            "the stopped run did not keep its last good step")
    require(case.resumed.status == 0 and case.skipped.status == 0 and case.equal[0],
            "the skipping runs do not agree")
    record = {k: v for k, v in case.skip_records[0].items() if k != "time_s"}
    rows = [["Stop (the default)", code(case.stopped.command), said(case.stopped) + f"<br>{status(case.stopped)}",
             f"the checkpoint of step {case.stopped_kept.step}, the last good one; its losses of steps 1 to {p - 1} "
             "are the uninterrupted run's"],
            ["Resumed, skipping", code(case.resumed.command), said(case.resumed),
             "the same batch drawn again, poisoned again, and skipped: the sampler had been put back before it"],
            ["Skip from the start", code(case.skipped.command), said(case.skipped),
             f"every step; `metrics.jsonl` records the batch: {code(str(record))}"]]
    return (sections.md_table(["Mode", "Command", "What the program said", "What was kept"], rows)
            + f"\nThe run stopped and resumed with skip against the run that skipped from the start: "
            f"{equal_text(case.equal)}.\n")


def overflow_md(rows):
    table = []
    for r in rows:
        require(r.ran.status == 0 and r.committed and r.finite and math.isfinite(r.norm), "overflow not survived")
        # The row shows something only if squaring first would have overflowed: norm² beyond the dtype's range.
        require(r.norm > math.sqrt(np.finfo(r.dtype).max), f"{r.dtype}: the squares of norm {r.norm:g} do not overflow")
        table.append([r.dtype, f"{r.factor:g}", code(r.ran.command), f"{r.norm:.4e}", "yes" if r.committed else "no",
                      "yes" if r.finite else "no"])
    return (sections.md_table(["dtype", f"Gradients of batch {fc.POISONED_BATCH} times", "Command",
                               "`grad_norm` recorded", "Step taken", "Every parameter finite at the end"], table)
            + "\n" + squares_md())


def squares_md():
    """The same kind of gradients in the library: the plain formula against `global_norm`, and the clip."""
    rng = np.random.default_rng(fc.SEED)
    rows = []
    for dtype, factor in fc.OVERFLOW_FACTORS.items():
        grads = {"a": (rng.standard_normal(8) * factor).astype(dtype), "b": (rng.standard_normal(3) * factor).astype(dtype)}
        with np.errstate(over="ignore"):
            plain = math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))
        clipped, norm = clip_grads(grads, 1.0)
        rows.append([dtype, f"{plain:g}", f"{norm:.4e}", f"{global_norm(clipped):.6f}"])
    return ("The same in the library, on 11 random normal entries times the factor: squaring first overflows, so "
            "the plain formula says `inf`, and a clip by `1.0 / inf` would have made every gradient zero.\n\n"
            + sections.md_table(["dtype", "sqrt(sum g²), squares first", "`global_norm`",
                                 "Norm after `clip_grads(grads, 1.0)`"], rows))


def summary_md(kill, disk, lock, nonfinite, overflow):
    """One row a fault: how it was injected, the program's first words about it, what was kept."""
    rounds, _, equal, _ = kill
    first = (lambda text: code(text.splitlines()[0]) if text else "(nothing)")
    rows = [[f"[`kill -9`, {len(rounds)} times](#kill)", "SIGKILL at random moments, each followed by `--resume`",
             "nothing (it cannot)", f"final state {equal_text(equal)}"],
            ["[Full disk](#disk)", "a small tmpfs as `--out`" if not disk.skipped else "not run: no tmpfs here",
             first(disk.ran.stderr) if disk.ran else "—",
             f"the checkpoint of step {disk.kept.step}; resumed elsewhere: {equal_text(disk.equal)}"
             if disk.ran else "—"],
            ["[Two runs, one folder](#lock)", "the same command twice at once", first(lock.loser.stderr),
             "one run's files, each step once"],
            ["[NaN gradient, stop](#nonfinite)", f"NaN in one entry of batch {fc.POISONED_BATCH}'s gradient",
             first(nonfinite.stopped.stderr), f"the checkpoint of step {nonfinite.stopped_kept.step}"],
            ["[NaN gradient, skip](#nonfinite)", "the same, with `--on-nonfinite skip`",
             first(nonfinite.skipped.stdout), f"all {fc.STEPS} steps, 1 batch skipped; {equal_text(nonfinite.equal)} "
                                              "to the run stopped and resumed with skip"]]
    rows += [[f"[Overflowing gradients, {r.dtype}](#overflow)", f"batch {fc.POISONED_BATCH}'s gradients times "
              f"{r.factor:g}", "nothing: the step is an ordinary one", f"`grad_norm` {r.norm:.4e}; every parameter "
              f"{'finite' if r.finite else 'NOT finite'}"] for r in overflow]
    return sections.md_table(["Fault", "Injected", "What the program said", "What was kept"], rows)


def generate(context):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        fc.write_corpus(folder)
        straight = fc.straight_run(folder)
        require(straight.status == 0, f"the uninterrupted run failed: {straight.stderr}")
        cases = (fc.kill_case(folder), fc.disk_case(folder), fc.lock_case(folder), fc.nonfinite_case(folder),
                 fc.overflow_case(folder))
    kill, disk, lock, nonfinite, overflow = cases
    text = {"kill": kill_md(*kill), "disk": disk_md(disk), "lock": lock_md(lock), "nonfinite": nonfinite_md(nonfinite),
            "overflow": overflow_md(overflow), "summary": summary_md(*cases)}
    for name, fragment in text.items():
        require(tmp not in fragment, f"the {name} fragment names the temporary folder {tmp}")
    return {**text, "setup": f"`{' '.join(fc.SMALL + fc.SCHEDULE)}`\n",
            "provenance": sections.provenance_md(PAGE, {"corpus and kill moments": fc.SEED})}
