"""Turn a pydantic ValidationError into ONE line: ``<dotted.field>: <value> — <rule>; <fix>``.

Users see this instead of a traceback, so each line names the field as written in the YAML (union tags
and pydantic's internal markers removed), shows the offending value, states the rule and offers a fix
(a did-you-mean for unknown keys and enumerated values). It also walks the schema for ``--set`` paths.
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

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


def plain_union_arms(ann: Any) -> list[Any]:
    """The arms of a union that is not discriminated by ``kind`` (e.g. ``'auto' | int``), None left out;
    empty for anything else. Pydantic names the arm it tried in each error's ``loc``."""
    ann = unwrap(ann)
    if get_origin(ann) not in (Union, types.UnionType) or union_tags(ann):
        return []
    arms = [a for a in get_args(ann) if a is not type(None)]
    return arms if len(arms) > 1 else []


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
        arms = plain_union_arms(ann)
        if arms and isinstance(seg, str):
            # pydantic's name for the union arm it tried ("literal['auto']", "constrained-int", a class
            # name): not part of the user's path. Into a model arm the walk goes on; otherwise the error
            # is about the union's value as a whole (see _union_rule_fix).
            ann = next((a for a in arms if is_model(a) and a.__name__ == seg), ann)
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


def _bounds(constraints: Any) -> dict[str, Any]:
    """{"ge"|"gt"|"le"|"lt": bound} from a field's constraints (annotated_types objects, or a FieldInfo
    holding them, as ``Annotated[int, Field(ge=1)]`` gives)."""
    out: dict[str, Any] = {}
    for c in constraints:
        if isinstance(c, FieldInfo):
            out.update(_bounds(c.metadata))
            continue
        for key in ("ge", "gt", "le", "lt"):
            if getattr(c, key, None) is not None:
                out[key] = getattr(c, key)
    return out


def _field_bounds(parent: Any, name: Any) -> dict[str, Any]:
    parent = unwrap(parent)
    if is_model(parent) and name in parent.model_fields:
        return _bounds(parent.model_fields[name].metadata)
    return {}


def _number(bound: Any) -> str:
    """A bound as a message writes it: whole numbers in full, decimals short (1e+09, not 1000000000.0)."""
    if not isinstance(bound, float):
        return str(bound)
    short = f"{bound:g}"
    return short if float(short) == bound else repr(bound)


def _bound_text(bounds: Mapping[str, Any], value: Any) -> str:
    """" ≥ 1", " ≥ 1 and ≤ 64" …: the bounds as a message writes them; an upper bound only where
    ``value`` passes it (a huge ceiling is no help to someone who wrote 0)."""
    ops = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    over = isinstance(value, int | float) and not isinstance(value, bool) and (
        value > bounds.get("le", math.inf) or value >= bounds.get("lt", math.inf))
    shown = [k for k in ops if k in bounds and (k in ("ge", "gt") or over)]
    return " and".join(f" {ops[k]} {_number(bounds[k])}" for k in shown)


def _int_example(bounds: Mapping[str, Any]) -> int:
    """A whole number inside ``bounds`` for a message's example (100 where it fits)."""
    lo = bounds.get("ge", bounds["gt"] + 1 if "gt" in bounds else 100)
    hi = bounds.get("le", bounds["lt"] - 1 if "lt" in bounds else max(lo, 100))
    return min(max(lo, 100), hi)


def _arm_phrase(arm: Any, value: Any) -> tuple[str, str]:
    """(what one arm of a plain union accepts, an example value in YAML) for a one-line message about
    ``value``."""
    base, meta = (get_args(arm)[0], get_args(arm)[1:]) if get_origin(arm) is Annotated else (arm, ())
    bounds = _bounds(meta)
    described = next((str(m.description) for m in meta if isinstance(m, FieldInfo) and m.description), "")
    if get_origin(base) is Literal:
        options = get_args(base)
        return " or ".join(repr(o) for o in options), str(options[0])
    if base is bool:
        return "true or false", "true"
    if base is int:
        return f"{described or 'a whole number'}{_bound_text(bounds, value)}", str(_int_example(bounds))
    if base is float:
        return f"{described or 'a number'}{_bound_text(bounds, value)}", "1.5"
    if base is str:
        return described or "a string", "x"
    if is_model(base):
        return described or "a mapping", "{…}"
    return described or getattr(base, "__name__", str(base)), "…"


def _int_arm_takes(arm: Any, value: Any) -> bool:
    """Whether ``value`` is a whole number written as a decimal that a whole-number arm would take as such."""
    base, meta = (get_args(arm)[0], get_args(arm)[1:]) if get_origin(arm) is Annotated else (arm, ())
    if base is not int or not (isinstance(value, float) and math.isfinite(value) and value.is_integer()):
        return False
    bounds = _bounds(meta)
    return (value >= bounds.get("ge", -math.inf) and value > bounds.get("gt", -math.inf)
            and value <= bounds.get("le", math.inf) and value < bounds.get("lt", math.inf))


def _union_rule_fix(value: Any, ann: Any, last: str) -> tuple[str, str, str]:
    """(value, rule, fix) for a value no arm of a plain union took: every arm's rule in one line, not
    the first arm's alone (``0`` is not 'auto', and not a whole number ≥ 1 either)."""
    arms = plain_union_arms(ann)
    phrases = [_arm_phrase(arm, value) for arm in arms]
    rule = "must be " + " or ".join(p for p, _ in phrases)
    if any(_int_arm_takes(arm, value) for arm in arms):  # 1e3 or 4.0: YAML read a whole number as a decimal
        return show(value), rule + ", written without a decimal point or exponent", f"write {last}: {int(value)}"
    names = [str(o) for arm in arms for o in _literal_options(arm)]
    hint = did_you_mean(value, names) if isinstance(value, str) else ""
    fix = hint + "write e.g. " + " or ".join(f"{last}: {example}" for _, example in phrases)
    return show(value), rule, fix


def _int_rule_fix(value: Any, last: str, bounds: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(value, rule, fix) for a whole number YAML read as a decimal (``1e3``, ``4.0``), or None: out of
    the field's bounds it is too large (small), not merely mistyped."""
    if not (isinstance(value, float) and math.isfinite(value) and value.is_integer()):
        return None
    high = bounds.get("le", bounds["lt"] - 1 if "lt" in bounds else None)
    low = bounds.get("ge", bounds["gt"] + 1 if "gt" in bounds else None)
    if high is not None and value > high:
        return show(value), f"too large: must be a whole number ≤ {_number(high)}", f"use {last} ≤ {_number(high)}"
    if low is not None and value < low:
        return show(value), f"too small: must be a whole number ≥ {_number(low)}", f"use {last} ≥ {_number(low)}"
    return (show(value), "must be a whole number, written without a decimal point or exponent",
            f"write {last}: {int(value)}")


def _rule_fix(err: Mapping[str, Any], path: list[Any], ann: Any, parent: Any) -> tuple[str, str, str]:
    """(value, rule, fix) for one pydantic error."""
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    last = str(path[-1]) if path else "value"
    where = dotted(path[:-1]) or "the top level"
    if "[key]" in err["loc"]:
        return show(value), "keys here are GPU ids (whole numbers)", "write e.g. 3: 1.5"
    if plain_union_arms(ann) and kind != "missing":
        return _union_rule_fix(value, ann, last)
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
        bound = _number(ctx.get(_CTX_KEY[kind]))
        return show(value), f"must be {_COMPARE[kind]} {bound}", f"use a value {_COMPARE[kind]} {bound}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        decimal = None if not path or last.isdigit() else _int_rule_fix(value, last, _field_bounds(parent, path[-1]))
        if decimal is not None:
            return decimal
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
    # One value that no arm of a union took is one problem, however many arms pydantic tried.
    problems = len({_problem_key(i, e, root) for i, e in enumerate(errors)})
    if problems > 1:
        message += f" (and {problems - 1} more problem{'s' * (problems > 2)})"
    return one_line(message, field or None)


def _problem_key(index: int, err: Mapping[str, Any], root: type[BaseModel]) -> Any:
    """The field for errors of a union's arms (one message covers them all), else the error itself."""
    path, ann, _ = clean_path(root, err["loc"])
    return tuple(path) if plain_union_arms(ann) and err["type"] != "missing" else index


def one_line(message: str, field: str | None = None) -> ScenarioError:
    """A ScenarioError whose text is guaranteed to fit on one line."""
    return ScenarioError(" ".join(message.split()), " ".join(field.split()) if field else None)


def _clip(setting: str, limit: int = 100) -> str:
    """A --set as typed, shortened: a 50,000-value list must not become a 300 kB error line."""
    return setting if len(setting) <= limit else setting[: limit - 1] + "…"
