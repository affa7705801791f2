"""The standard anatomy of a component page, written into its docs page by the hook.

A page reads as a story first and shows its evidence second. A docs page holds its prose (what and why, a
picture, the maths, the derivation with the tiny example's numbers inside it, what it costs) and, at its end,
the line `<!-- anatomy -->`, which the hook replaces with the standard parts that the page's fragments fill:
the tiny example, when the page does not place its numbers itself, open; then the evidence (the symbols and
shapes, the code, the connection table, the gradient check, the cross-check, where it is used, the status) in
one part that opens on a click, so that a reader who wants a claim's evidence finds it and one who reads the
story is not held up by it; then the provenance line.

A page with sections of its own between its example and its evidence splits the marker in two:
`<!-- anatomy to example -->` renders the open parts, `<!-- anatomy from implementation -->` the evidence and
the provenance. A page introduces one of its evidence sections in its own words with
`<!-- lead NAME -->` ... `<!-- end lead -->` anywhere in its prose: the text moves to the top of that section.
"""

import re

CONNECTION_LEAD = ("Each row ties an equation to a line that computes it, or to a test that checks that function; "
                   "the line number and the code are read from the file at build time.\n\n")

OPEN = (("example", "## Tiny numerical example\n\n"),)
EVIDENCE = (
    ("symbols", "## Symbols and tensor shapes\n\n"),
    ("implementation", "## Actual implementation\n\n"),
    ("connection", "## Code and math connection {#code-and-math}\n\n" + CONNECTION_LEAD),
    ("gradcheck", "## Gradient check\n\n"),
    ("devices", "## Cross-check on devices\n\n"),
    ("used", "## Where is it used?\n\n"),
    ("status", "## Status\n\n"),
)
NAMES = [name for name, _ in OPEN + EVIDENCE] + ["provenance"]
EVIDENCE_TITLE = "The evidence: symbols and shapes, the code, its tests and its checks"
MARKER = re.compile(r"^<!-- anatomy(?: (to|from) (\w+))? -->$", re.M)
LEAD = re.compile(r"^<!-- lead (\w+) -->\n(.*?)\n<!-- end lead -->\n?", re.M | re.S)


def indented(text):
    return "".join(f"    {line}" if line.strip() else line for line in text.splitlines(keepends=True))


def evidence(page, fragments, leads):
    """The evidence sections whose fragments exist, in one block that opens on a click (class `evidence`, which
    the print edition leaves out)."""
    parts = [heading + leads.get(name, "") + ("\n\n" if name in leads else "") + f'--8<-- "{page}/{name}.md"\n'
             for name, heading in EVIDENCE if name in fragments]
    if not parts:
        return ""
    return f'??? abstract evidence "{EVIDENCE_TITLE}"\n\n' + indented("\n".join(parts)) + "\n"


def render(page, fragments, leads, part=None, name=None):
    """The parts of `page` whose fragments (a set of names) exist; `part` is "to" or "from" `name`."""
    if part and name not in ("example", "implementation"):
        raise ValueError(f"<!-- anatomy {part} {name} -->: split the anatomy with <!-- anatomy to example --> and "
                         "<!-- anatomy from implementation -->")
    out = []
    if part != "from":
        out += [heading + f'--8<-- "{page}/{section}.md"\n' for section, heading in OPEN if section in fragments]
    if part != "to":
        out.append(evidence(page, fragments, leads))
        if "provenance" in fragments:
            out.append(f'--8<-- "{page}/provenance.md"\n')
    return "\n".join(p for p in out if p)


def expand(markdown, page, fragments):
    """The docs page with each anatomy marker replaced by its parts, and each lead moved into its section; a
    mistyped marker, or a lead of a section the page does not have, is an error, not a comment that silently
    shows nothing."""
    for line in re.findall(r"^<!-- *anatomy.*$", markdown, flags=re.M):
        if not MARKER.fullmatch(line):
            raise ValueError(f"{line!r} is not an anatomy marker: write <!-- anatomy -->, <!-- anatomy to example --> "
                             "or <!-- anatomy from implementation -->")
    leads = {m[1]: m[2].strip() for m in LEAD.finditer(markdown)}
    unknown = sorted(set(leads) - {name for name, _ in EVIDENCE if name in fragments})
    if unknown:
        raise ValueError(f"a lead for {', '.join(unknown)}, which this page's evidence does not have")
    markdown = LEAD.sub("", markdown)
    markdown = MARKER.sub(lambda m: render(page, fragments, leads, m.group(1), m.group(2)), markdown)
    shown = set(re.findall(rf'--8<-- "{re.escape(page)}/(\w+)\.md"', markdown))
    if fragments - shown:
        raise ValueError(f"the generator made {', '.join(sorted(fragments - shown))}, which the page never shows: "
                         f'include each with a line --8<-- "{page}/NAME.md"')
    return markdown
