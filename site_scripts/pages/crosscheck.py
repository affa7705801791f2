"""Generator of the Cross-check on devices page's fragments."""

from transformer.crosscheck import TOLERANCES, check_device, compare, run_crosscheck

from .. import sections
from ..results import crosscheck_report

PAGE = "crosscheck"


def devices_md():
    report = crosscheck_report()
    rows = []
    for d in report["devices"]:
        if d["status"] == "checked":
            rows.append([f"**{d['device']}**", "checked", d["dtype"], d["checks"],
                         "all pass" if d["passed"] else "**FAIL**", d["reason"]])
        else:
            rows.append([f"**{d['device']}**", "not available on the build machine", "—", 0, "—", d["reason"]])
    cfg = report["config"]
    return (f"torch {report['versions']['torch']}, numpy {report['versions']['numpy']}; the default config "
            f"(V = {cfg['vocab_size']}, d = {cfg['emb_dim']}, H = {cfg['num_heads']}, L = {cfg['num_layers']}, "
            f"F = {cfg['ff_dim']}, {cfg['activation']}), ids of shape {tuple(report['ids_shape'])}, seed "
            f"{report['seed']}.\n\n"
            + sections.md_table(["Device", "Status", "dtype", "Comparisons", "Result", "Detail"], rows))


def tolerances_md():
    rows = [[dtype, f"{t.rel:g}", f"{t.abs:g}", t.why] for dtype, t in TOLERANCES.items()]
    return sections.md_table(["dtype on the torch side", "Relative", "Absolute", "Why this value"], rows)


def summary_md():
    report = crosscheck_report()
    groups = {}
    for r in report["rows"]:
        kind = r["check"].rsplit(" ", 1)[0] if r["check"][-1].isdigit() else r["check"]
        groups.setdefault((r["device"], r["dtype"], kind), []).append(r)
    rows = []
    for (device, dtype, kind), group in groups.items():
        worst = max(group, key=lambda r: r["max_rel"])
        rows.append([device, dtype, kind, len(group), f"`{worst['check']}: {worst['tensor']}`",
                     f"{worst['max_rel']:.2e}", f"{worst['tol_rel']:g}",
                     "all pass" if all(r["passed"] for r in group) else "**FAIL**"])
    return sections.md_table(["Device", "dtype", "Check", "Comparisons", "Worst", "Its rel gap", "Tolerance",
                              "Result"], rows)


def every_row_md():
    report = crosscheck_report()
    rows = [[r["device"], r["dtype"], r["check"], f"`{r['tensor']}`", f"{r['max_abs']:.2e}", f"{r['max_rel']:.2e}",
             f"{r['tol_rel']:g}", f"{r['tol_abs']:g}", "pass" if r["passed"] else "**FAIL**"]
            for r in report["rows"]]
    table = sections.md_table(["Device", "dtype", "Check", "Tensor", "Max abs gap", "Max rel gap", "Rel tol",
                               "Abs tol", "Result"], rows)
    return (f'??? note "All {len(rows)} comparisons"\n\n' + "\n".join("    " + line for line in table.splitlines())
            + "\n")


def generate(context):
    repo = context["repo_url"]
    return {
        "devices": devices_md(),
        "tolerances": tolerances_md(),
        "summary": summary_md(),
        "every": every_row_md(),
        "implementation": sections.implementation_md(PAGE, repo),
        "used": sections.used_md([run_crosscheck, check_device, compare]),
        "status": sections.status_md(PAGE),
        "provenance": sections.provenance_md(PAGE, {"cross-check inputs": crosscheck_report()["seed"]}),
    }
