"""A validator for the subset of JSON Schema (draft 2020-12) the shipped schemas use: the package has no
``jsonschema`` dependency, and the tests may not add one.

Supported keywords: ``type`` (one name), ``enum``, ``const``, ``properties``, ``required``, ``additionalProperties``
(``false`` or a schema), ``items``, ``minItems``, ``minimum``, ``maximum``, ``pattern``, ``oneOf``, ``anyOf``,
``$ref`` (``#/$defs/...`` only) and the annotations ``$schema``, ``$id``, ``title``, ``description``, ``$defs``. A
schema using any other keyword is refused (:class:`UnsupportedKeywordError`), so a keyword this validator would
silently ignore can never make a document look valid.

:func:`validate` also records, in ``seen``, the schema location of every property it validated inside a matching
branch: :func:`property_locations` lists them all, and a test compares the two (every member the schema describes is
written by some document of the test corpus).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["SchemaError", "UnsupportedKeywordError", "errors", "property_locations", "validate"]

_ANNOTATIONS = {"$schema", "$id", "title", "description", "$defs"}
_KEYWORDS = {
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "minimum",
    "maximum",
    "pattern",
    "oneOf",
    "anyOf",
    "$ref",
}


class SchemaError(AssertionError):
    """A document does not match the schema; the message lists every problem with its JSON path."""


class UnsupportedKeywordError(ValueError):
    """The schema uses a keyword this validator does not implement."""


def _type_ok(value: Any, name: str) -> bool:
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "string":
        return isinstance(value, str)
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "null":
        return value is None
    raise UnsupportedKeywordError(f"type {name!r}")


def _equal(a: Any, b: Any) -> bool:
    """JSON equality: ``True`` is not ``1``."""
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def _resolve(root: dict[str, Any], ref: str) -> tuple[dict[str, Any], str]:
    if not ref.startswith("#/$defs/"):
        raise UnsupportedKeywordError(f"$ref {ref!r} (only #/$defs/... is supported)")
    name = ref.removeprefix("#/$defs/")
    return root["$defs"][name], f"#/$defs/{name}"


def errors(
    instance: Any, schema: dict[str, Any], root: dict[str, Any], path: str, where: str, seen: set[str]
) -> list[str]:
    """Every way ``instance`` (at JSON path ``path``) fails ``schema`` (at schema location ``where``)."""
    unknown = set(schema) - _KEYWORDS - _ANNOTATIONS
    if unknown:
        raise UnsupportedKeywordError(f"{sorted(unknown)} at {where}")
    problems: list[str] = []
    if "$ref" in schema:
        target, location = _resolve(root, schema["$ref"])
        problems += errors(instance, target, root, path, location, seen)
    if "type" in schema and not _type_ok(instance, schema["type"]):
        return [*problems, f"{path}: expected {schema['type']}, got {type(instance).__name__} {instance!r:.80}"]
    if "const" in schema and not _equal(instance, schema["const"]):
        problems.append(f"{path}: expected {schema['const']!r}, got {instance!r:.80}")
    if "enum" in schema and not any(_equal(instance, option) for option in schema["enum"]):
        problems.append(f"{path}: {instance!r:.80} is not one of {schema['enum']}")
    if isinstance(instance, (int, float)) and not isinstance(instance, bool):
        if "minimum" in schema and instance < schema["minimum"]:
            problems.append(f"{path}: {instance} < minimum {schema['minimum']}")
        if "maximum" in schema and instance > schema["maximum"]:
            problems.append(f"{path}: {instance} > maximum {schema['maximum']}")
    if isinstance(instance, str) and "pattern" in schema and not re.search(schema["pattern"], instance):
        problems.append(f"{path}: {instance!r:.80} does not match {schema['pattern']!r}")
    if isinstance(instance, list):
        if "minItems" in schema and len(instance) < schema["minItems"]:
            problems.append(f"{path}: fewer than {schema['minItems']} items")
        if "items" in schema:
            for index, item in enumerate(instance):
                problems += errors(item, schema["items"], root, f"{path}[{index}]", f"{where}/items", seen)
    if isinstance(instance, dict):
        problems += _object_errors(instance, schema, root, path, where, seen)
    for keyword in ("oneOf", "anyOf"):
        if keyword in schema:
            problems += _branch_errors(instance, schema[keyword], keyword, root, path, where, seen)
    return problems


def _object_errors(
    instance: dict[str, Any], schema: dict[str, Any], root: dict[str, Any], path: str, where: str, seen: set[str]
) -> list[str]:
    problems = [f"{path}: missing member {name!r}" for name in schema.get("required", []) if name not in instance]
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for name, value in instance.items():
        if name in properties:
            location = f"{where}/properties/{name}"
            seen.add(location)
            problems += errors(value, properties[name], root, f"{path}.{name}", location, seen)
        elif extra is False:
            problems.append(f"{path}: member {name!r} is not in the schema")
        elif isinstance(extra, dict):
            problems += errors(value, extra, root, f"{path}.{name}", f"{where}/additionalProperties", seen)
    return problems


def _branch_errors(
    instance: Any, branches: list[dict[str, Any]], keyword: str, root: dict[str, Any], path: str, where: str,
    seen: set[str],
) -> list[str]:  # fmt: skip
    matching = []
    reasons = []
    for index, branch in enumerate(branches):
        branch_seen: set[str] = set()
        found = errors(instance, branch, root, path, f"{where}/{keyword}/{index}", branch_seen)
        if found:
            reasons.append(f"branch {index}: {found[0]}")
        else:
            matching.append(branch_seen)
    if not matching:
        return [f"{path}: matches no branch of {keyword} ({'; '.join(reasons)})"]
    if keyword == "oneOf" and len(matching) > 1:
        return [f"{path}: matches {len(matching)} branches of oneOf"]
    for branch_seen in matching:
        seen |= branch_seen
    return []


def validate(instance: Any, schema: dict[str, Any], seen: set[str] | None = None) -> None:
    """Raise :class:`SchemaError` listing every problem of ``instance`` against the root ``schema``."""
    problems = errors(instance, schema, schema, "$", "#", set() if seen is None else seen)
    if problems:
        raise SchemaError("\n".join(problems))


def property_locations(schema: dict[str, Any]) -> set[str]:
    """The schema location of every property of every object schema in ``schema``'s ``$defs`` (and its root)."""
    found: set[str] = set()

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for name in node.get("properties", {}):
                found.add(f"{where}/properties/{name}")
            for key, child in node.items():
                if key == "properties":
                    for name, sub in child.items():
                        walk(sub, f"{where}/properties/{name}")
                elif key in ("items", "additionalProperties"):
                    walk(child, f"{where}/{key}")
                elif key in ("oneOf", "anyOf"):
                    for index, sub in enumerate(child):
                        walk(sub, f"{where}/{key}/{index}")
                elif key == "$defs":
                    for name, sub in child.items():
                        walk(sub, f"#/$defs/{name}")

    walk(schema, "#")
    return found
