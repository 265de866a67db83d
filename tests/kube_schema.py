"""Validate a Kubernetes manifest the way a modern kube-apiserver would on create (test-only).

No API server that knows CEL, strict field validation or Job `suspend` can run on these machines
(shared/FIELD-NOTES.md), so the manifests cellscale renders are checked here instead:

- Custom resources (JobSet, RayJob, RayCluster, Kueue's kinds) against the pinned upstream CRDs in
  config/kubernetes/crds/ (see its PROVENANCE.md), in the apiserver's order: unknown fields
  rejected (strict field validation; x-kubernetes-preserve-unknown-fields honoured), nulls of
  non-nullable fields dropped and defaults applied, then the structural schema (types, formats,
  x-kubernetes-int-or-string, nullable, enum, pattern, min/max, lengths, sizes, required,
  list-type map/set uniqueness, embedded resources), the root ObjectMeta (name, namespace, labels,
  annotations, as for every object) and the CRDs' CEL rules (x-kubernetes-validations) evaluated
  with cel-python (beside other errors, but not at all when a value has the wrong type: the
  apiserver then says some rules were not checked).
- Built-in kinds (Namespace, Role, ResourceQuota, ...) against kubernetes-validate's strict JSON
  schemas of Kubernetes BUILTIN_VERSION (every error, not only the first), plus the few Go-side
  checks a schema cannot express that cellscale's manifests could get wrong (object names,
  labels, quantities, a RoleBinding's roleRef).

Checks that live in Go code rather than in a schema are added for what cellscale renders: the
Jobs and Pods a JobSet or RayJob will create (the apiserver refuses those only later, when the
controller creates them) and Kueue's ClusterQueue webhook (quotas, namespaceSelector).

What this cannot prove (the docs say so too): the other admission webhooks (JobSet's, KubeRay's
and the rest of Kueue's defaulting and validation), controllers, the CEL cost budget, CEL
type-checking at CRD creation (cel-python only parses), and transition rules (those reading
`oldSelf`): the apiserver evaluates them only on update, so on create they are skipped here as
there. `rule_inventory()` lists every rule with its kind so a test can prove each one compiles and
evaluates.
"""

from __future__ import annotations

import copy
import datetime as dt
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import re2  # Go's regexp is RE2: the CRDs' patterns mean what they mean there
import referencing
import yaml
from celpy import celtypes

CRD_DIR = Path(__file__).resolve().parents[1] / "config" / "kubernetes" / "crds"
BUILTIN_VERSION = "1.37"  # the newest schemas kubernetes-validate 1.37 ships

# Kinds cellscale may render that are not namespaced (all others are required to name a namespace)
CLUSTER_SCOPED_BUILTINS = frozenset(
    {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass", "StorageClass", "PersistentVolume", "Node"}
)

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUANTITY = re.compile(
    r"^[+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_OBJECT_META_FIELDS = frozenset(
    {
        "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
        "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
        "ownerReferences", "finalizers", "managedFields",
    }
)  # fmt: skip
# An embedded resource's metadata is not pruned by its schema: `object_meta` refuses what ObjectMeta lacks
_OBJECT_META = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_ANNOTATIONS_MAX_BYTES = 256 * 1024
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


class ManifestInvalid(ValueError):
    """The manifest would be refused; `errors` holds every reason, each starting with its JSON path."""

    def __init__(self, what: str, errors: list[str]):
        self.errors = errors
        super().__init__(f"{what} is invalid:\n" + "\n".join(f"- {e}" for e in errors))


def validate(obj: dict, *, allow_deprecated: bool = False, status: bool = False) -> dict:
    """The object as the apiserver would store it on create (defaults applied), or ManifestInvalid.

    Custom resources get their CRD's defaults; built-in kinds come back unchanged (their defaults
    live in Go code, not in a schema). A version the CRD marks deprecated (Kueue's v1beta1,
    KubeRay's v1alpha1) is refused unless `allow_deprecated`: cellscale always names the storage
    version. On create the apiserver drops the `status` of a kind with a status subresource (after
    refusing its unknown fields); `status=True` keeps and validates it, as a write to the status
    subresource would (what a test stand-in for a controller writes).
    """
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    meta = obj.get("metadata")
    what = f"{kind}/{meta.get('name') if isinstance(meta, dict) else None} ({api_version})"
    if not isinstance(api_version, str) or not isinstance(kind, str):
        raise ManifestInvalid(what, ["apiVersion, kind: Required value: every manifest names both, as strings"])
    group, _, version = api_version.rpartition("/")
    crd = _crds_by_group_kind().get((group, kind))
    if crd is None:
        return _validate_builtin(obj, what)
    return _validate_custom(obj, what, _crd(crd), version, allow_deprecated, status)


# ---------------------------------------------------------------- the pinned CRDs, loaded lazily


@dataclass(frozen=True)
class Crd:
    group: str
    kind: str
    namespaced: bool
    versions: dict[str, dict]  # name -> the CRD's version entry (served, deprecated, schema...)


@functools.cache
def _crds_by_group_kind() -> dict[tuple[str, str], Path]:
    """Which file holds which kind, read from each file's head (parsing all of them takes seconds)."""
    index = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        head = path.read_text()[:4000]
        group = re.search(r"^  group: (\S+)$", head, re.M)
        kind = re.search(r"^    kind: (\S+)$", head, re.M)
        if not (group and kind):
            raise RuntimeError(f"{path}: no spec.group / spec.names.kind in its first lines")
        index[(group[1], kind[1])] = path
    return index


@functools.cache
def _crd(path: Path) -> Crd:
    doc = yaml.load(path.read_text(), Loader=yaml.CSafeLoader)
    spec = doc["spec"]
    return Crd(
        spec["group"], spec["names"]["kind"], spec["scope"] == "Namespaced", {v["name"]: v for v in spec["versions"]}
    )


def crd(group: str, kind: str) -> Crd:
    """The pinned CRD of `kind` in `group` (KeyError when none is pinned)."""
    return _crd(_crds_by_group_kind()[(group, kind)])


def pinned_crds() -> list[Crd]:
    return [_crd(path) for path in _crds_by_group_kind().values()]


# ---------------------------------------------------------------- custom resources


def _validate_custom(obj: dict, what: str, crd: Crd, version: str, allow_deprecated: bool, status: bool) -> dict:
    entry = crd.versions.get(version)
    served = sorted(name for name, v in crd.versions.items() if v.get("served"))
    if entry is None or not entry.get("served"):
        raise ManifestInvalid(
            what, [f"apiVersion: Unsupported value: {obj['apiVersion']!r}: {crd.kind} is served as {served}"]
        )
    if entry.get("deprecated") and not allow_deprecated:
        raise ManifestInvalid(what, [f"apiVersion: {entry.get('deprecationWarning') or 'deprecated version'}"])
    schema = entry["schema"]["openAPIV3Schema"]
    walk = _Walk()
    body = copy.deepcopy(obj)
    metadata = body.pop("metadata", None)
    body = walk.prune_and_default(body, _without_metadata(schema), "")
    if not status and "status" in entry.get("subresources", {}):
        body.pop("status", None)
    walk.object_meta(metadata, namespaced=crd.namespaced, name_rule="subdomain")
    if metadata is not None:
        body["metadata"] = metadata
    walk.check(body, _without_metadata(schema), "")
    walk.cel(body, _without_metadata(schema), "", root=True)
    refused = [error.partition(": ")[0] for error in walk.errors]
    walk.errors += _template_checks(body, refused)
    if crd.kind == "ClusterQueue" and not refused:
        walk.errors += _cluster_queue_webhook_checks(body["spec"])
    if walk.errors:
        raise ManifestInvalid(what, walk.errors)
    return body


def apply_schema(value: Any, schema: dict) -> tuple[Any, list[str]]:
    """One value against one structural schema (no root ObjectMeta): the defaulted value and every error."""
    walk = _Walk()
    value = walk.prune_and_default(copy.deepcopy(value), schema, "")
    walk.check(value, schema, "")
    walk.cel(value, schema, "")
    return value, walk.errors


def _without_metadata(schema: dict) -> dict:
    """The root schema less `metadata`: the apiserver validates a root ObjectMeta as ObjectMeta."""
    return {**schema, "properties": {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}}


def _path(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _is_type(value: Any, schema: dict) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        return _type_of(value) in ("integer", "string")
    wanted = schema.get("type")
    actual = _type_of(value)
    return wanted is None or actual == wanted or (wanted == "number" and actual == "integer")


class _Walk:
    def __init__(self):
        self.errors: list[str] = []
        self.type_errors = 0  # the apiserver evaluates no CEL rule when the object has one

    # -- phase 1: what the apiserver does before validating: prune (strictly: refuse) and default

    def prune_and_default(self, value: Any, schema: dict, path: str) -> Any:
        if isinstance(value, dict) and schema.get("type") == "object" and not schema.get("x-kubernetes-int-or-string"):
            props = schema.get("properties", {})
            extra = schema.get("additionalProperties")
            preserve = schema.get("x-kubernetes-preserve-unknown-fields") or extra is True
            if schema.get("x-kubernetes-embedded-resource"):
                props = {
                    **props,
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "metadata": _OBJECT_META,
                }
            for key in list(value):
                sub = props.get(key, extra if isinstance(extra, dict) else None)
                if sub is None and not preserve:
                    self.errors.append(f"{_path(path, key)}: unknown field (not in the schema)")
                    del value[key]
                elif sub is not None and value[key] is None and not sub.get("nullable"):
                    del value[key]  # the apiserver drops a null it cannot store, then defaults it
            for key, sub in props.items():
                if key not in value and "default" in sub:
                    value[key] = copy.deepcopy(sub["default"])
            for key in value:
                sub = props.get(key, extra if isinstance(extra, dict) else None)
                if sub is not None:
                    value[key] = self.prune_and_default(value[key], sub, _child(path, key, key in props))
        elif isinstance(value, list) and "items" in schema:
            return [self.prune_and_default(item, schema["items"], f"{path}[{i}]") for i, item in enumerate(value)]
        return value

    # -- phase 2: the structural schema

    def check(self, value: Any, schema: dict, path: str) -> None:
        shown = path or "<root>"
        if value is None:
            if not schema.get("nullable"):
                self.type_errors += 1
                self.errors.append(f"{shown}: Invalid value: null: must be of type {schema.get('type')}")
            return
        if not _is_type(value, schema):
            self.type_errors += 1
            kind = "integer or string" if schema.get("x-kubernetes-int-or-string") else schema.get("type")
            self.errors.append(f"{shown}: Invalid value: {_show(value)}: must be of type {kind}")
            return
        self.values(value, schema, shown)
        if "anyOf" in schema and not any(_is_type(value, alt) for alt in schema["anyOf"]):
            self.errors.append(f"{shown}: Invalid value: {_show(value)}: matches none of {schema['anyOf']}")
        if isinstance(value, dict):
            self.object(value, schema, path)
        elif isinstance(value, list):
            self.array(value, schema, path)

    def values(self, value: Any, schema: dict, shown: str) -> None:
        err = self.errors.append
        if "enum" in schema and value not in schema["enum"]:
            err(
                f"{shown}: Unsupported value: {_show(value)}: supported values: {', '.join(map(_show, schema['enum']))}"
            )
        if isinstance(value, str):
            if "pattern" in schema and not re2.search(schema["pattern"], value):
                err(f"{shown}: Invalid value: {_show(value)}: must match the pattern {schema['pattern']}")
            if "maxLength" in schema and len(value) > schema["maxLength"]:
                err(f"{shown}: Too long: may not be more than {schema['maxLength']} characters")
            if "minLength" in schema and len(value) < schema["minLength"]:
                err(f"{shown}: Invalid value: {_show(value)}: must be at least {schema['minLength']} characters long")
            if schema.get("format") == "date-time" and not _is_date_time(value):
                err(f"{shown}: Invalid value: {_show(value)}: must be an RFC 3339 date-time")
        if _type_of(value) in ("integer", "number"):
            if "minimum" in schema:
                exclusive = schema.get("exclusiveMinimum", False)
                if value < schema["minimum"] or (exclusive and value == schema["minimum"]):
                    err(f"{shown}: Invalid value: {value}: must be {'>' if exclusive else '>='} {schema['minimum']}")
            if "maximum" in schema:
                exclusive = schema.get("exclusiveMaximum", False)
                if value > schema["maximum"] or (exclusive and value == schema["maximum"]):
                    err(f"{shown}: Invalid value: {value}: must be {'<' if exclusive else '<='} {schema['maximum']}")
            if "multipleOf" in schema and value % schema["multipleOf"]:
                err(f"{shown}: Invalid value: {value}: must be a multiple of {schema['multipleOf']}")
            bounds = {"int32": _INT32, "int64": _INT64}.get(schema.get("format"))
            if bounds and isinstance(value, int) and not bounds[0] <= value <= bounds[1]:
                err(f"{shown}: Invalid value: {value}: does not fit in {schema['format']}")

    def object(self, value: dict, schema: dict, path: str) -> None:
        shown = path or "<root>"
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key in schema.get("required", []):
            if key not in value:
                self.errors.append(f"{_path(path, key)}: Required value")
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            self.errors.append(f"{shown}: Too many: {len(value)}: must have at most {schema['maxProperties']} items")
        if "minProperties" in schema and len(value) < schema["minProperties"]:
            self.errors.append(f"{shown}: Invalid value: must have at least {schema['minProperties']} properties")
        if schema.get("x-kubernetes-embedded-resource"):
            for key in ("apiVersion", "kind"):
                if not isinstance(value.get(key), str) or not value[key]:
                    self.errors.append(f"{_path(path, key)}: Required value: must not be empty")
            if isinstance(value.get("metadata"), dict):
                self.object_meta(value["metadata"], namespaced=None, name_rule="subdomain", parent=path)
        for key, item in value.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                self.check(item, sub, _child(path, key, key in props))

    def array(self, value: list, schema: dict, path: str) -> None:
        shown = path or "<root>"
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            self.errors.append(f"{shown}: Too many: {len(value)}: must have at most {schema['maxItems']} items")
        if "minItems" in schema and len(value) < schema["minItems"]:
            self.errors.append(f"{shown}: Invalid value: {len(value)}: must have at least {schema['minItems']} items")
        list_type = schema.get("x-kubernetes-list-type")
        seen: dict[str, int] = {}
        for i, item in enumerate(value):
            if list_type == "map" and isinstance(item, dict):
                key = _show({k: item.get(k) for k in schema.get("x-kubernetes-list-map-keys", [])})
            elif list_type == "set":
                key = _show(item)
            else:
                key = None
            if key is not None and key in seen:
                self.errors.append(f"{path}[{i}]: Duplicate value: {key}")
            seen.setdefault(key, i)
            self.check(item, schema.get("items", {}), f"{path}[{i}]")

    # -- phase 3: the CEL rules (x-kubernetes-validations) of every node, unless a type was wrong

    def cel(self, value: Any, schema: dict, path: str, root: bool = False) -> None:
        if self.type_errors:
            if _has_rules(schema):
                self.errors.append(f"<root>: {_RULES_NOT_CHECKED}")
            return
        self._cel(value, schema, path, root)

    def _cel(self, value: Any, schema: dict, path: str, root: bool = False) -> None:
        if value is None:
            return
        self.rules(value, schema, path or "<root>", root)
        if isinstance(value, dict):
            props, extra = schema.get("properties", {}), schema.get("additionalProperties")
            for key, item in value.items():
                sub = props.get(key, extra if isinstance(extra, dict) else None)
                if sub is not None:
                    self._cel(item, sub, _child(path, key, key in props))
        elif isinstance(value, list) and isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                self._cel(item, schema["items"], f"{path}[{i}]")

    def rules(self, value: Any, schema: dict, shown: str, root: bool) -> None:
        rules = [r for r in schema.get("x-kubernetes-validations", []) if not _is_transition(r)]
        if not rules:
            return
        bound = {**value, "metadata": _cel_metadata(value.get("metadata"))} if root else value
        activation = {"self": celpy.json_to_cel(bound)}
        for rule in rules:
            where = _path(shown, rule["fieldPath"].lstrip(".")) if rule.get("fieldPath") else shown
            outcome = evaluate_rule(rule["rule"], activation)
            if isinstance(outcome, Exception):
                self.errors.append(
                    f"{where}: Invalid value: {_cel_kind(value)}: {outcome} evaluating rule: {_words(rule)}"
                )
            elif not outcome:
                self.errors.append(f"{where}: Invalid value: {_cel_kind(value)}: {_words(rule)}")

    # -- the ObjectMeta every object has (the apiserver's own checks, not a schema)

    def object_meta(
        self, meta: Any, namespaced: bool | None, name_rule: str, parent: str = "", fields: bool = True
    ) -> None:
        """`fields`: refuse fields ObjectMeta lacks (False where a strict JSON schema already does)."""
        path = _path(parent, "metadata")
        err = self.errors.append
        if meta is None:
            err(f"{path}: Required value")
            return
        if not isinstance(meta, dict):
            err(f"{path}: Invalid value: {_show(meta)}: must be of type object")
            return
        for key in meta:
            if fields and key not in _OBJECT_META_FIELDS:
                err(f"{path}.{key}: unknown field (not in ObjectMeta)")
        name = meta.get("name")
        if not name and not meta.get("generateName") and not parent:  # an embedded object's may be left out
            err(f"{path}.name: Required value: name or generateName is required")
        problem = _name_problem(name, name_rule) if name else None
        if problem:
            err(f"{path}.name: Invalid value: {_show(name)}: {problem}")
        if namespaced is True and not meta.get("namespace"):
            err(f"{path}.namespace: Required value: cellscale's manifests name their namespace")
        if namespaced is False and meta.get("namespace"):
            err(f"{path}.namespace: Forbidden: not allowed on this type")
        if meta.get("namespace") and not _DNS_LABEL.match(str(meta["namespace"])):
            err(f"{path}.namespace: Invalid value: {_show(meta['namespace'])}: must be a DNS-1123 label")
        for key, val in (meta.get("labels") or {}).items():
            problem = _qualified_name_problem(key)
            if problem:
                err(f"{path}.labels: Invalid value: {_show(key)}: {problem}")
            if not isinstance(val, str) or len(val) > 63 or not _LABEL_VALUE.match(val):
                err(f"{path}.labels: Invalid value: {_show(val)}: a label value must be a string of at most 63 "
                    "characters: alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric")  # fmt: skip
        annotations = meta.get("annotations") or {}
        for key, val in annotations.items():
            problem = _qualified_name_problem(key.lower())
            if problem:
                err(f"{path}.annotations: Invalid value: {_show(key)}: {problem}")
            if not isinstance(val, str):
                err(f"{path}.annotations[{key}]: Invalid value: {_show(val)}: must be of type string")
        if sum(len(k) + len(str(v)) for k, v in annotations.items()) > _ANNOTATIONS_MAX_BYTES:
            err(f"{path}.annotations: Too long: must have at most {_ANNOTATIONS_MAX_BYTES} bytes")


def _child(path: str, key: str, is_property: bool) -> str:
    """A property is `.key`, a map entry `[key]`, as the apiserver writes field paths."""
    return _path(path, key) if is_property else f"{path}[{key}]"


def _is_date_time(value: str) -> bool:
    try:
        dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return False
    return "T" in value.upper()


def _name_problem(name: Any, rule: str) -> str | None:
    if not isinstance(name, str):
        return "must be a string"
    if rule == "label":
        if len(name) > 63 or not _DNS_LABEL.match(name):
            return "must be a DNS-1123 label (at most 63 lowercase letters, digits and '-', alphanumeric at both ends)"
    elif rule == "path-segment":
        if name in (".", "..") or "/" in name or "%" in name:
            return "may not be '.' or '..' and may not contain '/' or '%'"
    elif len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        return "must be a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', alphanumeric at both ends)"
    return None


def _qualified_name_problem(key: str) -> str | None:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return "the prefix before '/' must be a DNS-1123 subdomain"
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        return (
            "must be at most 63 alphanumerics, '-', '_' or '.' (alphanumeric at both ends), with an optional DNS prefix"
        )
    return None


# ---------------------------------------------------------------- CEL (x-kubernetes-validations)


_RULES_NOT_CHECKED = (
    "some validation rules were not checked because the object was invalid; correct the existing errors to "
    "complete validation"
)


def _has_rules(schema: dict) -> bool:
    return bool(schema.get("x-kubernetes-validations")) or any(
        _has_rules(sub)
        for sub in [*schema.get("properties", {}).values(), schema.get("items"), schema.get("additionalProperties")]
        if isinstance(sub, dict)
    )


def _is_transition(rule: dict) -> bool:
    return re.search(r"\boldSelf\b", rule["rule"]) is not None


def _words(rule: dict) -> str:
    return rule.get("message") or f"failed rule: {rule['rule']}"


def _cel_kind(value: Any) -> str:
    """How the apiserver shows the value a rule refused: its type, not the value."""
    return _show(_type_of(value))


def _cel_metadata(meta: Any) -> dict:
    """A root rule sees only name and generateName of metadata, as on the apiserver."""
    return {k: v for k, v in (meta or {}).items() if k in ("name", "generateName")}


@functools.cache
def compile_rule(rule: str) -> celpy.Runner:
    """One program per distinct rule text, compiled once per test session."""
    env = celpy.Environment()
    return env.program(env.compile(rule))


def evaluate_rule(rule: str, activation: dict) -> bool | Exception:
    """The rule's boolean verdict, or the evaluation error (the apiserver refuses the object then too)."""
    try:
        result = compile_rule(rule).evaluate(activation)
    except celpy.CELEvalError as error:
        return RuntimeError(error.args[0] if error.args else str(error))
    if isinstance(result, celpy.CELEvalError):
        return RuntimeError(result.args[0] if result.args else str(result))
    if not isinstance(result, celtypes.BoolType):
        return TypeError(f"the rule gave {type(result).__name__}, not a bool")
    return bool(result)


@dataclass(frozen=True)
class RuleSite:
    kind: str
    version: str
    path: str  # where the rule sits: `.spec.replicatedJobs[]`
    schema: dict  # the schema node the rule is attached to (self is a value of it)
    rule: dict

    @property
    def transition(self) -> bool:
        return _is_transition(self.rule)


def rule_inventory() -> list[RuleSite]:
    """Every x-kubernetes-validations rule of every served version of the pinned CRDs."""
    sites = []
    for crd in pinned_crds():
        for name, entry in crd.versions.items():
            if entry.get("served"):
                _collect_rules(crd.kind, name, entry["schema"]["openAPIV3Schema"], "", sites)
    return sites


def _collect_rules(kind: str, version: str, schema: dict, path: str, out: list[RuleSite]) -> None:
    for rule in schema.get("x-kubernetes-validations", []):
        out.append(RuleSite(kind, version, path or "<root>", schema, rule))
    for key, sub in schema.get("properties", {}).items():
        _collect_rules(kind, version, sub, f"{path}.{key}", out)
    if isinstance(schema.get("items"), dict):
        _collect_rules(kind, version, schema["items"], f"{path}[]", out)
    if isinstance(schema.get("additionalProperties"), dict):
        _collect_rules(kind, version, schema["additionalProperties"], f"{path}[*]", out)


# ---------------------------------------------------------------- built-in kinds


@functools.cache
def _builtin_registry() -> tuple[Path, referencing.Registry]:
    import kubernetes_validate

    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"v{BUILTIN_VERSION}.0-local-strict"
    definitions = json.loads((root / "_definitions.json").read_text())
    return root, referencing.Resource.from_contents(definitions) @ referencing.Registry()


def _validate_builtin(obj: dict, what: str) -> dict:
    """kubernetes-validate's strict schema (every error), and the Go-side checks cellscale needs."""
    root, registry = _builtin_registry()
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", obj["apiVersion"])
    schema_file = root / f"{obj['kind'].lower()}-{group_version}.json"
    if not schema_file.exists():
        raise ManifestInvalid(
            what, [f"apiVersion, kind: no pinned CRD and no Kubernetes {BUILTIN_VERSION} schema for this kind"]
        )
    validator = jsonschema.Draft202012Validator(json.loads(schema_file.read_text()), registry=registry)
    errors = [
        f"{_json_path(error.absolute_path)}: {error.message}"
        for error in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    ]
    walk = _Walk()
    name_rule = _BUILTIN_NAME_RULES.get(obj["kind"], "subdomain")
    namespaced = obj["kind"] not in CLUSTER_SCOPED_BUILTINS
    walk.object_meta(obj.get("metadata"), namespaced=namespaced, name_rule=name_rule, fields=False)
    errors += walk.errors + _go_side_checks(obj)
    if errors:
        raise ManifestInvalid(what, errors)
    return copy.deepcopy(obj)


_BUILTIN_NAME_RULES = {
    "Namespace": "label",
    **dict.fromkeys(("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"), "path-segment"),
}


def _json_path(parts) -> str:
    out = ""
    for part in parts:
        out = f"{out}[{part}]" if isinstance(part, int) else _path(out, str(part))
    return out or "<root>"


def _go_side_checks(obj: dict) -> list[str]:
    """Checks the apiserver makes in Go code that a JSON schema cannot, for kinds cellscale renders."""
    errors = []
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    if obj["kind"] == "ResourceQuota":
        for resource, amount in (spec.get("hard") or {}).items():
            if (parse_quantity(amount) or 0) < 0 or parse_quantity(amount) is None:
                errors.append(f"spec.hard[{resource}]: Invalid value: {_show(amount)}: must be a non-negative quantity")
    if obj["kind"] in ("RoleBinding", "ClusterRoleBinding"):
        ref = obj.get("roleRef") or {}
        if ref.get("apiGroup") != "rbac.authorization.k8s.io":
            errors.append(f"roleRef.apiGroup: Unsupported value: {_show(ref.get('apiGroup'))}: "
                          'supported values: "rbac.authorization.k8s.io"')  # fmt: skip
        allowed = ("Role", "ClusterRole") if obj["kind"] == "RoleBinding" else ("ClusterRole",)
        if ref.get("kind") not in allowed:
            errors.append(f"roleRef.kind: Unsupported value: {_show(ref.get('kind'))}: supported values: {allowed}")
        for i, subject in enumerate(obj.get("subjects") or []):
            kind = subject.get("kind")
            if kind == "ServiceAccount":
                if subject.get("apiGroup"):
                    errors.append(f'subjects[{i}].apiGroup: Unsupported value: {_show(subject["apiGroup"])}: '
                                  'supported values: ""')  # fmt: skip
                if obj["kind"] == "ClusterRoleBinding" and not subject.get("namespace"):
                    errors.append(f"subjects[{i}].namespace: Required value")
            elif kind in ("User", "Group"):
                if subject.get("apiGroup") != "rbac.authorization.k8s.io":
                    errors.append(f"subjects[{i}].apiGroup: Unsupported value: {_show(subject.get('apiGroup'))}: "
                                  'supported values: "rbac.authorization.k8s.io"')  # fmt: skip
            else:
                errors.append(f"subjects[{i}].kind: Unsupported value: {_show(kind)}: "
                              'supported values: "ServiceAccount", "User", "Group"')  # fmt: skip
    return errors


# ---------------------------------------------------------------- the Jobs and Pods a custom resource will create
#
# A CRD embeds Job and Pod templates as plain schema: the apiserver stores a JobSet whose Job it
# will later refuse, and the JobSet then fails with no word to the user. These are the Go-side
# checks of those Jobs and Pods that a manifest cellscale renders could plausibly get wrong.


def _dig(value: Any, *keys: str, kind: type = dict) -> Any:
    """value[k1][k2]... when every step is there with the right type, else an empty `kind`.

    These checks run on bodies the schema may have refused: they must not trip on a wrong type.
    """
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, kind) else kind()


def _template_checks(obj: dict, refused: list[str]) -> list[str]:
    """The checks of every Job and pod template the schema found nothing wrong in."""
    errors: list[str] = []
    templates: list[tuple[dict, str, bool]] = []  # (pod template, its path, whether a Job runs it)
    if obj["kind"] == "JobSet":
        for i, rjob in enumerate(_dig(obj, "spec", "replicatedJobs", kind=list)):
            job_path = f"spec.replicatedJobs[{i}].template"
            errors += _template_meta_checks(_dig(rjob, "template", "metadata"), f"{job_path}.metadata", refused)
            errors += _job_checks(_dig(rjob, "template", "spec"), f"{job_path}.spec", refused)
            templates.append((_dig(rjob, "template", "spec", "template"), f"{job_path}.spec.template", True))
    elif obj["kind"] in ("RayJob", "RayCluster"):
        prefix = ("spec", "rayClusterSpec") if obj["kind"] == "RayJob" else ("spec",)
        shown = ".".join(prefix)
        if _dig(obj, *prefix, "headGroupSpec"):
            templates.append(
                (_dig(obj, *prefix, "headGroupSpec", "template"), f"{shown}.headGroupSpec.template", False)
            )
        for i, group in enumerate(_dig(obj, *prefix, "workerGroupSpecs", kind=list)):
            templates.append((_dig(group, "template"), f"{shown}.workerGroupSpecs[{i}].template", False))
        if obj["kind"] == "RayJob" and _dig(obj, "spec", "submitterPodTemplate"):
            templates.append((_dig(obj, "spec", "submitterPodTemplate"), "spec.submitterPodTemplate", True))
    elif obj["kind"] == "Workload":
        for i, pod_set in enumerate(_dig(obj, "spec", "podSets", kind=list)):
            templates.append((_dig(pod_set, "template"), f"spec.podSets[{i}].template", False))
    for template, path, in_job in templates:
        errors += _template_meta_checks(_dig(template, "metadata"), f"{path}.metadata", refused)
        if not any(error.startswith(f"{path}.spec") for error in refused):
            errors += _pod_checks(_dig(template, "spec"), f"{path}.spec", in_job)
    return errors


def _template_meta_checks(meta: dict, path: str, refused: list[str]) -> list[str]:
    """A template's labels and annotations, as the Job's or Pod's ObjectMeta will be checked."""
    if any(error.startswith(path) for error in refused):
        return []
    walk = _Walk()
    walk.object_meta(meta, namespaced=None, name_rule="subdomain", parent=path.removesuffix(".metadata"), fields=False)
    return walk.errors


def _job_checks(job: dict, path: str, refused: list[str]) -> list[str]:
    errors: list[str] = []
    if any(error.startswith(path) and not error.startswith(f"{path}.template") for error in refused):
        return errors
    for field, least in (("parallelism", 0), ("completions", 0), ("backoffLimit", 0), ("activeDeadlineSeconds", 1)):
        value = job.get(field)
        if isinstance(value, int) and value < least:
            errors.append(f"{path}.{field}: Invalid value: {value}: must be >= {least}")
    if job.get("completionMode") == "Indexed" and job.get("completions") is None:
        errors.append(f"{path}.completions: Required value: when completion mode is Indexed")
    return errors


def _pod_checks(pod: dict, path: str, in_job: bool) -> list[str]:
    errors = []
    restart = pod.get("restartPolicy")
    if in_job and restart not in ("Never", "OnFailure"):
        errors.append(f"{path}.restartPolicy: Unsupported value: {_show(restart)}: supported values: "
                      '"Never", "OnFailure" (the pods of a Job)')  # fmt: skip
    names: set[str] = set()
    for group in ("initContainers", "containers"):
        for i, container in enumerate(_dig(pod, group, kind=list)):
            where = f"{path}.{group}[{i}]"
            name = _dig(container, "name", kind=str)
            if not _DNS_LABEL.match(name) or len(name) > 63:
                errors.append(f"{where}.name: Invalid value: {_show(name)}: must be a DNS-1123 label")
            if name in names:
                errors.append(f"{where}.name: Duplicate value: {_show(name)}")
            names.add(name)
            if group == "containers" and not _dig(container, "image", kind=str):
                errors.append(f"{where}.image: Required value")
            errors += _resource_checks(_dig(container, "resources"), f"{where}.resources")
    return errors


def _resource_checks(resources: dict, path: str) -> list[str]:
    errors = []
    limits, requests = _dig(resources, "limits"), _dig(resources, "requests")
    for which, amounts in (("limits", limits), ("requests", requests)):
        for name, amount in amounts.items():
            value = parse_quantity(amount)
            if value is None or value < 0:
                errors.append(
                    f"{path}.{which}[{name}]: Invalid value: {_show(amount)}: must be a non-negative quantity"
                )
            elif _is_extended(name) and value != int(value):
                errors.append(f"{path}.{which}[{name}]: Invalid value: {_show(amount)}: must be an integer")
    for name, amount in requests.items():
        if name not in limits:
            continue
        request, limit = parse_quantity(amount), parse_quantity(limits[name])
        if request is None or limit is None:
            continue
        if _is_extended(name) and request != limit:
            errors.append(f"{path}.requests[{name}]: Invalid value: {_show(amount)}: must be equal to {name} limit "
                          f"of {_show(limits[name])}")  # fmt: skip
        elif request > limit:
            errors.append(f"{path}.requests[{name}]: Invalid value: {_show(amount)}: must be less than or equal to "
                          f"{name} limit of {_show(limits[name])}")  # fmt: skip
    return errors


def _is_extended(resource: str) -> bool:
    """`nvidia.com/gpu` is an extended resource: whole units, request equal to limit."""
    return "/" in resource and not resource.startswith(("kubernetes.io/", "requests.", "hugepages-"))


_SUFFIX = {
    **{"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60},
    **{"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18},
}


def parse_quantity(amount: Any) -> float | None:
    """A Kubernetes quantity (`8`, `500m`, `256Gi`, `1e3`) as a number, None when it is not one."""
    if isinstance(amount, bool):
        return None
    if isinstance(amount, int | float):
        return float(amount)
    if not isinstance(amount, str) or not _QUANTITY.match(amount):
        return None
    number = re.match(r"^[+-]?(\d+(\.\d*)?|\.\d+)", amount)
    rest = amount[number.end() :]
    if rest not in _SUFFIX:  # a decimal exponent (`1e3`, `2E6`), not the suffix E (exa) alone
        return float(amount)
    return float(number[0]) * _SUFFIX[rest]


# ---------------------------------------------------------------- Kueue's ClusterQueue webhook
#
# Kueue's validating webhook (pkg/webhooks/clusterqueue_webhook.go) cannot run here; these are its
# checks of a ClusterQueue's quotas and namespaceSelector, the part cellscale's tenancy mirror
# renders, run on a ClusterQueue the schema has accepted.


def _cluster_queue_webhook_checks(spec: dict) -> list[str]:
    errors: list[str] = []
    in_cohort = bool(spec.get("cohortName"))
    seen_resources: set[str] = set()
    seen_flavors: set[str] = set()
    for g, group in enumerate(spec.get("resourceGroups", [])):
        path = f"spec.resourceGroups[{g}]"
        for i, name in enumerate(group["coveredResources"]):
            if name in seen_resources:
                errors.append(f"{path}.coveredResources[{i}]: Duplicate value: {_show(name)}")
            seen_resources.add(name)
        for f, flavor in enumerate(group["flavors"]):
            if flavor["name"] in seen_flavors:
                errors.append(f"{path}.flavors[{f}].name: Duplicate value: {_show(flavor['name'])}")
            seen_flavors.add(flavor["name"])
            for r, quota in enumerate(flavor["resources"]):
                errors += _quota_checks(
                    quota, group["coveredResources"], r, in_cohort, f"{path}.flavors[{f}].resources[{r}]"
                )
    for i, requirement in enumerate(_dig(spec, "namespaceSelector", "matchExpressions", kind=list)):
        where = f"spec.namespaceSelector.matchExpressions[{i}]"
        operator, values = requirement.get("operator"), requirement.get("values") or []
        if operator in ("In", "NotIn") and not values:
            errors.append(f"{where}.values: Required value: must be specified when `operator` is 'In' or 'NotIn'")
        elif operator in ("Exists", "DoesNotExist") and values:
            errors.append(
                f"{where}.values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
            )
        elif operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            errors.append(f"{where}.operator: Invalid value: {_show(operator)}: not a valid selector operator")
    return errors


def _quota_checks(quota: dict, covered: list[str], index: int, in_cohort: bool, path: str) -> list[str]:
    errors = []
    if index < len(covered) and quota["name"] != covered[index]:
        errors.append(f"{path}.name: Invalid value: {_show(quota['name'])}: must match the name in coveredResources")
    amounts = {
        field: parse_quantity(quota[field])
        for field in ("nominalQuota", "borrowingLimit", "lendingLimit")
        if field in quota
    }
    for field, amount in amounts.items():
        if amount is not None and amount < 0:
            errors.append(f"{path}.{field}: Invalid value: {_show(quota[field])}: must be greater than or equal to 0")
    if "lendingLimit" in quota and not in_cohort:
        errors.append(
            f"{path}.lendingLimit: Invalid value: {_show(quota['lendingLimit'])}: must be nil when cohort is empty"
        )
    elif "lendingLimit" in quota and (amounts["lendingLimit"] or 0) > (amounts.get("nominalQuota") or 0):
        errors.append(f"{path}.lendingLimit: Invalid value: {_show(quota['lendingLimit'])}: "
                      "must be less than or equal to the nominalQuota")  # fmt: skip
    return errors


# ---------------------------------------------------------------- by hand: python -m tests.kube_schema FILE...


def main(argv: list[str] | None = None) -> int:
    """Validate every document of each YAML file (`-`: stdin), e.g. what `--dry-run` prints; 1 if any is refused."""
    import sys

    refused = 0
    for name in argv if argv is not None else sys.argv[1:]:
        text = sys.stdin.read() if name == "-" else Path(name).read_text()
        for doc in yaml.safe_load_all(text):
            if not doc:
                continue
            try:
                validate(doc)
            except ManifestInvalid as error:
                refused += 1
                print(f"{name}: {error}")
            else:
                print(f"{name}: {doc['kind']}/{doc['metadata']['name']} is valid")
    return 1 if refused else 0


if __name__ == "__main__":
    raise SystemExit(main())
