"""Generator of the Cross-check on devices page: the values its prose shows (docs/verification/crosscheck.md binds
them), its tables and its picture, all read from the report of `python -m transformer crosscheck`
(site_scripts/results.py runs it once per change of the code behind it)."""

import numpy as np

from transformer.crosscheck import ADAMW, ZERO_GRADIENT_NOISE
from transformer.crosscheck_rows import TOLERANCES

from .. import sections
from ..figures import new_figure, png
from ..results import ROW_HEADER, crosscheck_report, device_label, row_cells

ZERO_AT = 1e-18  # where the picture draws a gap that is exactly zero (a log axis has no 0)


def kinds(report):
    """The checks of the report, in the order they first appear."""
    return list(dict.fromkeys(r.check for r in report["rows"]))


def machine(report):
    rows = []
    for d in report["devices"]:
        if d["status"] == "checked":
            rows.append([f"**{d['device']}**", "checked", d["dtype"], d["checks"],
                         "all pass" if d["passed"] else "**FAIL**", d["reason"]])
        else:
            rows.append([f"**{d['device']}**", "not available", "—", 0, "—", d["reason"]])
    cfg = report["config"]
    values = {"torch": report["versions"]["torch"], "numpy": report["versions"]["numpy"],
              "n_v": cfg["vocab_size"], "d": cfg["emb_dim"], "h": cfg["num_heads"], "l": cfg["num_layers"],
              "f": cfg["ff_dim"], "activation": cfg["activation"], "ids_shape": report["ids_shape"],
              "seed": report["seed"], "checked": [d["device"] for d in report["devices"] if d["status"] == "checked"],
              "absent": [d["device"] for d in report["devices"] if d["status"] != "checked"]}
    return sections.md_table(["Device", "Status", "dtype", "Comparisons", "Result", "Detail"], rows), values


def tolerances(report):
    """The table of tolerances by dtype, and the rows held to a bound of their own (the key biases' drift in
    whole training steps)."""
    rows = [[dtype, f"{t.rel:g}", f"{t.abs:g}", t.why] for dtype, t in TOLERANCES.items()]
    special = [r for r in report["rows"] if (r.tol_rel, r.tol_abs) != (TOLERANCES[r.dtype].rel, TOLERANCES[r.dtype].abs)]
    bounds = sorted({r.tol_abs for r in special})
    values = {"count": len(special), "checks": sorted({r.check for r in special}),
              "tensors": sorted({r.tensor for r in special}), "noise": ZERO_GRADIENT_NOISE, "lr": ADAMW.lr,
              "eps": ADAMW.eps, "bound_lo": bounds[0], "bound_hi": bounds[-1], "float32": TOLERANCES["float32"].rel}
    return sections.md_table(["dtype on the torch side", "Relative", "Absolute", "Why this value"], rows), values


def summary_md(report):
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
    return sections.md_table(["Device", "Check", "Comparisons", "Worst relative gap in", "Its gap", "Rel tolerance",
                              "Result"], rows)


def worked(report):
    """Two comparisons written out: the logits (passed on the relative gap) and the first row passed on the
    absolute tolerance alone."""
    logits = next(r for r in report["rows"] if r.check == "forward")
    floor = next(r for r in report["rows"] if r.on_floor)
    return {"logits": {"gap": logits.max_abs, "rel": logits.max_rel, "scale": logits.max_abs / logits.max_rel,
                       "tol": logits.tol_rel, "margin": logits.tol_rel / logits.max_rel,
                       "device": device_label(report, logits.device)},
            "floor": {"check": floor.label, "tensor": floor.tensor, "gap": floor.max_abs, "rel": floor.max_rel,
                      "tol_rel": floor.tol_rel, "tol_abs": floor.tol_abs}}


def gaps_png(report):
    """Every comparison's relative gap, by check, against the relative tolerance of its dtype: the rows judged on
    their relative gap, the rows passed on the absolute tolerance alone, and exact zeros at the bottom."""
    names = kinds(report)
    jitter = np.random.default_rng(0).uniform(-0.3, 0.3, len(report["rows"]))  # spreads the dots of a column
    x = np.array([names.index(r.check) for r in report["rows"]]) + jitter
    rel = np.array([r.max_rel for r in report["rows"]])
    floor = np.array([r.on_floor for r in report["rows"]])
    fig, ax = new_figure(figsize=(11, 4.6))
    plain = ~floor & (rel > 0)
    ax.scatter(x[plain], rel[plain], s=6, alpha=0.5, label="judged on the relative gap")
    ax.scatter(x[rel == 0], np.full((rel == 0).sum(), ZERO_AT), s=14, marker="v", color="tab:green",
               label=f"gap exactly 0 (drawn at {ZERO_AT:g})")
    ax.scatter(x[floor], rel[floor], s=18, marker="x", color="tab:red", label="passed on the absolute tolerance")
    for dtype in sorted({r.dtype for r in report["rows"]}):
        ax.axhline(TOLERANCES[dtype].rel, color="gray", lw=1, ls="--", label=f"relative tolerance, {dtype}")
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)), names, rotation=40, ha="right")
    ax.set_xlabel("check")
    ax.set_ylabel("relative gap, max |ours − torch| / scale")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    judged = [r for r, keep in zip(report["rows"], plain) if keep]
    closest = min(judged, key=lambda r: r.tol_rel / r.max_rel)
    values = {"zeros": int((rel == 0).sum()), "floor": int(floor.sum()), "median": float(np.median(rel[plain])),
              "floor_tensors": sorted({r.tensor for r in report["rows"] if r.on_floor}),
              "floor_above": sum(r.on_floor and r.max_rel > TOLERANCES[r.dtype].rel for r in report["rows"]),
              "closest": f"{closest.label}: {closest.tensor}", "closest_rel": closest.max_rel,
              "margin": closest.tol_rel / closest.max_rel}
    return png(fig), values


def generate(context):
    report = crosscheck_report()
    machine_table, machine_values = machine(report)
    tolerance_table, tolerance_values = tolerances(report)
    picture, picture_values = gaps_png(report)
    steps = max(r.step for r in report["rows"] if r.check == "adamw step")
    values = {"total": len(report["rows"]), "checks": kinds(report), "kinds": len(kinds(report)), "steps": steps,
              "machine": machine_values, "tolerance": tolerance_values, "picture": picture_values,
              "worked": worked(report)}
    return {"values": values, "gaps.png": picture, "machine": machine_table, "tolerances": tolerance_table,
            "summary": summary_md(report),
            "every": sections.md_table(ROW_HEADER, [row_cells(report, r) for r in report["rows"]]),
            "provenance": sections.provenance_md("crosscheck", {"cross-check inputs": report["seed"]})}
