"""The cross-check's report as text: what `python -m transformer crosscheck` prints.

Per device a summary, then one line per check with its comparison closest to failing (and every failing
row, or with verbose every row). The parameter gradients have three computations, so they are shown side
by side, one row per parameter: the hand-written NumPy backward against torch, the autograd engine against
torch, and the engine against the hand-written backward (both NumPy float64, the same on every device); in
GPT-2's layout a fourth, the hand-written backward against transformers' GPT2LMHeadModel.
"""

from .crosscheck_rows import Row

GRADIENT_CHECKS = ("gradient", "autograd", "transformers gradient")  # rows shown in the gradients' columns
# Each column of the gradients' table and the check of its rows (None: the engine against NumPy, `engine_rows`).
GRADIENT_COLUMNS = (("NumPy vs torch", "gradient"), ("engine vs torch", "autograd"), ("engine vs NumPy", None),
                    ("NumPy vs HF", "transformers gradient"))


def result_text(row):
    """pass, pass (abs) when only the absolute criterion holds, or FAIL."""
    if not row.passed:
        return "FAIL"
    return "pass (abs)" if row.on_floor else "pass"


def closeness_to_failing(row):
    """1 at the edge of the tolerance; a row passes while either ratio is <= 1."""
    rel = row.max_rel / row.tol_rel if row.tol_rel else float("inf")
    return min(rel, row.max_abs / row.tol_abs)


def engine_rows(report):
    """The engine against the hand-written gradients, as Rows of device "numpy" (one per parameter)."""
    engine, tol = report["autograd"], report["autograd"]["tolerance"]
    return {name: Row("numpy", "float64", "autograd vs numpy", name, gap["max_abs"], gap["max_rel"],
                      0.0 if gap["on_floor"] else tol["rel"], tol["abs"], gap["passed"])
            for name, gap in engine["gaps"].items()}


def format_report(report, verbose=False):
    """The report as text: a summary per device and check, the gradients three ways, and every failing row.

    Parameters
    ----------
    report : dict
        A report from `run_crosscheck`.
    verbose : bool
        List every row, not only the failing ones and the closest to failing of each check.

    Returns
    -------
    str
        The text.
    """
    cfg = report["config"]
    head = ("tied head" if cfg["tied_head"] else "own head") + (" with bias" if cfg["head_bias"] else " without bias")
    lines = [f"cross-check of the NumPy reference against torch {report['versions']['torch']} "
             f"(numpy {report['versions']['numpy']}); default config, {cfg['activation']}, {head}, "
             f"ids {tuple(report['ids_shape'])}, seed {report['seed']}"]
    for d in report["devices"]:
        if d["status"] != "checked":
            lines.append(f"  {d['device']:<5} {d['reason']}")
            continue
        tol = report["tolerances"][d["dtype"]]
        verdict = "pass" if d["passed"] else "FAIL"
        lines.append(f"  {d['device']:<5} {d['dtype']} ({d['reason']}): {d['checks']} comparisons, {verdict}; "
                     f"tolerance: relative gap <= {tol['rel']:g} or absolute gap <= {tol['abs']:g}")
        lines.append(f"        why this tolerance: {tol['why']}")
        if d.get("flash_kernel"):
            lines.append(f"        flash kernel: {d['flash_kernel']}")
    engine = report["autograd"]
    lines.append(f"  autograd engine against the hand-written NumPy gradients (both float64): largest relative gap "
                 f"{engine['max_rel']:.2e} ({engine['worst']}), tolerance {engine['tolerance']['rel']:g}; "
                 f"{len(engine['on_floor'])} zero gradients within {engine['tolerance']['abs']:g} absolute: "
                 f"{'pass' if engine['passed'] else 'FAIL'}")
    if "transformers" in report:
        lines.append(f"  transformers' GPT-2: {report['transformers']}")
    header = (f"{'device':<6} {'check':<12} {'tensor':<36} {'max abs gap':>11} {'max rel gap':>11} "
              f"{'tol':>6}  result")
    lines += ["", header]
    groups = {}
    for r in map(lambda d: Row(**d), report["rows"]):
        if r.check not in GRADIENT_CHECKS:
            groups.setdefault((r.device, r.check + "s" if r.step else r.check), []).append(r)
    for (_, check), group in groups.items():
        for r in (group if verbose else [r for r in group if not r.passed]):
            lines.append(format_row(r, r.label, r.tensor))
        failed = sum(not r.passed for r in group)
        worst = max(group, key=closeness_to_failing)
        label = f"{worst.tensor} (closest of {len(group)})" if len(group) > 1 else worst.tensor
        lines.append(format_row(worst, check, label,
                                result_text(worst) if not failed else f"FAIL: {failed} of {len(group)}"))
    lines += gradient_lines(report, verbose)
    lines.append("")
    if not report["rows"]:
        lines.append("NOTHING CHECKED: no requested device is present")
    else:
        lines.append("PASS: every comparison within tolerance" if report["passed"] else "FAIL: see the rows above")
    return "\n".join(lines)


def format_row(r, check, tensor, result=None):
    result = result or result_text(r)
    return f"{r.device:<6} {check:<12} {tensor:<36} {r.max_abs:>11.2e} {r.max_rel:>11.2e} {r.tol_rel:>6.0e}  {result}"


def gradient_lines(report, verbose=False):
    """Every parameter gradient three ways (four in GPT-2's layout), per device: relative gaps of NumPy vs torch,
    engine vs torch, engine vs NumPy (and NumPy vs transformers) side by side; the closest to failing per device,
    every failing one (verbose: every one)."""
    rows = [Row(**d) for d in report["rows"] if d["check"] in GRADIENT_CHECKS]
    if not rows:
        return []
    against_numpy = engine_rows(report)
    by_device = {}
    for r in rows:
        by_device.setdefault(r.device, {}).setdefault(r.tensor, {})[r.check] = r
    engine_tol = report["autograd"]["tolerance"]
    names = [name for name, check in GRADIENT_COLUMNS if check != "transformers gradient"
             or any(check in found for tensors in by_device.values() for found in tensors.values())]
    ways = ("three", "four")[len(names) - 3]
    lines = ["", f"gradients {ways} ways (relative gaps): NumPy = the hand-written backward, engine = the autograd "
                 f"engine{', transformers = its GPT2LMHeadModel' if len(names) > 3 else ''}; engine vs NumPy within "
                 f"{engine_tol['rel']:g} (or {engine_tol['abs']:g} absolute for a zero gradient)",
             f"{'device':<6} {'tensor':<36}" + "".join(f" {n:>15}" for n in names) + "  result"]
    for device, tensors in by_device.items():
        # None where this device has no row of a column's check (shown as n/a, judged by the others)
        columns = [(name, [found.get(check) if check else against_numpy[name]
                           for _, check in GRADIENT_COLUMNS[:len(names)]]) for name, found in tensors.items()]
        passed = lambda column: all(r.passed for r in column if r is not None)  # noqa: E731
        for name, column in columns:
            if verbose or not passed(column):
                lines.append(gradient_row(device, name, names, column))
        name, column = max(columns, key=lambda t: max(closeness_to_failing(r) for r in t[1] if r is not None))
        failed = sum(not passed(t) for _, t in columns)
        lines.append(gradient_row(device, f"{name} (closest of {len(columns)})", names, column,
                                  f"FAIL: {failed} of {len(columns)}" if failed else None))
    return lines


def gradient_row(device, tensor, names, column, result=None):
    """One parameter's gaps, one per comparison named; the result names the comparisons that fail."""
    failing = [n for n, r in zip(names, column) if r is not None and not r.passed]
    if result is None:
        result = ("FAIL: " + ", ".join(failing) if failing
                  else "pass (abs)" if any(r is not None and r.on_floor for r in column) else "pass")
    gaps = "".join(f" {'n/a':>15}" if r is None else f" {r.max_rel:>15.2e}" for r in column)
    return f"{device:<6} {tensor:<36}{gaps}  {result}"
