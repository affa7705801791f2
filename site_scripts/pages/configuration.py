"""Generator of the Configuration page: every field with its default and its reason, read from the code.

A field's reason is its `help` metadata, the same text `python -m transformer train --help` prints.
"""

from dataclasses import MISSING, fields

from transformer.config import PRESETS, ModelConfig
from transformer.model import param_count
from transformer.optim import AdamWConfig
from transformer.train_config import TrainConfig

from .. import sections

PAGE = "configuration"


def dataclass_md(cls):
    rows = []
    for f in fields(cls):
        default = f.default if f.default is not MISSING else "—"
        reason = f.metadata["help"]  # every field has one: a missing reason fails the build
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
        "model": dataclass_md(ModelConfig),
        "presets": presets_md(),
        "train": dataclass_md(TrainConfig),
        "adamw": dataclass_md(AdamWConfig),
        "provenance": sections.provenance_md(PAGE, {}),
    }
