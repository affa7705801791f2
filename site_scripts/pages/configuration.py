"""Generator of the Configuration page: every field with its default and its reason, read from the code."""

import ast
from dataclasses import MISSING, fields

from transformer.config import PRESETS, ModelConfig
from transformer.model import param_count
from transformer.optim import AdamWConfig
from transformer.train import TrainConfig

from .. import sections
from ..code_facts import ROOT

PAGE = "configuration"


def field_comments(path, class_name):
    """{field: the comment at the end of its line} for a dataclass, read from the source."""
    source = (ROOT / path).read_text()
    lines = source.splitlines()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return {stmt.target.id: lines[stmt.lineno - 1].split("#", 1)[1].strip() if "#" in lines[stmt.lineno - 1]
                    else "" for stmt in node.body if isinstance(stmt, ast.AnnAssign)}
    raise LookupError(f"{path} has no class {class_name}")


def dataclass_md(cls, path, reasons=None):
    reasons = reasons or field_comments(path, cls.__name__)
    rows = []
    for f in fields(cls):
        default = f.default if f.default is not MISSING else "—"
        reason = f.metadata.get("help") or reasons.get(f.name, "")
        choices = f.metadata.get("choices")
        rows.append([f"`{f.name}`", f"`{f.type if isinstance(f.type, str) else f.type.__name__}`", f"`{default!r}`",
                     reason + (f" (one of {', '.join(choices)})" if choices else "")])
    return sections.md_table(["Field", "Type", "Default", "Meaning"], rows)


def presets_md():
    rows = [[f"`{f.name}`", *[getattr(cfg, f.name) for cfg in PRESETS.values()]] for f in fields(ModelConfig)]
    rows.append(["scalars (`param_count`)", *[f"{param_count(cfg):,}" for cfg in PRESETS.values()]])
    return sections.md_table(["Field", *[f"`{name}`" for name in PRESETS]], rows)


def generate(context):
    return {
        "model": dataclass_md(ModelConfig, "transformer/config.py"),
        "presets": presets_md(),
        "train": dataclass_md(TrainConfig, "transformer/train.py"),
        "adamw": dataclass_md(AdamWConfig, "transformer/optim.py"),
        "provenance": sections.provenance_md(PAGE, {}),
    }
