"""Read a scenario (safe YAML with limits, ``--set`` overrides, validation, one-line errors); write it back.

Loading never writes anything (configs are pure). The YAML reader is ``yaml.SafeLoader`` tightened for
config files: YAML 1.2 booleans (``on``/``off``/``yes``/``no`` stay strings) and exponent floats (``1e9``),
duplicate keys rejected, and aliases limited so a "billion laughs" document cannot blow up.
"""

from __future__ import annotations

import copy
import errno
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any, get_origin

import yaml
from pydantic import ValidationError

from sim import __version__
from sim.errors import ScenarioError
from sim.hardware.gpu import GPUSpec
from sim.hardware.links import INTER_PRESETS, INTRA_PRESETS
from sim.scenario.errors_format import (
    allowed_keys,
    dotted,
    is_model,
    one_line,
    step,
    to_scenario_error,
    union_tags,
    unwrap,
)
from sim.scenario.schema import (
    INPUT_DEFAULTED,
    PRESET_SUPPLIED,
    RuleError,
    Scenario,
    checkpointing_from,
    did_you_mean,
    gpu_from,
    layer_presets,
    link_from,
    model_from,
    model_presets,
    show,
    stragglers_from,
)

MAX_FILE_BYTES = 1 << 20  # a scenario is a page of YAML; a resolved one with a layer list, a few hundred KB
MAX_ALIASES = 200  # alias uses per document
MAX_ALIAS_EXPANSION = 100_000  # nodes aliases may add once expanded


class _YamlLimit(Exception):
    """A document the reader refuses (duplicate key, alias bomb): the rule broken and the fix."""

    def __init__(self, rule: str, fix: str = "write the values out instead of using aliases"):
        self.rule, self.fix = rule, fix
        super().__init__(f"{rule}; {fix}")


class StrictLoader(yaml.SafeLoader):
    """SafeLoader for config files: YAML 1.2 scalars, no duplicate keys, bounded alias expansion."""

    def __init__(self, stream: Any):
        super().__init__(stream)
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _YamlLimit(f"more than {MAX_ALIASES} alias uses (*name)")
        return super().compose_node(parent, index)

    def get_single_node(self) -> Any:
        node = super().get_single_node()
        if node is not None and self._aliases:
            plain, expanded = _count_nodes(node)
            if expanded - plain > MAX_ALIAS_EXPANSION:
                raise _YamlLimit(
                    f"aliases expand {plain} written nodes to {expanded} (at most {MAX_ALIAS_EXPANSION} more "
                    "allowed), an alias bomb"
                )
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:
                    continue  # unhashable key: the base constructor reports it
                if duplicate:
                    raise _YamlLimit(
                        f"key {key!r} appears twice (line {key_node.start_mark.line + 1})", "keep one of them"
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _count_nodes(root: Any) -> tuple[int, int]:
    """(distinct nodes, nodes after expanding aliases); a recursive alias is refused."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: Any) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise _YamlLimit(
                "an alias refers to the node that contains it (a recursive document)", "remove it"
            )
        active.add(key)
        if isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        else:
            total = 1
        active.discard(key)
        sizes[key] = total
        return total

    expanded = size(root)
    return len(sizes), expanded


def _yaml12_resolvers() -> None:
    """Booleans are only true/false (so `symmetry: off` stays a string); 1e9 is a float."""
    resolvers = {
        first: [(tag, rx) for tag, rx in rules if tag != "tag:yaml.org,2002:bool"]
        for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    StrictLoader.yaml_implicit_resolvers = resolvers
    StrictLoader.add_implicit_resolver(
        "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
    )
    StrictLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )


_yaml12_resolvers()


def parse_yaml(text: str, what: str, field: str) -> Any:
    """Parse YAML text with StrictLoader; any failure is a one-line ScenarioError on ``field``."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # StrictLoader is a SafeLoader
    except _YamlLimit as exc:
        raise one_line(f"{what} — {exc.rule}; {exc.fix}", field) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = exc.problem or exc.context or "syntax error"
        raise one_line(f"{what} — not valid YAML ({where}{problem}); fix the syntax there", field) from None
    except yaml.YAMLError as exc:
        raise one_line(f"{what} — not valid YAML ({exc}); fix the syntax", field) from None
    except RecursionError:
        raise one_line(f"{what} — nested too deeply; flatten the document", field) from None


def read_capped(path: str | Path, limit: int, what: str, field: str, kind: str = "scenario") -> bytes:
    """The bytes of a regular file, at most ``limit`` of them, or a one-line ScenarioError.

    The file is opened without blocking (a FIFO cannot hang the reader), must be a regular file by
    ``fstat`` of the open file (not /dev/zero, a device or a pipe), and is read with a hard cap, so a
    file that grows or lies about its size cannot exhaust memory."""
    if str(path) == "":  # Path("") is ".", the working directory: say what is really wrong
        raise one_line(f"{what} — the {kind} path is empty; give the {kind}'s file", field)
    p = Path(path).expanduser()
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise one_line(f"{what} — a loop of symbolic links; point the link at a real file", field) from None
        if exc.errno == errno.ENOENT:
            broken = " (a broken symbolic link)" if p.is_symlink() else ""
            raise one_line(
                f"{what} — no such file{broken}; check the path (working directory: {Path.cwd()})", field
            ) from None
        if exc.errno == errno.ENOTDIR:
            raise one_line(f"{what} — a part of the path is a file, not a folder; check the path", field) from None
        if exc.errno == errno.EISDIR:
            raise one_line(f"{what} — is a directory; give the {kind}'s file", field) from None
        raise one_line(f"{what} — cannot be read ({exc.strerror}); check its permissions", field) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise one_line(f"{what} — is a directory; give the {kind}'s file", field)
        if not stat.S_ISREG(mode):
            kind_of = "a pipe (FIFO)" if stat.S_ISFIFO(mode) else "a device" if (
                stat.S_ISCHR(mode) or stat.S_ISBLK(mode)) else "a socket or special file"
            raise one_line(f"{what} — {kind_of}, not a regular file; give the {kind}'s file", field)
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        raise one_line(f"{what} — cannot be read ({exc.strerror}); check its permissions", field) from None
    finally:
        os.close(fd)
    if total > limit:
        raise one_line(
            f"{what} — over the {limit}-byte limit for a {kind}; is this the right file?", field
        )
    return b"".join(chunks)


def read_scenario_file(path: str | Path) -> dict[str, Any]:
    """The mapping in a scenario file, or a one-line ScenarioError naming the file and what to do."""
    what = show(str(path))
    raw = read_capped(path, MAX_FILE_BYTES, what, "scenario")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise one_line(
            f"{what} — not a text file (byte {exc.start} is not UTF-8), not YAML at all; "
            "give a YAML scenario file",
            "scenario",
        ) from None
    data = parse_yaml(text, what, "scenario")
    if data is None:
        raise one_line(
            f"{what} — the file is empty; write a scenario (see `dtsim schema` or scenarios/)", "scenario"
        )
    if not isinstance(data, dict):
        raise one_line(
            f"{what} — the top level is a {type(data).__name__}, not a mapping of sections; "
            "write it as name: …, cluster: …, model: …, parallel: …, training: …",
            "scenario",
        )
    return data


# ------------------------------------------------------------------------------------- overrides


def _expand_gpu(value: Any) -> Any:
    return gpu_from(value).model_dump() if isinstance(value, str) else value


def _default_intra(cluster: dict[str, Any]) -> str:
    """The intra-node link a cluster gets when it names none: its GPU's nvlink, else pcie4."""
    try:
        return GPUSpec.model_validate(gpu_from(cluster.get("gpu"))).nvlink or "pcie4"
    except ValueError:
        return "pcie4"


# Absent preset-valued keys: --set into them starts from the preset they default to.
_ABSENT = {"cluster.intra_node": _default_intra, "cluster.inter_node": lambda cluster: "hdr"}


# Where a string stands for a mapping (a preset, a kind), --set into it first expands the string.
_EXPANDERS = {
    "model": model_from,
    "cluster.gpu": _expand_gpu,
    "cluster.intra_node": lambda v: link_from(v, INTRA_PRESETS, "intra-node link").model_dump(),
    "cluster.inter_node": lambda v: link_from(v, INTER_PRESETS, "inter-node link").model_dump(),
    "cluster.topology": lambda v: {"kind": v},
    "cluster.stragglers": stragglers_from,
    "training.loss_scaling": lambda v: {"kind": v},
    "training.checkpointing": checkpointing_from,
}


def parse_override(text: str) -> tuple[list[Any], Any]:
    """ "a.b.c=VALUE" → (["a", "b", "c"], VALUE parsed as YAML); digit segments become ints."""
    key, sep, raw = text.partition("=")
    segments = key.strip().split(".")
    if not sep or not all(s.strip() for s in segments):
        raise one_line(f"{show(text)} — expected a.b.c=VALUE; write e.g. --set parallel.data=4", "--set")
    path: list[Any] = [int(s) if s.strip().isdigit() else s.strip() for s in segments]
    value = parse_yaml(raw, f"{show(raw)}", f"--set {key.strip()}")
    return path, value


def _bad_path(path: list[Any], depth: int, rule: str, fix: str) -> ScenarioError:
    return one_line(f"{show(path[depth])} — {rule}; {fix}", f"--set {dotted(path)}")


def apply_override(data: dict[str, Any], path: list[Any], value: Any) -> None:
    """Set ``value`` at ``path`` in ``data`` (in place), checking each key against the schema."""
    node: Any = data
    ann: Any = Scenario
    for depth, seg in enumerate(path):
        here = dotted(path[:depth]) or "the top level"
        model = unwrap(ann)
        tags = union_tags(model)
        if tags:
            model = tags.get(str(node.get("kind"))) if isinstance(node, dict) else None
        if is_model(model) and seg not in model.model_fields:
            names = allowed_keys(model)
            raise _bad_path(
                path,
                depth,
                f"unknown key in {here}",
                f"{did_you_mean(str(seg), names)}allowed keys: {', '.join(names)}",
            )
        if model is not None and not is_model(model) and get_container(model) is None:
            raise _bad_path(
                path, depth, f"{here} is a single value, it has no keys", f"use --set {here}=VALUE"
            )
        ann = step(model, seg) if model is not None else None
        if depth == len(path) - 1:
            _store(node, seg, value, path, depth)
            return
        child = _fetch(node, seg, path, depth)
        prefix = dotted(path[: depth + 1])
        if child is None and prefix in _ABSENT:
            child = _ABSENT[prefix](node)
        if prefix in _EXPANDERS and not isinstance(child, dict | list) and child is not None:
            try:
                child = _EXPANDERS[prefix](child)
            except RuleError as exc:
                raise one_line(f"{exc.value} — {exc.rule}; {exc.fix}", prefix) from None
        if child is None:
            child = {}
        if not isinstance(child, dict | list):
            raise _bad_path(
                path, depth, f"{prefix} is the single value {show(child)}", f"use --set {prefix}=VALUE"
            )
        _store(node, seg, child, path, depth)
        node = child


def get_container(ann: Any) -> Any:
    """dict or list for container annotations, else None."""
    origin = get_origin(unwrap(ann))
    return origin if origin in (dict, list) else None


def _fetch(node: Any, seg: Any, path: list[Any], depth: int) -> Any:
    if isinstance(node, list):
        if not isinstance(seg, int) or seg >= len(node):
            raise _bad_path(
                path, depth, f"no item {seg} in a list of {len(node)}", f"use an index below {len(node)}"
            )
        return node[seg]
    return node.get(seg)


def _store(node: Any, seg: Any, value: Any, path: list[Any], depth: int) -> None:
    if isinstance(node, list):
        if not isinstance(seg, int) or seg >= len(node):
            raise _bad_path(
                path, depth, f"no item {seg} in a list of {len(node)}", f"use an index below {len(node)}"
            )
    node[seg] = value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str],
                    flag: str = "--set") -> tuple[dict[str, Any], dict[str, str]]:
    """A deep copy of ``data`` with each ``--set`` applied in order; {dotted path: "FLAG setting"} for
    messages. ``flag``: the option the settings came from (a sweep's points come from ``--grid``)."""
    out = copy.deepcopy(data)
    origins: dict[str, str] = {}
    for text in overrides:
        try:
            path, value = parse_override(text)
            apply_override(out, path, value)
        except ScenarioError as exc:
            if flag == "--set":
                raise
            # The override parser names --set; say where the setting really came from.
            raise ScenarioError(str(exc).replace("--set ", f"{flag} ")) from None
        origins[dotted(path)] = f"{flag} {text.strip()}"
    return out, origins


# ------------------------------------------------------------------------------------ public API


def scenario_from_dict(
    d: dict[str, Any], base_dir: Path | None = None, origins: dict[str, str] | None = None
) -> Scenario:
    """Validate a mapping into a Scenario; relative calibration paths look in ``base_dir``, then the cwd."""
    if not isinstance(d, dict):
        raise one_line(f"{show(d)} — a scenario is a mapping of sections; give a dict", "scenario")
    try:
        return Scenario.model_validate(d, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise to_scenario_error(exc, Scenario, origins) from None


def load_scenario(path: str | Path, overrides: Iterable[str] = ()) -> Scenario:
    """Read, override and validate a scenario file; every failure is a one-line ScenarioError."""
    data = read_scenario_file(path)
    data, origins = apply_overrides(data, overrides)
    return scenario_from_dict(data, base_dir=Path(path).expanduser().resolve().parent, origins=origins)


def dump_resolved(scenario: Scenario) -> str:
    """The resolved scenario as YAML (presets expanded, defaults filled); loads back to an equal Scenario."""
    header = f"# resolved by dtsim {__version__}: presets expanded, defaults filled; loads back unchanged\n"
    return header + yaml.safe_dump(scenario.resolved(), sort_keys=False, allow_unicode=True, width=110)


def json_schema() -> dict[str, Any]:
    """JSON Schema of the input form (preset strings or mappings) for editors; `dtsim schema` prints it."""
    schema = Scenario.model_json_schema(mode="validation")
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
    defs = schema["$defs"]
    for name, fields in INPUT_DEFAULTED.items():
        defs[name]["required"] = [f for f in defs[name]["required"] if f not in fields]
    for name, fields in PRESET_SUPPLIED.items():
        defs[name]["required"] = [f for f in defs[name]["required"] if f not in fields]
        defs[name]["anyOf"] = [{"required": ["preset"]}, {"required": list(fields)}] + (
            [{"required": ["hf_config"]}] if "hf_config" in defs[name]["properties"] else [])
    # preset names: offered for completion; any string is accepted (names are case-insensitive)
    names = sorted(model_presets())
    model = schema["properties"]["model"]
    model["anyOf"] = [
        _names_or_string(names, "transformer preset name") if arm == {"type": "string"} else arm
        for arm in model["anyOf"]
    ]
    for name, presets in (("TransformerModel", names), ("LayersModel", sorted(layer_presets()))):
        defs[name]["properties"]["preset"]["anyOf"] = [
            _names_or_string(presets, "preset name"),
            {"type": "null"},
        ]
    cluster = defs["Cluster"]["properties"]
    for field in ("gpu", "intra_node", "inter_node"):
        cluster[field]["anyOf"] = [
            _names_or_string(arm["enum"], "preset name") if "enum" in arm else arm
            for arm in cluster[field]["anyOf"]
        ]
    return schema


def _names_or_string(names: list[str], what: str) -> dict[str, Any]:
    """Known names for editors to offer, without rejecting other spellings the loader accepts."""
    return (
        {"anyOf": [{"enum": names}, {"type": "string"}], "description": what} if names else {"type": "string"}
    )
