"""The one boundary where YAML becomes frozen dataclasses: typed conversion with file:line errors."""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from podrun.errors import SpecError


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a YAML document came from, and the line of every key path in it."""

    path: str
    lines: dict[tuple, int]

    def where(self, keypath: tuple) -> str:
        # the nearest enclosing key that has a line
        for n in range(len(keypath), -1, -1):
            if keypath[:n] in self.lines:
                return f"{self.path}:{self.lines[keypath[:n]]}"
        return self.path


def _node_to_data(node: yaml.Node, keypath: tuple, lines: dict) -> Any:
    lines[keypath] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out = {}
        for key_node, value_node in node.value:
            key = key_node.value
            if key in out:
                raise SpecError(f"duplicate key '{key}' at line {key_node.start_mark.line + 1}")
            lines[keypath + (key,)] = key_node.start_mark.line + 1
            out[key] = _node_to_data(value_node, keypath + (key,), lines)
            lines[keypath + (key,)] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_node_to_data(v, keypath + (i,), lines) for i, v in enumerate(node.value)]
    return _scalar(node)


_CONSTRUCTOR = yaml.constructor.SafeConstructor()


def _scalar(node: yaml.ScalarNode) -> Any:
    return _CONSTRUCTOR.construct_object(node, deep=True)


def read_yaml(path: Path) -> tuple[dict, Source]:
    """Parse a YAML file into plain data plus a line table; syntax errors name file:line."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from None
    try:
        node = yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = f":{mark.line + 1}" if mark else ""
        raise SpecError(f"{path}{line}: malformed YAML: {exc.problem}", hint="check indentation and quoting") from None
    lines: dict[tuple, int] = {}
    try:
        data = {} if node is None else _node_to_data(node, (), lines)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc.message}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}:1: expected a mapping at the top level, found {type(data).__name__}")
    return data, Source(str(path), lines)


def _type_name(tp) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    if origin in (tuple, list):
        return "a list"
    if origin is dict:
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def convert(tp, value: Any, keypath: tuple, src: Source) -> Any:
    """Convert plain YAML data to type ``tp`` (dataclass, Literal, tuple, dict, scalar) or raise SpecError."""

    def fail(expected: str) -> typing.NoReturn:
        field = ".".join(str(k) for k in keypath) or "(top level)"
        raise SpecError(
            f"{src.where(keypath)}: field '{field}' must be {expected}, got {value!r}",
        )

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
        for arg in args:
            if arg is type(None):
                continue
            try:
                return convert(arg, value, keypath, src)
            except SpecError:
                continue
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
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            fail("a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            fail("a string")
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
    for name, f in fields.items():
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            where = ".".join(str(k) for k in keypath + (name,))
            raise SpecError(f"{src.where(keypath)}: missing required field '{where}'")
    return cls(**kwargs)
