"""How tools/checked_by.py makes a function's output wrong: one rule per kind of value.

A value that holds any floating-point number (an array, a float, inside tuples, lists, dicts, NamedTuples or
dataclasses, or in the attributes of an object of the package, changed in place) has every floating-point
number scaled by 1 + 1e-3 and nothing else changed: the wrong value a check of the arithmetic must see. A value
that holds none has its integers, bools and texts changed instead, one rule per kind (RULES). A generator has
each item it yields changed by the same rules. What no rule fits (None, any other object) is handed on as it
is, and reported as untouched. A function that returns nothing and updates its arguments in place (AdamW's
step) has the arrays it changed changed again, in place (`snapshot` before the call, `changed_in_place` after).

`perturb(value, change=False)` makes the same copies with nothing changed: the negative control, under which
every test must pass. `rules_for(value)` names the rules that would apply, copying nothing.
"""

import copy
import dataclasses
import inspect
from dataclasses import dataclass

import numpy as np

FACTOR = 1 + 1e-3

# The rule names, as reports and pages print them, with what each does.
RULES = {
    "scaled": "every floating-point number multiplied by 1 + 1e-3",
    "int off by one": "an integer, or the first element of an integer array, off by one (its lowest bit flipped: "
                      "0 and 1 swap, 2 and 3, so an id stays an id)",
    "bool flipped": "a bool, or the first element of a bool array, flipped",
    "text changed": "the first character of a string, or the first byte of bytes, changed (its lowest bit flipped)",
    "each item yielded": "a generator: each item it yields changed by these rules",
    "object changed in place": "an object of the package: its attributes changed in place by these rules",
    "changed in place": "returns nothing: each array it changed in its arguments changed again, in place, by these "
                        "rules",
}
PACKAGE = "transformer."


@dataclass
class Perturbed:
    value: object
    rules: set  # the names of the RULES that applied
    untouched: set  # type names of the parts no rule fits (None left out)


def perturb(value, change=True):
    """The value made wrong by the rules (see the module docstring), as a Perturbed."""
    out = Perturbed(None, set(), set())
    out.value = _walk(value, _holds_float(value), change, out)
    return out


def rules_for(value):
    """(rules, untouched) that perturb would report for the value, found without copying it."""
    out = Perturbed(None, set(), set())
    _walk(value, _holds_float(value), None, out)
    return out.rules, out.untouched


def _is_float(x):
    return isinstance(x, (float, np.floating)) or (isinstance(x, np.ndarray) and x.dtype.kind in "fc")


def _is_record(value):
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _is_object(value):
    """An instance of a (non-dataclass) class of the package, such as a tokenizer or an autograd Tensor."""
    return (type(value).__module__.startswith(PACKAGE) and not _is_record(value) and not callable(value)
            and not isinstance(value, (BaseException, type, tuple, list, dict)))


def _attributes(value):
    """{name: value} of an object's own attributes, except functions and those that hold objects of the package
    (one level: an autograd Tensor's data changes, not its parents)."""
    names = list(getattr(value, "__dict__", {})) + [n for cls in type(value).__mro__
                                                     for n in getattr(cls, "__slots__", ()) if hasattr(value, n)]
    found = {n: getattr(value, n) for n in dict.fromkeys(names) if not n.startswith("__")}
    return {n: v for n, v in found.items() if not _holds_object(v) and not callable(v)}


def _holds_object(value):
    """An object of the package, or a container holding one (a Tensor's parents)."""
    if _is_object(value):
        return True
    return isinstance(value, (tuple, list, dict)) and any(_holds_object(v) for v in _parts(value))


def _parts(value):
    """The parts of a container (tuple, list, dict values, dataclass fields), else ()."""
    if isinstance(value, (tuple, list)):
        return value
    if isinstance(value, dict):
        return value.values()
    if _is_record(value):
        return [getattr(value, f.name) for f in dataclasses.fields(value)]
    if _is_object(value):
        return list(_attributes(value).values())
    return ()


def _holds_float(value):
    return _is_float(value) or any(_holds_float(part) for part in _parts(value))


def _walk(value, floats, change, out):
    """The value with the rule for its kind applied (floats: only floating-point numbers change). change=None
    only records the rules and returns nothing."""
    if isinstance(value, (tuple, list, dict)) or _is_record(value):
        done = [_walk(v, floats, change, out) for v in _parts(value)]
        return None if change is None else _rebuilt(value, done)
    if _is_object(value):
        inside = Perturbed(None, set(), set())
        for name, attribute in _attributes(value).items():
            new = _walk(attribute, floats, change, inside)
            if change is not None:
                object.__setattr__(value, name, new)
        out.rules |= inside.rules | ({"object changed in place"} if inside.rules else set())
        out.untouched |= inside.untouched or ({type(value).__name__} if not inside.rules else set())
        return value
    if inspect.isgenerator(value):
        out.rules.add("each item yielded")
        return None if change is None else _each(value, change, out)
    rule = _leaf_rule(value, floats)
    if rule:
        out.rules.add(rule)
        return None if change is None else _changed(value, rule, change)
    if value is not None and not (floats and _leaf_rule(value, False)):  # an int among floats is left on purpose
        out.untouched.add(type(value).__name__)
    return value


def _rebuilt(value, parts):
    """A container of the same type as `value` holding `parts`."""
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple
        return type(value)._make(parts)
    if isinstance(value, (tuple, list)):
        return type(value)(parts)
    if isinstance(value, dict):
        return type(value)(zip(value.keys(), parts))
    new = copy.copy(value)
    for f, part in zip(dataclasses.fields(value), parts):
        object.__setattr__(new, f.name, part)  # a frozen dataclass too
    return new


def _each(generator, change, out):
    """What a generator yields, each item perturbed on its own."""
    for item in generator:
        yield _walk(item, _holds_float(item), change, out)


def _leaf_rule(value, floats):
    """The name of the rule that fits a leaf, or None."""
    if floats:
        return "scaled" if _is_float(value) else None
    kind = value.dtype.kind if isinstance(value, np.ndarray) and value.size else None
    if isinstance(value, (bool, np.bool_)) or kind == "b":
        return "bool flipped"
    if isinstance(value, (int, np.integer)) or kind in ("i", "u"):
        return "int off by one"
    if isinstance(value, (str, bytes)) and value:
        return "text changed"
    return None


def _changed(value, rule, change):
    """A leaf with its rule applied (change=False: a copy with nothing changed)."""
    if isinstance(value, np.ndarray):
        new = value.copy()  # the same shape, dtype and type (a 0-d array stays one)
        if rule == "scaled":
            new *= FACTOR if change else 1
        elif change:
            first = (0,) * value.ndim
            new[first] = not new[first] if rule == "bool flipped" else new[first] ^ 1
        return new
    if rule == "scaled":
        return value * (FACTOR if change else 1)
    if isinstance(value, (bool, np.bool_)):
        return type(value)(bool(value) != change)
    if isinstance(value, (int, np.integer)):
        return type(value)(value ^ int(change))
    if isinstance(value, str):
        return chr(ord(value[0]) ^ int(change)) + value[1:]
    return bytes([value[0] ^ int(change)]) + value[1:]


def _arrays(value, found, depth=4):
    """Every writeable array reachable from value through containers, dataclasses and objects of the package."""
    if isinstance(value, np.ndarray):
        if value.flags.writeable and id(value) not in found:
            found[id(value)] = value
    elif depth and (isinstance(value, (tuple, list, dict)) or _is_record(value) or _is_object(value)):
        for part in _parts(value):
            _arrays(part, found, depth - 1)
    return found


def snapshot(args):
    """(array, copy) of every writeable array the arguments reach, before a call that may change them."""
    return [(a, a.copy()) for a in _arrays(args, {}).values()]


def changed_in_place(snap, change=True):
    """After the call: change again, in place, each array whose values the call changed. Returns the rules
    applied (none when the call changed nothing); change=None only finds them."""
    changed = [a for a, before in snap if a.shape != before.shape or not np.array_equal(a, before, equal_nan=True)]
    floats = any(_is_float(a) for a in changed)
    out = Perturbed(None, set(), set())
    for a in changed:
        rule = _leaf_rule(a, floats)
        if rule:
            if change is not None:
                a[...] = _changed(a, rule, change)
            out.rules |= {"changed in place", rule}
    return out.rules
