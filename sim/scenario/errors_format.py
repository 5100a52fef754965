"""Turn a pydantic ValidationError into ONE line: ``<dotted.field>: <value> — <rule>; <fix>``.

Users see this instead of a traceback, so each line names the field as written in the YAML (union tags
and pydantic's internal markers removed), shows the offending value, states the rule and offers a fix
(a did-you-mean for unknown keys and enumerated values). It also walks the schema for ``--set`` paths.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from sim.errors import ScenarioError
from sim.scenario.schema import MODEL_KINDS, NAME_PATTERN, RuleError, did_you_mean, show

_COMPARE = {"greater_than": ">", "greater_than_equal": "≥", "less_than": "<", "less_than_equal": "≤"}
_CTX_KEY = {"greater_than": "gt", "greater_than_equal": "ge", "less_than": "lt", "less_than_equal": "le"}


def unwrap(ann: Any) -> Any:
    """Strip Annotated and Optional so the walk sees the underlying type (or union)."""
    while True:
        origin = get_origin(ann)
        if origin is Annotated:
            ann = get_args(ann)[0]
            continue
        if origin in (Union, types.UnionType):
            arms = [a for a in get_args(ann) if a is not type(None)]
            if len(arms) == 1:
                ann = arms[0]
                continue
        return ann


def is_model(ann: Any) -> bool:
    return isinstance(ann, type) and issubclass(ann, BaseModel)


def union_tags(ann: Any) -> dict[str, type[BaseModel]]:
    """For a union of models discriminated by ``kind``: tag → model class (empty otherwise)."""
    if get_origin(ann) not in (Union, types.UnionType):
        return {}
    tags = {}
    for arm in get_args(ann):
        if is_model(arm) and "kind" in arm.model_fields:
            for tag in get_args(arm.model_fields["kind"].annotation):
                tags[tag] = arm
    return tags


def step(ann: Any, seg: Any) -> Any:
    """The annotation one level below ``ann`` at key/index ``seg``; None when ``seg`` is not allowed."""
    ann = unwrap(ann)
    if is_model(ann):
        field = ann.model_fields.get(seg) if isinstance(seg, str) else None
        return field.annotation if field is not None else None
    origin = get_origin(ann)
    if origin is dict:
        return get_args(ann)[1]
    if origin is list:
        return get_args(ann)[0] if isinstance(seg, int) else None
    return None


def clean_path(root: type[BaseModel], loc: tuple[Any, ...]) -> tuple[list[Any], Any, Any]:
    """(user-facing path, annotation at the end, annotation of the parent) for a pydantic ``loc``."""
    path: list[Any] = []
    ann: Any = root
    parent: Any = None
    for seg in loc:
        if seg == "[key]":
            continue
        tags = union_tags(unwrap(ann))
        if seg in tags:
            ann = tags[seg]  # pydantic's discriminated-union tag: not part of the user's path
            continue
        parent, ann = ann, step(ann, seg)
        path.append(seg)
    return path, ann, parent


def allowed_keys(ann: Any) -> list[str]:
    ann = unwrap(ann)
    return list(ann.model_fields) if is_model(ann) else []


def dotted(path: list[Any]) -> str:
    return ".".join(str(p) for p in path)


def _literal_options(ann: Any) -> list[str]:
    ann = unwrap(ann)
    return [str(a) for a in get_args(ann)] if get_origin(ann) is Literal else []


def _describe(parent: Any, name: Any) -> str:
    parent = unwrap(parent)
    if is_model(parent) and name in parent.model_fields:
        return parent.model_fields[name].description or ""
    return ""


def _rule_fix(err: Mapping[str, Any], path: list[Any], ann: Any, parent: Any) -> tuple[str, str, str]:
    """(value, rule, fix) for one pydantic error."""
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    last = str(path[-1]) if path else "value"
    where = dotted(path[:-1]) or "the top level"
    if "[key]" in err["loc"]:
        return show(value), "keys here are GPU ids (whole numbers)", "write e.g. 3: 1.5"
    if kind == "missing":
        desc = _describe(parent, path[-1] if path else None)
        return "missing", f"required ({desc})" if desc else "required", f"add {last}: … under {where}"
    if kind == "extra_forbidden":
        names = allowed_keys(parent)
        return (
            show(value),
            f"unknown key in {where}",
            f"{did_you_mean(last, names)}allowed keys: {', '.join(names)}",
        )
    if kind == "literal_error":
        options = _literal_options(ann) or [ctx.get("expected", "")]
        return (
            show(value),
            f"must be one of {', '.join(options)}",
            did_you_mean(str(value), options) or "pick one of them",
        )
    if kind in _COMPARE:
        bound = ctx.get(_CTX_KEY[kind])
        return show(value), f"must be {_COMPARE[kind]} {bound}", f"use a value {_COMPARE[kind]} {bound}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        if isinstance(value, str) and value.strip().isdigit():
            return show(value), "must be a whole number", "remove the quotes"
        if last.isdigit():  # a list item (or a GPU id key): the example names the field it belongs to
            named = next((str(p) for p in reversed(path) if not str(p).isdigit()), "value")
            return show(value), "must be a whole number", f"write a whole number, e.g. {named}: [4]"
        return show(value), "must be a whole number", f"write e.g. {last}: 4"
    if kind in ("float_type", "float_parsing", "finite_number"):
        return show(value), "must be a finite number", f"write e.g. {last}: 1.5 or {last}: 1.0e+9"
    if kind in ("bool_type", "bool_parsing"):
        return show(value), "must be true or false", f"write {last}: true or {last}: false"
    if kind == "string_type":
        return show(value), "must be a string", "quote it"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        desc = _describe(parent, path[-1] if path else None)
        if desc.startswith("true | false"):  # a switch for all, or a mapping of switches
            return show(value), "must be true, false or a mapping", f"give {desc}"
        if "preset" in desc or "|" in desc:  # a name or a mapping: say which names
            return show(value), "must be a name or a mapping", f"give {desc}"
        keys = allowed_keys(ann)
        hint = f" ({', '.join(keys)})" if keys else ""
        return show(value), "must be a mapping", f"write {last}: followed by indented key: value lines{hint}"
    if kind == "list_type":
        return show(value), "must be a list", f"write {last}: [a, b]"
    if kind == "too_short":
        return show(value), f"needs at least {ctx.get('min_length', 1)} item(s)", "add an item"
    if kind == "string_pattern_mismatch":
        pattern = str(ctx.get("pattern", ""))
        if pattern.startswith("^https?"):
            return show(value), "must be a web address", "write it starting with https:// (or http://)"
        if pattern == NAME_PATTERN:
            return (
                show(value),
                "may contain only letters, digits, '.', '_' and '-'",
                "it names the results folder, e.g. my-run",
            )
        return show(value), f"must match the pattern {pattern}", "see `dtsim schema` for the field"
    if kind == "string_too_long":
        return show(value), f"longer than {ctx.get('max_length')} characters", "shorten it"
    if kind == "union_tag_invalid":
        return (
            show(ctx.get("tag")),
            "unknown model kind",
            f"{did_you_mean(str(ctx.get('tag')), MODEL_KINDS)}use kind: {' | '.join(MODEL_KINDS)}",
        )
    if kind == "union_tag_not_found":
        return (
            "missing",
            "a model mapping needs a kind",
            f"add kind: {' | '.join(MODEL_KINDS)}, or give a transformer preset name",
        )
    if kind == "dict_type" or kind.endswith("_type"):
        return show(value), err["msg"].lower(), "see `dtsim schema` for the expected type"
    return show(value), err["msg"].replace("Value error, ", ""), "see `dtsim schema` for the allowed values"


def format_error(
    err: Mapping[str, Any], root: type[BaseModel], origins: dict[str, str] | None = None
) -> tuple[str, str]:
    """(field, message) for one pydantic error dict."""
    path, ann, parent = clean_path(root, err["loc"])
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, RuleError):
        value, rule, fix = cause.value, cause.rule, cause.fix
        if cause.field:
            path = path + cause.field.split(".")
    else:
        value, rule, fix = _rule_fix(err, path, ann, parent)
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
            path = path + ["kind"]
    field = dotted(path)
    message = f"{value} — {rule}; {fix}"
    origins = origins or {}
    direct = [
        s for p, s in origins.items() if field == p or field.startswith(p + ".") or p.startswith(field + ".")
    ]
    if direct:  # origins hold "FLAG setting" (sim.scenario.load.apply_overrides)
        message += f" (from {_clip(direct[-1])})"
    elif origins:  # a cross-field rule: show every setting in effect
        message += f" (with {', '.join(_clip(s) for s in origins.values())})"
    return field, message


def to_scenario_error(
    exc: ValidationError, root: type[BaseModel], origins: dict[str, str] | None = None
) -> ScenarioError:
    """The first problem as a one-line ScenarioError (with a count of the others)."""
    errors = exc.errors(include_url=False)
    # a misspelt key also makes the real one "missing": report the misspelling, it carries the did-you-mean
    errors.sort(key=lambda e: e["type"] != "extra_forbidden")
    field, message = format_error(errors[0], root, origins)
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' * (len(errors) > 2)})"
    return one_line(message, field or None)


def one_line(message: str, field: str | None = None) -> ScenarioError:
    """A ScenarioError whose text is guaranteed to fit on one line."""
    return ScenarioError(" ".join(message.split()), " ".join(field.split()) if field else None)


def _clip(setting: str, limit: int = 100) -> str:
    """A --set as typed, shortened: a 50,000-value list must not become a 300 kB error line."""
    return setting if len(setting) <= limit else setting[: limit - 1] + "…"
