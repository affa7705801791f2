"""The words of a page live in docs/, its numbers come from its generator: this binds the two.

A page's generator returns values (numbers, lists, shapes, verdicts); the build stores them beside the page's
fragments (values.json). In the prose, `{{ name }}` shows a value and `{{ name:format }}` shows it formatted,
the format being a Python format spec (`.4f`, `.1e`, `,`) or one of FORMATS; a list is shown item by item,
each formatted so, joined by commas. The build stops on a name the generator did not return, a number shown
without a format, a `{{` that is not a placeholder, and a value the prose never shows (a measured number the
page forgot).

And it stops on a measured number typed into prose by hand, which would go stale: a decimal ("1.84"), a
multiple ("3.8x") or a percentage ("12%") outside code, display math and links. Whole numbers are allowed
("two heads", "2 heads", "Section 3"): they are counts and names far more often than measurements.
"""

import json
import re

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][\w.]*)\s*(?::\s*([^{}]*?))?\s*\}\}")
MEASURED = re.compile(r"(?<![\w.])(?:\d+(?:\.\d+)?[x×](?!\w)|\d+(?:\.\d+)?\s?%"
                      r"|\d+\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)")
# What the number check does not read: code, display math, comments, link targets, attribute lists, includes,
# placeholders (their values are the build's own).
MASKS = (r"\A---\n.*?\n---\n", r"^```.*?^```", r"^~~~.*?^~~~", r"`[^`\n]+`", r"\$\$.*?\$\$", r"\\\[.*?\\\]",
         r"<!--.*?-->", r"\]\([^)]*\)", r"<https?://[^>\s]+>", r"arXiv:\S+", r"\{[:#.][^}\n]*\}", r"^-+8<-+.*$",
         PLACEHOLDER.pattern)


def num(value, decimals=4):
    """A number for arithmetic written out: fixed decimals, a negative one in parentheses with a true minus sign,
    one that rounds to zero without a sign."""
    text = f"{value:.{decimals}f}"
    if float(text) == 0:
        return text.lstrip("-")
    return f"(−{text[1:]})" if text.startswith("-") else text


FORMATS = {
    "num": num,
    "gap": lambda v: "0" if v == 0 else f"{v:.0e}",  # a largest gap: an exact zero says so
    "shape": lambda v: f"`{tuple(int(n) for n in v)}`",
    "code": lambda v: f"`{v}`",
    "tex": lambda v: "{:.1f} \\times 10^{{{}}}".format(*(lambda m, e: (float(m), int(e)))(*f"{v:.1e}".split("e"))),
}


def show(value, fmt, name):
    """One value as the prose shows it."""
    if isinstance(value, list) and fmt != "shape":
        return ", ".join(show(v, fmt, name) for v in value)
    if fmt in FORMATS:
        return FORMATS[fmt](value)
    if fmt:
        return format(value, fmt)
    if isinstance(value, float):
        raise ValueError(f"{{{{ {name} }}}} is a number: give it a format, as in {{{{ {name}:.4f }}}}")
    return str(value)


def lookup(values, name):
    value = values
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ValueError(f"{{{{ {name} }}}}: the generator returned no value {name!r}")
        value = value[part]
    return value


def bind(markdown, values, page):
    """The markdown with every placeholder replaced by its value; every value must be shown somewhere."""
    used = set()

    def replace(match):
        name, fmt = match[1], (match[2] or "").strip()
        used.add(name.split(".")[0])
        return show(lookup(values, name), fmt, name)

    out = PLACEHOLDER.sub(replace, markdown)
    if "{{" in out:
        line = next(line for line in out.splitlines() if "{{" in line)
        raise ValueError(f"{page}: a '{{{{' that is not a placeholder: {line.strip()!r}")
    unused = sorted(set(values) - used)
    if unused:
        raise ValueError(f"{page}: the generator returned {', '.join(unused)}, which the prose never shows")
    return out


def typed_numbers(markdown):
    """(line, text) of each measured number typed into the prose by hand (see the module docstring)."""
    masked = markdown
    for pattern in MASKS:
        masked = re.sub(pattern, lambda m: re.sub(r"[^\n]", " ", m[0]), masked, flags=re.S | re.M)
    return [(masked.count("\n", 0, m.start()) + 1, m[0]) for m in MEASURED.finditer(masked)]


def plain(value):
    """A value as JSON keeps it: numpy numbers and arrays as Python's, tuples as lists."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "tolist"):  # a numpy array or scalar
        return plain(value.tolist())
    return value


def dumps(values):
    return json.dumps(plain(values), sort_keys=True, indent=1) + "\n"


def load(path):
    """The values a page's generator returned (values.json), or {} for a page without."""
    return json.loads(path.read_text()) if path.exists() else {}
