"""The standard anatomy of a component page, written into its docs page by the hook.

A docs page holds its prose and the line `<!-- anatomy -->`; the hook replaces that line with the
standard sections, in this order, each one only if the page's generator made its fragment. A page with
sections of its own in the middle splits the anatomy in two: `<!-- anatomy to example -->` renders the
sections up to and including the example, `<!-- anatomy from implementation -->` those from the listings
on, and the page's own sections stand between.
"""

import re

CONNECTION_LEAD = ("Each row ties an equation to a line that computes it, or to a test that checks that function; "
                   "the line number and the code are read from the file at build time.\n\n")

# (fragment, heading and lead text); provenance closes the page without a heading.
SECTIONS = (
    ("symbols", "## Symbols and tensor shapes\n\n"),
    ("example", "## Tiny numerical example\n\n"),
    ("implementation", "## Actual implementation\n\n"),
    ("connection", "## Code and math connection {#code-and-math}\n\n" + CONNECTION_LEAD),
    ("gradcheck", "## Gradient check\n\n"),
    ("devices", "## Cross-check on devices\n\n"),
    ("used", "## Where is it used?\n\n"),
    ("status", "## Status\n\n"),
    ("provenance", ""),
)
NAMES = [name for name, _ in SECTIONS]
MARKER = re.compile(r"^<!-- anatomy(?: (to|from) (\w+))? -->$", re.M)


def render(page, fragments, part=None, name=None):
    """The sections of `page` whose fragments (a set of names) exist; `part` is "to" or "from" `name`."""
    if part and name not in NAMES:
        raise ValueError(f"<!-- anatomy {part} {name} -->: no such section; the sections are {', '.join(NAMES)}")
    if part == "to":
        chosen = SECTIONS[:NAMES.index(name) + 1]
    elif part == "from":
        chosen = SECTIONS[NAMES.index(name):]
    else:
        chosen = SECTIONS
    return "\n".join(f'{heading}--8<-- "{page}/{fragment}.md"\n' for fragment, heading in chosen if fragment in fragments)


def expand(markdown, page, fragments):
    """The docs page with each anatomy marker replaced by its sections; a mistyped marker is an error, not a
    comment that silently shows nothing."""
    for line in re.findall(r"^<!-- *anatomy.*$", markdown, flags=re.M):
        if not MARKER.fullmatch(line):
            raise ValueError(f"{line!r} is not an anatomy marker: write <!-- anatomy -->, <!-- anatomy to NAME --> "
                             "or <!-- anatomy from NAME -->")
    return MARKER.sub(lambda m: render(page, fragments, m.group(1), m.group(2)), markdown)
