"""The device cross-check, computed once per change of the code behind it, and the pages' rows of it.

The cross-check takes seconds and every component page shows its own rows of it, so its report is cached in
build/cache/, keyed by the source of the functions `run_crosscheck` reaches and the numpy and torch versions. A
page that shows its rows depends on those functions (site_scripts/build.py adds them to its key), so it reruns
whenever the report could change.
"""

from fnmatch import fnmatchcase

from transformer.crosscheck import Row, run_crosscheck

from . import depends
from .common import CACHE, cached_json, hash_parts, md_table, numpy_version, torch_version, verdict_text
from .registry import Steps
from .sections import page_link

_memo = {}


def crosscheck_report():
    """The report of `python -m transformer crosscheck` (all devices present, default settings), rows as Rows."""
    key = hash_parts(depends.units_text(depends.closure({("crosscheck", "run_crosscheck")})), numpy_version(),
                     torch_version())
    if key not in _memo:
        report = dict(cached_json(CACHE / "crosscheck.json", key, run_crosscheck))
        report["rows"] = [Row(**r) for r in report["rows"]]
        _memo[key] = report
    return _memo[key]


def device_label(report, device):
    d = next(d for d in report["devices"] if d["device"] == device)
    return f"{device} ({d['dtype']})"


ROW_HEADER = ["Device", "Check", "Tensor", "Max abs gap", "Max rel gap", "Tolerance (rel / abs)", "Result"]


def row_cells(report, r):
    """A row of the cross-check as the cells of ROW_HEADER."""
    return [device_label(report, r.device), r.label, f"`{r.tensor}`", f"{r.max_abs:.2e}", f"{r.max_rel:.2e}",
            f"{r.tol_rel:g} / {r.tol_abs:.0e}", verdict_text(r.passed, r.on_floor, "gap below the absolute tolerance")]


def missing_md(report):
    missing = [f"- **{d['device']}**: {d['reason']}" for d in report["devices"] if d["status"] != "checked"]
    return "\nNot checked on the build machine:\n\n" + "\n".join(missing) + "\n" if missing else ""


def devices_md(page, rows):
    """The page's rows of the cross-check, as its registry entry selects them (Rows or Steps)."""
    if isinstance(rows, Steps):
        return steps_md(page, rows)
    report = crosscheck_report()
    picked = [r for r in report["rows"] if any(fnmatchcase(r.tensor, p) for p in rows.select.get(r.check, ()))]
    if not picked:
        raise RuntimeError(f"no cross-check row matches the selection of page {page}: the selection or the check "
                           "changed")
    header, cells = ROW_HEADER, [row_cells(report, r) for r in picked]
    counts = [f"{sum(r.device == d['device'] for r in picked)} of the {d['checks']} comparisons on "
              f"{device_label(report, d['device'])}" for d in report["devices"] if d["status"] == "checked"]
    shared = []  # a column that holds one value in every row moves into the caption
    for column in (5, 0):
        values = {row[column] for row in cells}
        if len(values) == 1:
            shared.append(f"{header[column].lower()} {values.pop()}")
            header = header[:column] + header[column + 1:]
            cells = [row[:column] + row[column + 1:] for row in cells]
    cfg = report["config"]
    return (f"The same parameters and ids through {rows.what}, on every device the build machine has. The NumPy "
            f"side is always float64. Default config (n_V = {cfg['vocab_size']}, d = {cfg['emb_dim']}, H = "
            f"{cfg['num_heads']}, L = {cfg['num_layers']}), {cfg['activation']}, ids of shape "
            f"{tuple(report['ids_shape'])}, seed {report['seed']}, torch {report['versions']['torch']}. This page "
            "shows " + "; ".join(counts) + (f", every row with {' and '.join(reversed(shared))}" if shared else "")
            + ".\n\n" + md_table(header, cells)
            + missing_md(report)
            + f"\nA comparison passes when its relative gap or its absolute gap is within tolerance. Why these "
              f"values: [Cross-check on devices]({page_link(page, 'crosscheck', 'tolerances')}). "
              "Rerun it yourself: `python -m transformer crosscheck`.\n")


def steps_md(page, steps):
    """One row per device and step of `steps.check`: how many tensors, the worst gap."""
    report = crosscheck_report()
    groups = {}
    for r in report["rows"]:
        if r.check == steps.check:
            groups.setdefault((r.device, r.step), []).append(r)
    if not groups:
        raise RuntimeError(f"no cross-check row is a {steps.check!r}")
    rows = []
    for device, step in sorted(groups):
        group = groups[device, step]
        worst = max(group, key=lambda r: r.max_rel if r.max_rel <= r.tol_rel else -1)
        floor = [r for r in group if r.on_floor]
        rows.append([device_label(report, device), group[0].label, len(group), f"`{worst.tensor}`",
                     f"{worst.max_rel:.2e}", f"{worst.tol_rel:g}",
                     ("all pass" if all(r.passed for r in group) else "**FAIL**")
                     + (f" ({len(floor)} on the absolute tolerance: "
                        + ", ".join(f"`{r.tensor}`" for r in floor) + ")" if floor else "")])
    return (f"{steps.what}\n\n"
            + md_table(["Device", "Check", "Tensors", "Worst relative gap in", "Its gap", "Rel tolerance",
                        "Result"], rows)
            + missing_md(report)
            + "\nThe key bias gradients are zero in exact arithmetic, so their relative gaps compare rounding noise "
              "with rounding noise; they pass on an absolute bound instead "
              f"([why]({page_link(page, 'crosscheck', 'tolerances')})). "
              f"Every row of these checks is listed on [Cross-check on devices]({page_link(page, 'crosscheck')}).\n")
