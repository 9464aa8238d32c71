"""The one boundary where YAML becomes frozen dataclasses: typed conversion with file:line errors."""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from podrun.errors import SpecError
from podrun.specs.limits import MAX_SPEC_BYTES, MAX_SPEC_INT, MAX_YAML_DEPTH, MAX_YAML_NODES
from podrun.specs.textfile import read_bounded_text


@dataclasses.dataclass(frozen=True)
class Bound:
    """The range of a numeric spec field (each item of a table or list field), and why."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False           # low itself is not allowed (e.g. > 0)
    why: str = ""

    def problem(self, v) -> str | None:
        if self.low is not None and (v < self.low or (self.low_open and v == self.low)):
            return f"must be {'more than' if self.low_open else 'at least'} {_num(self.low)}"
        if self.high is not None and v > self.high:
            return f"must be at most {_num(self.high)}"
        return None


def _num(x: float) -> str:
    """A bound or value as written: integers in full, other numbers short."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


def _shown(value: Any) -> str:
    """repr of a YAML value, cut to one line's worth."""
    try:
        shown = repr(value)
    except ValueError:                   # an int too long to print
        shown = f"<{type(value).__name__}>"
    return shown if len(shown) <= 60 else shown[:57] + "..."


def bound(low: float | None = None, high: float | None = None, *, above: float | None = None,
          why: str = "") -> dict:
    """Field metadata for a numeric range: ``bound(1, 100, why=...)`` or ``bound(above=0, why=...)``."""
    return {"bound": Bound(low if above is None else above, high, above is not None, why)}


# C0 control characters (tab and newline allowed) and DEL: refused in every string of a spec
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a YAML document came from, and the line of every key path in it."""

    path: str
    lines: dict[tuple, int]

    def where(self, keypath: tuple) -> str:
        # the nearest enclosing key that has a line
        return next((f"{self.path}:{self.lines[keypath[:n]]}" for n in range(len(keypath), -1, -1)
                     if keypath[:n] in self.lines), self.path)


def _node_to_data(node: yaml.Node, keypath: tuple, lines: dict, budget: list[int]) -> Any:
    """Plain data from a composed node; aliases are expanded, within MAX_YAML_NODES and MAX_YAML_DEPTH."""
    line = node.start_mark.line + 1
    budget[0] -= 1
    if budget[0] < 0:
        raise SpecError(f"line {line}: more than {MAX_YAML_NODES} values once aliases are expanded",
                        hint="a spec is small; anchors and aliases (&a, *a) that multiply are refused")
    if len(keypath) > MAX_YAML_DEPTH:
        raise SpecError(f"line {line}: nested more than {MAX_YAML_DEPTH} levels deep (or an alias refers to itself)")
    lines.setdefault(keypath, line)
    if isinstance(node, yaml.MappingNode):
        out = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise SpecError(f"line {key_node.start_mark.line + 1}: a key must be a plain name, not a list or mapping")
            key = key_node.value
            if _CONTROL.search(key) or len(key) > 200:
                raise SpecError(f"line {key_node.start_mark.line + 1}: key {key[:40]!r} is not a field name")
            if key in out:
                raise SpecError(f"duplicate key '{key}' at line {key_node.start_mark.line + 1}")
            lines[keypath + (key,)] = key_node.start_mark.line + 1
            out[key] = _node_to_data(value_node, keypath + (key,), lines, budget)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_node_to_data(v, keypath + (i,), lines, budget) for i, v in enumerate(node.value)]
    return _scalar(node)


_CONSTRUCTOR = yaml.constructor.SafeConstructor()


def _scalar(node: yaml.ScalarNode) -> Any:
    try:
        value = _CONSTRUCTOR.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0][:120]
        raise SpecError(f"line {node.start_mark.line + 1}: cannot read {node.value[:40]!r}: {problem}") from None
    if isinstance(value, int) and value.bit_length() > 256:
        raise SpecError(f"line {node.start_mark.line + 1}: cannot read {node.value[:40]!r}...: "
                        f"an integer of {value.bit_length()} bits is no spec value")
    return value


def _check_structure(text: str, path: Path) -> None:
    """Depth and size of the document from the parser's events, before any node is built."""
    depth = events = 0
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for ev in yaml.parse(text, Loader=loader):
        events += 1
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise SpecError(f"{path}:{ev.start_mark.line + 1}: nested more than {MAX_YAML_DEPTH} levels deep",
                                hint="a spec nests a few levels; this is not one")
        elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        if events > MAX_YAML_NODES:
            raise SpecError(f"{path}: more than {MAX_YAML_NODES} YAML values", hint="a spec is small; this is not one")


def read_yaml(path: Path, kind: str) -> tuple[dict, Source]:
    """Parse a YAML file (``kind``: a cluster spec, a recipe, a calibration) into plain data plus a line table;
    syntax errors name file:line."""
    text = read_bounded_text(path, what=f"{kind} {path}", limit=MAX_SPEC_BYTES, error=SpecError,
                             too_big="a spec is a few KiB of YAML", not_utf8_hint="save the file as UTF-8")
    try:
        _check_structure(text, path)
        node = yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = f":{mark.line + 1}" if mark else ""
        raise SpecError(f"{path}{line}: malformed YAML: {exc.problem}", hint="check indentation and quoting") from None
    except yaml.YAMLError as exc:     # reader errors: control characters, bad encodings
        where = getattr(exc, "position", None)
        line = f":{text.count(chr(10), 0, where) + 1}" if isinstance(where, int) else ""
        reason = getattr(exc, "reason", None) or str(exc).splitlines()[0]
        raise SpecError(f"{path}{line}: not YAML text: {reason}", hint="remove control characters from the file") from None
    except RecursionError:
        raise SpecError(f"{path}: nested too deeply", hint="a spec nests a few levels; this is not one") from None
    lines: dict[tuple, int] = {}
    try:
        data = {} if node is None else _node_to_data(node, (), lines, [MAX_YAML_NODES])
    except SpecError as exc:
        raise SpecError(f"{path}: {exc.message}", hint=exc.hint) from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}:1: expected a mapping at the top level, found {type(data).__name__}")
    return data, Source(str(path), lines)


def _type_name(tp) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if dataclasses.is_dataclass(tp) or origin is dict:
        return "a mapping"
    if origin in (tuple, list):
        return "a list"
    return getattr(tp, "__name__", str(tp))


def _shape_fits(tp, value: Any) -> bool:
    """Whether ``value`` has the shape of type ``tp``: a mapping, a list, or a scalar."""
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp) or origin is dict:
        return isinstance(value, dict)
    if origin in (tuple, list):
        return isinstance(value, list)
    return not isinstance(value, (dict, list))


def convert(tp, value: Any, keypath: tuple, src: Source) -> Any:
    """Convert plain YAML data to type ``tp`` (dataclass, Literal, tuple, dict, scalar) or raise SpecError."""

    def fail(expected: str) -> typing.NoReturn:
        field = ".".join(str(k) for k in keypath) or "(top level)"
        raise SpecError(f"{src.where(keypath)}: field '{field}' must be {expected}, got {_shown(value)}")

    origin = get_origin(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            fail("a mapping")
        return build_dataclass(tp, value, keypath, src)
    if origin is Literal:
        if value not in get_args(tp):
            fail(_type_name(tp))
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        arms = [a for a in args if a is not type(None)]
        shaped = [a for a in arms if _shape_fits(a, value)]
        if len(shaped) == 1:             # one arm has the value's shape: its own error names the field inside
            return convert(shaped[0], value, keypath, src)
        for arg in arms:                 # else the first arm that takes it
            with contextlib.suppress(SpecError):
                return convert(arg, value, keypath, src)
        fail(_type_name(tp))
    if origin is tuple:
        args = get_args(tp)
        if not isinstance(value, list):
            fail("a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(convert(args[0], v, keypath + (i,), src) for i, v in enumerate(value))
        if len(args) != len(value):
            fail(f"a list of {len(args)} items")
        return tuple(convert(a, v, keypath + (i,), src) for i, (a, v) in enumerate(zip(args, value)))
    if origin is dict:
        kt, vt = get_args(tp)
        if not isinstance(value, dict):
            fail("a mapping")
        return {convert(kt, k, keypath, src): convert(vt, v, keypath + (k,), src) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            fail("true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            fail("an integer")
        if abs(value) > MAX_SPEC_INT:
            fail("an integer of at most 2**53 (a spec's numbers are counts and sizes)")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            fail("a number")
        if isinstance(value, int) and abs(value) > MAX_SPEC_INT:
            fail("a number of at most 2**53")
        if not math.isfinite(value):
            fail("a finite number (not .nan or .inf)")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            fail("a string")
        m = _CONTROL.search(value)
        if m:
            fail(f"text without control characters (found {m.group()!r})")
        return value
    raise TypeError(f"unsupported spec type {tp!r}")  # a bug in podrun, not user input


def build_dataclass(cls, data: dict, keypath: tuple, src: Source):
    """Build a frozen dataclass from a mapping: unknown keys name the nearest valid one."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            here = src.where(keypath + (key,))
            where = ".".join(str(k) for k in keypath + (key,))
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.5)
            hint = f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(sorted(fields))}"
            raise SpecError(f"{here}: unknown key '{where}'", hint=hint)
        kwargs[key] = convert(hints[key], value, keypath + (key,), src)
        b = fields[key].metadata.get("bound")
        if b is not None:
            _check_bound(b, kwargs[key], keypath + (key,), src)
    for name, f in fields.items():
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            where = ".".join(str(k) for k in keypath + (name,))
            raise SpecError(f"{src.where(keypath)}: missing required field '{where}'")
    return cls(**kwargs)


def _check_bound(b: Bound, value: Any, keypath: tuple, src: Source) -> None:
    """A field's Bound, applied to the number, each value of a table, or each item of a list."""
    if isinstance(value, (dict, tuple)):
        for k, v in value.items() if isinstance(value, dict) else enumerate(value):
            _check_bound(b, v, keypath + (k,), src)
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return                           # 'auto' and other non-numbers are checked by their type
    problem = b.problem(value)
    if problem:
        field = ".".join(str(k) for k in keypath)
        raise SpecError(f"{src.where(keypath)}: field '{field}' {problem}, got {_num(value)}"
                        + (f" ({b.why})" if b.why else ""))
