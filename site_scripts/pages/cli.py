"""Generator of the Command line page: the real --help of every command, and the exit codes."""

import argparse
import functools

from transformer.cli import EXIT_CHECK_FAILED, EXIT_INTERRUPTED, EXIT_USER_ERROR, build_parser

from .. import sections

PAGE = "cli"


def commands(title, parser):
    """The parser and every command under it (a command with actions of its own, `exercise start`, included)."""
    found = {title: parser}
    for sub in (a for a in parser._actions if isinstance(a, argparse._SubParsersAction)):
        for name, command in sub.choices.items():
            found.update(commands(f"{title} {name}", command))
    return found


def help_md():
    parts = []
    for title, command in commands("python -m transformer", build_parser()).items():
        # argparse wraps to the terminal (78 columns in one of 80); fixed, the page is the same wherever built.
        command.formatter_class = functools.partial(command.formatter_class, width=78)
        parts.append(f"### `{title} --help`\n\n```text\n{command.format_help().rstrip()}\n```\n")
    return "\n".join(parts)


def exit_md():
    rows = [[0, "success"], [EXIT_CHECK_FAILED, "a check ran and failed (gradcheck, crosscheck, exercise check)"],
            [EXIT_USER_ERROR, "a mistake in the input: one line `error: ...` on stderr, never a traceback "
                              "(crosscheck also uses it when no device could be checked)"],
            [EXIT_INTERRUPTED, "interrupted by a second Ctrl-C (the first one stops training after the current "
                               "step and writes a checkpoint)"]]
    return sections.md_table(["Exit status", "Meaning"], rows)


def generate(context):
    return {"help": help_md(), "exit": exit_md(), "provenance": sections.provenance_md(PAGE, {})}
