"""Generator of the Command line page: the real --help of every command, and the exit codes."""

import argparse
import os

from transformer.cli import (
    EXIT_CHECK_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USER_ERROR,
    build_parser,
)

from .. import sections

PAGE = "cli"


def help_texts():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    yield "python -m transformer", parser.format_help()
    for name, command in sub.choices.items():
        yield f"python -m transformer {name}", command.format_help()


def help_md():
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "80"  # argparse wraps to the terminal: fix the width so pages do not vary
    try:
        parts = [f"### `{title} --help`\n\n```text\n{text.rstrip()}\n```\n" for title, text in help_texts()]
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    return "\n".join(parts)


def exit_md():
    rows = [[0, "success"], [EXIT_CHECK_FAILED, "a check ran and failed (gradcheck, crosscheck)"],
            [EXIT_USER_ERROR, "a mistake in the input: one line `error: ...` on stderr, never a traceback "
                              "(crosscheck also uses it when no device could be checked)"],
            [EXIT_INTERRUPTED, "interrupted by a second Ctrl-C (the first one stops training after the current "
                               "step and writes a checkpoint)"]]
    return sections.md_table(["Exit status", "Meaning"], rows)


def generate(context):
    return {"help": help_md(), "exit": exit_md(), "provenance": sections.provenance_md(PAGE, {})}
