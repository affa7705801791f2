"""Generator of the Cross-check on devices page's fragments."""

from transformer.crosscheck import ADAMW, TOLERANCES, ZERO_GRADIENT_NOISE

from .. import sections
from ..examples import collapsed
from ..results import ROW_HEADER, crosscheck_report, device_label, row_cells


def machine_md():
    report = crosscheck_report()
    rows = []
    for d in report["devices"]:
        if d["status"] == "checked":
            rows.append([f"**{d['device']}**", "checked", d["dtype"], d["checks"],
                         "all pass" if d["passed"] else "**FAIL**", d["reason"]])
        else:
            rows.append([f"**{d['device']}**", "not available", "—", 0, "—", d["reason"]])
    cfg = report["config"]
    return (f"torch {report['versions']['torch']}, numpy {report['versions']['numpy']}; the default config "
            f"(n_V = {cfg['vocab_size']}, d = {cfg['emb_dim']}, H = {cfg['num_heads']}, L = {cfg['num_layers']}, "
            f"F = {cfg['ff_dim']}, {cfg['activation']}), ids of shape {tuple(report['ids_shape'])}, seed "
            f"{report['seed']}.\n\n"
            + sections.md_table(["Device", "Status", "dtype", "Comparisons", "Result", "Detail"], rows))


def tolerances_md():
    rows = [[dtype, f"{t.rel:g}", f"{t.abs:g}", t.why] for dtype, t in TOLERANCES.items()]
    report = crosscheck_report()
    special = [r for r in report["rows"]
               if (r.tol_rel, r.tol_abs) != (TOLERANCES[r.dtype].rel, TOLERANCES[r.dtype].abs)]
    text = (sections.md_table(["dtype on the torch side", "Relative", "Absolute", "Why this value"], rows)
            + "\nA comparison passes when its relative gap is within the relative tolerance or its absolute gap "
              "within the absolute one. The relative gap is max |ours − torch| divided by the larger of max |ours| "
              "and max |torch|.\n")
    if special:
        bounds = sorted({r.tol_abs for r in special})
        tensors = sorted({r.tensor for r in special})
        checks = sorted({r.check for r in special})
        text += (f"\n**One exception, {len(special)} comparisons** ({', '.join(checks)}; "
                 + ", ".join(f"`{t}`" for t in tensors) + "). The key bias gets a zero gradient in exact arithmetic: "
                 "adding the same vector to every key adds the same number to every score of a row, which the "
                 "softmax ignores. Each framework computes it as rounding noise instead (at most "
                 f"{ZERO_GRADIENT_NOISE:g} allowed here), and Adam divides that noise by √v + ε, so each side moves "
                 f"the key bias by up to lr × noise / ε per step (lr = {ADAMW.lr:g}, ε = {ADAMW.eps:g}), in "
                 "unrelated directions. Relative comparison of two noises means nothing, so these rows have relative "
                 f"tolerance 0 and an absolute bound that grows with the step, from {bounds[0]:.1e} to "
                 f"{bounds[-1]:.1e}: twice the largest drift either side can have taken.\n")
    return text


def summary_md():
    report = crosscheck_report()
    groups = {}
    for r in report["rows"]:
        groups.setdefault((r.device, r.dtype, r.check), []).append(r)
    rows = []
    for (device, _, kind), group in groups.items():
        relative = [r for r in group if r.max_rel <= r.tol_rel]
        worst = max(relative or group, key=lambda r: r.max_rel)
        floor = len(group) - len(relative)
        rows.append([device_label(report, device), kind, len(group), f"`{worst.label}: {worst.tensor}`",
                     f"{worst.max_rel:.2e}", f"{worst.tol_rel:g}",
                     ("all pass" if all(r.passed for r in group) else "**FAIL**")
                     + (f"; {floor} on the absolute tolerance" if floor else "")])
    return (sections.md_table(["Device", "Check", "Comparisons", "Worst relative gap in", "Its gap",
                               "Rel tolerance", "Result"], rows)
            + "\nThe worst relative gap is taken over the comparisons that pass on their relative gap; those that "
              "pass on the absolute tolerance (tensors that are zero in exact arithmetic) are counted in the last "
              "column.\n")


def every_row_md():
    report = crosscheck_report()
    rows = [row_cells(report, r) for r in report["rows"]]
    return collapsed(f"All {len(rows)} comparisons", sections.md_table(ROW_HEADER, rows))


def generate(context):
    return {
        "provenance": sections.provenance_md("crosscheck", {"cross-check inputs": crosscheck_report()["seed"]}),
        "machine": machine_md(),
        "tolerances": tolerances_md(),
        "summary": summary_md(),
        "every": every_row_md(),
    }
