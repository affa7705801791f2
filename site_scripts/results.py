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


def devices_md(page, keep, what):
    """The page's rows of the cross-check: `keep(row)` picks them; `what` says what torch ran."""
    from .sections import md_table, page_link

    report = crosscheck_report()
    rows = [[r["device"], r["dtype"], r["check"], f"`{r['tensor']}`", f"{r['max_abs']:.2e}", f"{r['max_rel']:.2e}",
             f"{r['tol_rel']:g}", "pass" if r["passed"] else "**FAIL**"]
            for r in report["rows"] if keep(r)]
    if not rows:
        raise RuntimeError("no cross-check row matches this page's filter: the filter or the check changed")
    checked = [f"**{d['device']}** ({d['dtype']}, {d['checks']} comparisons in all)" for d in report["devices"]
               if d["status"] == "checked"]
    missing = [f"- **{d['device']}**: {d['reason']}" for d in report["devices"] if d["status"] != "checked"]
    cfg = report["config"]
    return (f"The same parameters and ids through {what}, on every device the build machine has: "
            + ", ".join(checked) + ". The NumPy side is always float64. Default config "
            f"(V = {cfg['vocab_size']}, d = {cfg['emb_dim']}, H = {cfg['num_heads']}, L = {cfg['num_layers']}), "
            f"{cfg['activation']}, ids of shape {tuple(report['ids_shape'])}, seed {report['seed']}, "
            f"torch {report['versions']['torch']}.\n\n"
            + md_table(["Device", "dtype", "Check", "Tensor", "Max abs gap", "Max rel gap", "Tolerance", "Result"],
                       rows)
            + ("\nNot checked on the build machine:\n\n" + "\n".join(missing) + "\n" if missing else "")
            + f"\nWhy these tolerances: see [Cross-check on devices]({page_link(page, 'crosscheck', 'tolerances')}). "
              "Rerun it yourself: `python -m transformer crosscheck`.\n")


def summary_md(page, prefix, what):
    """One row per (device, check) whose check starts with `prefix`: how many tensors, the worst gap."""
    from .sections import md_table, page_link

    report = crosscheck_report()
    groups = {}
    for r in report["rows"]:
        if r["check"].startswith(prefix):
            groups.setdefault((r["device"], r["dtype"], r["check"]), []).append(r)
    if not groups:
        raise RuntimeError(f"no cross-check row starts with {prefix!r}")

    def order(key):
        device, dtype, check = key
        tail = check.rsplit(" ", 1)[-1]
        return device, dtype, int(tail) if tail.isdigit() else 0

    rows = []
    for key in sorted(groups, key=order):
        worst = max(groups[key], key=lambda r: r["max_rel"])
        rows.append([key[0], key[1], key[2], len(groups[key]), f"`{worst['tensor']}`", f"{worst['max_rel']:.2e}",
                     f"{worst['tol_rel']:g}", "all pass" if all(r["passed"] for r in groups[key]) else "**FAIL**"])
    missing = [f"- **{d['device']}**: {d['reason']}" for d in report["devices"] if d["status"] != "checked"]
    return (f"{what}\n\n"
            + md_table(["Device", "dtype", "Check", "Tensors compared", "Worst tensor", "Its rel gap", "Tolerance",
                        "Result"], rows)
            + ("\nNot checked on the build machine:\n\n" + "\n".join(missing) + "\n" if missing else "")
            + f"\nEvery row of these checks is listed on [Cross-check on devices]({page_link(page, 'crosscheck')}).\n")
