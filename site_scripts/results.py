"""Results several pages share, computed once per change of the code behind them.

The device cross-check takes seconds and every component page shows its own
rows of it, so its report is cached in build/cache/, keyed by the source of
the functions `run_crosscheck` reaches and the torch version. A page that
imports this module depends on those functions (site_scripts/depends.py
follows the import), so it reruns whenever the report could change.
"""

import hashlib
import json

from transformer.crosscheck import run_crosscheck

from . import depends
from .build import ROOT, torch_version

CACHE = ROOT / "build" / "cache"
_memo = {}


def crosscheck_key():
    units = depends.closure({("crosscheck", "run_crosscheck")})
    text = depends.units_text(units) + "\0" + torch_version()
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def crosscheck_report():
    """The report of `python -m transformer crosscheck` (all devices present, default settings)."""
    key = crosscheck_key()
    if key not in _memo:
        path = CACHE / f"crosscheck-{key}.json"
        if path.exists():
            _memo[key] = json.loads(path.read_text())
        else:
            report = json.loads(json.dumps(run_crosscheck()))  # the same types as a reloaded one
            CACHE.mkdir(parents=True, exist_ok=True)
            for old in CACHE.glob("crosscheck-*.json"):
                old.unlink()
            path.write_text(json.dumps(report, sort_keys=True))
            _memo[key] = report
    return _memo[key]


def result_text(row):
    """pass, pass on the absolute floor (a tensor that is ~0), or FAIL."""
    if not row["passed"]:
        return "**FAIL**"
    return "pass" if row["max_rel"] <= row["tol_rel"] else "pass (gap below the absolute tolerance)"


def tolerance_text(row):
    return f"{row['tol_rel']:g} / {row['tol_abs']:.0e}"


def device_label(report, device):
    d = next(d for d in report["devices"] if d["device"] == device)
    return f"{device} ({d['dtype']})"


def missing_md(report):
    missing = [f"- **{d['device']}**: {d['reason']}" for d in report["devices"] if d["status"] != "checked"]
    return "\nNot checked on the build machine:\n\n" + "\n".join(missing) + "\n" if missing else ""


def devices_md(page, keep, what):
    """The page's rows of the cross-check: `keep(row)` picks them; `what` says what torch ran."""
    from .sections import md_table, page_link

    report = crosscheck_report()
    picked = [r for r in report["rows"] if keep(r)]
    if not picked:
        raise RuntimeError("no cross-check row matches this page's filter: the filter or the check changed")
    header = ["Device", "Check", "Tensor", "Max abs gap", "Max rel gap", "Tolerance (rel / abs)", "Result"]
    rows = [[device_label(report, r["device"]), r["check"], f"`{r['tensor']}`", f"{r['max_abs']:.2e}",
             f"{r['max_rel']:.2e}", tolerance_text(r), result_text(r)] for r in picked]
    counts = [f"{sum(r['device'] == d['device'] for r in picked)} of the {d['checks']} comparisons on "
              f"{device_label(report, d['device'])}" for d in report["devices"] if d["status"] == "checked"]
    shared = []  # a column that holds one value in every row moves into the caption
    for column in (5, 0):
        values = {row[column] for row in rows}
        if len(values) == 1:
            shared.append(f"{header[column].lower()} {values.pop()}")
            header = header[:column] + header[column + 1:]
            rows = [row[:column] + row[column + 1:] for row in rows]
    cfg = report["config"]
    return (f"The same parameters and ids through {what}, on every device the build machine has. The NumPy side "
            f"is always float64. Default config (V = {cfg['vocab_size']}, d = {cfg['emb_dim']}, H = "
            f"{cfg['num_heads']}, L = {cfg['num_layers']}), {cfg['activation']}, ids of shape "
            f"{tuple(report['ids_shape'])}, seed {report['seed']}, torch {report['versions']['torch']}. This page "
            "shows " + "; ".join(counts) + (f", every row with {' and '.join(reversed(shared))}" if shared else "")
            + ".\n\n" + md_table(header, rows)
            + missing_md(report)
            + f"\nA comparison passes when its relative gap or its absolute gap is within tolerance. Why these "
              f"values: [Cross-check on devices]({page_link(page, 'crosscheck', 'tolerances')}). "
              "Rerun it yourself: `python -m transformer crosscheck`.\n")


def summary_md(page, prefix, what):
    """One row per (device, check) whose check starts with `prefix`: how many tensors, the worst gap."""
    from .sections import md_table, page_link

    report = crosscheck_report()
    groups = {}
    for r in report["rows"]:
        if r["check"].startswith(prefix):
            groups.setdefault((r["device"], r["check"]), []).append(r)
    if not groups:
        raise RuntimeError(f"no cross-check row starts with {prefix!r}")

    def order(key):
        tail = key[1].rsplit(" ", 1)[-1]
        return key[0], int(tail) if tail.isdigit() else 0

    rows = []
    for key in sorted(groups, key=order):
        group = groups[key]
        worst = max(group, key=lambda r: r["max_rel"] if r["max_rel"] <= r["tol_rel"] else -1)
        floor = [r for r in group if r["passed"] and r["max_rel"] > r["tol_rel"]]
        rows.append([device_label(report, key[0]), key[1], len(group), f"`{worst['tensor']}`",
                     f"{worst['max_rel']:.2e}", f"{worst['tol_rel']:g}",
                     ("all pass" if all(r["passed"] for r in group) else "**FAIL**")
                     + (f" ({len(floor)} on the absolute tolerance: "
                        + ", ".join(f"`{r['tensor']}`" for r in floor) + ")" if floor else "")])
    return (f"{what}\n\n"
            + md_table(["Device", "Check", "Tensors", "Worst relative gap in", "Its gap", "Rel tolerance",
                        "Result"], rows)
            + missing_md(report)
            + "\nThe key bias gradients are zero in exact arithmetic, so their relative gaps compare rounding noise "
              "with rounding noise; they pass on an absolute bound instead "
              f"([why]({page_link(page, 'crosscheck', 'tolerances')})). "
              f"Every row of these checks is listed on [Cross-check on devices]({page_link(page, 'crosscheck')}).\n")
