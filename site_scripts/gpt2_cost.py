"""GPT-2 small's cost as tools/gpt2_cost.py measured it (reports/gpt2-cost.json, kept in the repository: minutes
on two cores, so not measured by the build), for the pages that cite it: the GPT-2 page in full, and the memory
pages beside the tiny model's figures. The bytes that follow from the sizes alone (the parameters in float32 and
in NF4) are computed here from the preset, at every build.

A page that reads the report lists it in its registry entry's `reads`, so that a new report rebuilds it."""

import json
from functools import cache

from tools import gpt2_cost as tool
from tools.common import ROOT, code_text, hash_parts, read_text

MIB = 1 << 20


@cache
def report():
    """The kept report, with `changed`: the package's files it ran whose code differs now (empty: it measured
    the code of this build)."""
    value = json.loads(tool.REPORT.read_text())
    value["changed"] = changed_files(value["code"])
    return value


def changed_files(code):
    """The files of {file: hash of its code} whose code now hashes otherwise, or that are gone."""
    return [f for f, h in code.items() if not (ROOT / f).exists() or hash_parts(code_text(read_text(ROOT / f))) != h]


def policy(name):
    """The measurement of one memory policy."""
    return next(p for p in report()["policies"] if p["policy"] == name)


def decoding(way):
    """The measurement of one way of decoding ("no cache", "contiguous", "paged")."""
    return next(d for d in report()["decoding"] if d["way"] == way)


def provenance():
    """Where and when the figures were measured, as a sentence's words; with the files changed since, if any."""
    r, m = report(), report()["machine"]
    text = (f"measured by `python -m tools.gpt2_cost` on {m['cores']} cores ({m['cpu']}, load average "
            f"{m['load_before']:.2f} before the run), numpy {m['numpy']}, at commit `{r['commit']}` on {r['date']}")
    if r["changed"]:
        text += f"; the code of {', '.join(f'`{f}`' for f in r['changed'])} has changed since"
    return text


def mib(n_bytes):
    return f"{n_bytes / MIB:,.0f}"


def slug(name):
    """A policy's or a way of decoding's name as a template key: "flash + checkpointed" -> flash_checkpointed."""
    return name.replace(" + ", "_").replace(" ", "_")


def cited():
    """The figures the memory pages cite beside the tiny model's, as template values: per policy its step's peak
    and retained MiB and its forward and step seconds; per way of decoding its tokens per second; T and where
    they were measured."""
    r = report()
    values = {"T": r["T"], "prompt": r["prompt"]}
    for p in r["policies"]:
        values[slug(p["policy"])] = {"peak": mib(p["step_peak"]), "retained": mib(p["retained"]),
                                     "forward": f"{p['forward_s']:.1f}", "step": f"{p['step_s']:.1f}"}
    for d in r["decoding"]:
        values[slug(d["way"])] = {"rate": f"{d['tokens_per_s']:.1f}", "first": f"{d['first_token_s']:.2f}"}
    return values
