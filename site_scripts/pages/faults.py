"""Generator of the "What survives a fault" page: every fault of tools/fault_cases.py injected into real runs of
the command line at build time; the values its prose shows (docs/verification/faults.md binds them), its tables
and its picture. A fault that the program does not survive as the page says stops the build (`require`)."""

import math
import tempfile
from pathlib import Path

import numpy as np

from tools import fault_cases as fc
from transformer.optim import clip_grads, global_norm
from transformer.train_config import MAX_SKIPS_IN_A_ROW

from .. import sections
from ..figures import new_figure, png

PAGE = "faults"
CLIP = 1.0  # the library example's clip


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


# ---------------------------------------------------------------- kill -9

def kill_part(rounds, last, equal, same_losses, final):
    """The kill table, and the values of its prose; `final` is what the killed run's folder kept at the end."""
    rows = []
    for i, r in enumerate(rounds, 1):
        require(r.ran.status == -9 and r.kept.loads, f"kill {i} did not leave a loadable checkpoint")
        stale = [f for f in r.kept.files if f.endswith(".tmp")]
        rows.append([str(i), f"step {r.step}, {r.moment}", status(r.ran), f"step {r.kept.step}" + (
            f"; also the torn temporary file {code(stale[0])}" if stale else ""), files(r.kept)])
    require(last.status == 0 and equal[0] and same_losses, "the resumed run does not equal the straight one")
    require(not any(f.endswith(".tmp") for f in final.files), "the resumed run left a torn temporary file behind")
    table = sections.md_table(["Kill", "Moment", "The process", "Checkpoint kept", "Files in the folder"], rows)
    return table, {"kills": len(rounds), "resume": last.command, "last": last.status,
                   "arrays": equal[1], "final_files": final.files, "redone": sum(r.step - r.kept.step for r in rounds)}


def kill_png(rounds, straight, killed):
    """The uninterrupted run's training loss, step by step, the killed run's on top of it, each kill and the
    checkpoint it went back to."""
    fig, ax = new_figure(figsize=(10, 4.2))
    steps = sorted(straight)
    ax.plot(steps, [straight[s] for s in steps], "-", color="tab:blue", lw=2.5, alpha=0.4, label="run with no fault")
    ax.plot(sorted(killed), [killed[s] for s in sorted(killed)], ".", color="k", ms=5,
            label=f"run killed {len(rounds)} times, resumed after each (its metrics.jsonl)")
    for i, r in enumerate(rounds):
        y = straight[r.step]
        ax.plot([r.step], [y], "x", color="tab:red", ms=10, mew=2, label="kill -9" if i == 0 else None)
        ax.annotate("", xy=(r.kept.step, straight[r.kept.step]), xytext=(r.step, y),
                    arrowprops={"arrowstyle": "->", "color": "tab:red", "connectionstyle": "arc3,rad=-0.4"})
    for s in range(fc.CKPT_EVERY, fc.STEPS + 1, fc.CKPT_EVERY):
        ax.axvline(s, color="gray", lw=0.8, ls=":", label="checkpoint saved" if s == fc.CKPT_EVERY else None)
    ax.set_xlabel("training step")
    ax.set_ylabel("training loss of the step")
    ax.legend(fontsize="small", loc="upper right")
    return png(fig)


# ---------------------------------------------------------------- a full disk, two runs, a NaN, an overflow

def disk_md(case):
    if case.skipped:
        return sections.md_table(["", "At build time"], [[
            "What was done", f"**not run on this build machine**: mounting a {case.size:,}-byte tmpfs was refused "
                             f"({code(case.skipped)})"]])
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


def nonfinite_part(case):
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
    table = sections.md_table(["Mode", "Command", "What the program said", "What was kept"], rows)
    return table, {"batch": p, "kept": case.stopped_kept.step, "arrays": case.equal[1]}


def overflow_md(rows):
    table = []
    for r in rows:
        require(r.ran.status == 0 and r.committed and r.finite and math.isfinite(r.norm), "overflow not survived")
        # The row shows something only if squaring first would have overflowed: norm² beyond the dtype's range.
        require(r.norm > math.sqrt(np.finfo(r.dtype).max), f"{r.dtype}: the squares of norm {r.norm:g} do not overflow")
        table.append([r.dtype, f"{r.factor:g}", code(r.ran.command), f"{r.norm:.4e}", "yes" if r.committed else "no",
                      "yes" if r.finite else "no"])
    return sections.md_table(["dtype", f"Gradients of batch {fc.POISONED_BATCH} times", "Command",
                              "`grad_norm` recorded", "Step taken", "Every parameter finite at the end"], table)


def squares():
    """The same kind of gradients in the library: the plain formula against `global_norm` and the clip, and the
    power-of-two scaling of global_norm written out for the float32 case."""
    rng = np.random.default_rng(fc.SEED)
    rows, sizes = [], (8, 3)
    for dtype, factor in fc.OVERFLOW_FACTORS.items():
        grads = {name: (rng.standard_normal(n) * factor).astype(dtype) for name, n in zip("ab", sizes)}
        with np.errstate(over="ignore"):
            plain = math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))
        clipped, norm = clip_grads(grads, CLIP)
        rows.append([dtype, f"{plain:g}", f"{norm:.4e}", f"{global_norm(clipped):.6f}"])
        if dtype == "float32":
            largest = max(float(np.abs(g).max()) for g in grads.values())
            k = math.frexp(largest)[1] - 1
            total = sum(float(np.vdot(g / 2.0 ** k, g / 2.0 ** k)) for g in grads.values())
            worked = {"largest": largest, "k": k, "total": total, "root": math.sqrt(total), "norm": norm,
                      "max": float(np.finfo(np.float32).max), "square": largest ** 2}
            require(2.0 ** k * math.sqrt(total) == norm, "the written-out global norm is not global_norm's")
    table = sections.md_table(["dtype", "sqrt(sum g²), squares first", "`global_norm`",
                               "Norm after `clip_grads(grads, 1.0)`"], rows)
    return table, {"entries": sum(sizes), "clip": CLIP, "worked": worked}


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
        words = len((folder / "corpus.txt").read_text().split(" "))
        straight = fc.straight_run(folder)
        require(straight.status == 0, f"the uninterrupted run failed: {straight.stderr}")
        cases = (fc.kill_case(folder), fc.disk_case(folder), fc.lock_case(folder), fc.nonfinite_case(folder),
                 fc.overflow_case(folder))
        final, losses = fc.kept(folder / "killed"), (fc.losses(folder / "straight"), fc.losses(folder / "killed"))
        logged = [r["step"] for r in fc.metric_records(folder / "killed", "loss")]
    require(logged == list(range(1, fc.STEPS + 1)), f"the killed run logged the steps {logged}, not each once")
    kill, disk, lock, nonfinite, overflow = cases
    kill_table, kill_values = kill_part(*kill, final)
    nonfinite_table, nonfinite_values = nonfinite_part(nonfinite)
    squares_table, squares_values = squares()
    text = {"kill": kill_table, "disk": disk_md(disk), "lock": lock_md(lock), "nonfinite": nonfinite_table,
            "overflow": overflow_md(overflow), "squares": squares_table, "summary": summary_md(*cases)}
    for name, fragment in text.items():
        require(tmp not in fragment, f"the {name} fragment names the temporary folder {tmp}")
    values = {"words": words, "settings": " ".join(fc.SMALL + fc.SCHEDULE), "every": fc.CKPT_EVERY,
              "disk_size": disk.size, "max_skips": MAX_SKIPS_IN_A_ROW, "kill": kill_values, "nonfinite": nonfinite_values, "squares": squares_values}
    return {"values": values, **text, "kill.png": kill_png(kill[0], *losses),
            "provenance": sections.provenance_md(PAGE, {"corpus and kill moments": fc.SEED})}
