"""GPT-2 small's cost as tools/gpt2_cost.py measured it (reports/gpt2-cost.json, kept in the repository: minutes
on two cores, so not measured by the build), for the pages that cite it: the GPT-2 page in full, and the memory
pages beside the tiny model's figures. The bytes that follow from the sizes alone (the parameters in float32 and
in NF4) are computed here from the preset, at every build.

A page that reads the report lists it in its registry entry's `reads`, so that a new report rebuilds it. The tables
are made here, not in site_scripts/pages/gpt2.py: those pages show times measured elsewhere and time nothing
themselves, and a page whose own code handles times is taken for one that must run alone (tests/site/test_schedule.py)."""

import json
from functools import cache

from tools import gpt2_cost as tool
from tools.common import ROOT, code_text, hash_parts, read_text
from transformer.config import PRESETS
from transformer.model import param_count

from .common import md_table
from .pages._qlora_bytes import LORA, METHODS, formula

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
    and retained MiB and its forward and step seconds; per way of decoding its tokens per second and its first
    token's seconds; T and the prompt's length. (Where they were measured, the GPT-2 page says: `provenance`.)"""
    r = report()
    values = {"T": r["T"], "prompt": r["prompt"]}
    for p in r["policies"]:
        values[slug(p["policy"])] = {"peak": mib(p["step_peak"]), "retained": mib(p["retained"]),
                                     "forward": f"{p['forward_s']:.1f}", "step": f"{p['step_s']:.1f}"}
    for d in r["decoding"]:
        values[slug(d["way"])] = {"rate": f"{d['tokens_per_s']:.1f}", "first": f"{d['first_token_s']:.2f}"}
    return values


def sizes_table():
    """GPT-2 small's bytes from its sizes: weights, gradients and AdamW state of full training, LoRA and QLoRA
    (the QLoRA page's formula, which that page checks against the real arrays on smaller configs)."""
    rows = []
    for method in METHODS:
        b = formula(PRESETS["gpt2"], method)
        rows.append([method, mib(b.weights), mib(b.grads), mib(b.state), mib(b.total)])
    return md_table(["training", "weights (MiB)", "gradients (MiB)", "AdamW state (MiB)", "total (MiB)"], rows)


def tables():
    """The GPT-2 page's part: the bytes from the sizes, and the kept measurements (each memory policy's times and
    bytes, each way of decoding), as tables and the values its prose shows."""
    r = report()
    policies = md_table(["memory policy", "forward (s)", "training step (s)", "step's peak (MiB)",
                         "kept for the backward (MiB)"],
                        [[p["policy"], f"{p['forward_s']:.1f}", f"{p['step_s']:.1f}", mib(p["step_peak"]),
                          mib(p["retained"])] for p in r["policies"]])
    first = r["decoding"][0]["tokens"]
    decoding_table = md_table(["decoding", f"first new token after {r['prompt']} (s)", "new tokens per second",
                               "greedy tokens"],
                              [[d["way"], f"{d['first_token_s']:.2f}", f"{d['tokens_per_s']:.1f}",
                                "(the reference)" if d is r["decoding"][0] else "the same as without a cache"
                                if d["tokens"] == first else "**differ** from those without a cache"]
                               for d in r["decoding"]])
    n = param_count(PRESETS["gpt2"])
    values = {"T": r["T"], "new": r["new"], "page": r["page_size"], "steps": r["steps"], "provenance": provenance(),
              "small": n, "f32": mib(4 * n), "rank": LORA.rank, "targets": list(LORA.targets),
              "speedup": decoding("contiguous")["tokens_per_s"] / decoding("no cache")["tokens_per_s"],
              "peak_hi": mib(max(p["step_peak"] for p in r["policies"])),
              "peak_lo": mib(min(p["step_peak"] for p in r["policies"])),
              "kept": policy("materialized")["retained"] / policy("checkpointed")["retained"]}
    return {"sizes": sizes_table(), "policies": policies, "decoding_cost": decoding_table}, values
