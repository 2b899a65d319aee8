"""Shards: which DisaggDeployments one operator process owns (`disagg run --shard-selector`).

Several operators can share a cluster, each owning a disjoint set of DisaggDeployments: a
Kubernetes label selector on the DisaggDeployments, and/or the namespaces each one watches
(`--namespace`). Each shard holds its own Lease (`lease_name`), so every shard has one
active replica. The selector is the API server's syntax; it is parsed here so that a typo is
refused at start-up (not by the first LIST), and so that watch events, which Kopf receives for
every DisaggDeployment, are matched in memory exactly as the server would match a LIST.

Supported: `key=value`, `key==value`, `key!=value`, `key in (a,b)`, `key notin (a,b)`,
`key` (present) and `!key` (absent), joined by commas (all must hold).

Pure: no Kubernetes client, no Kopf.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

# A label key: an optional DNS-subdomain prefix and a name of up to 63 characters.
_NAME = r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"^([a-z0-9]([a-z0-9.-]{{0,251}}[a-z0-9])?/)?{_NAME}$")
_VALUE = re.compile(rf"^({_NAME})?$")
# The longest shard part of a Lease name (Lease names are DNS subdomains: at most 253).
SHARD_NAME_MAX = 40


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        # "!=" and "notin" hold for objects without the label, as on the API server.
        return not present or value not in self.values

    def __str__(self) -> str:
        if self.op == "exists":
            return self.key
        if self.op == "!":
            return f"!{self.key}"
        if self.op in ("=", "!="):
            return f"{self.key}{self.op}{self.values[0]}"
        return f"{self.key} {self.op} ({','.join(self.values)})"


@dataclass(frozen=True)
class Selector:
    """A parsed label selector; the empty selector matches everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        return all(r.matches(labels or {}) for r in self.requirements)

    def __str__(self) -> str:
        """The selector in the API server's syntax (for `labelSelector=` on a LIST)."""
        return ",".join(str(r) for r in self.requirements)

    def __bool__(self) -> bool:
        return bool(self.requirements)


def _split(text: str) -> list[str]:
    """Split at the commas that are not inside `( )`."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced ')'")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise ValueError("unbalanced '('")
    parts.append("".join(cur))
    return parts


def _key(key: str, whole: str) -> str:
    if not _KEY.match(key):
        raise ValueError(f"{key!r} in {whole!r} is not a valid label key")
    return key


def _value(value: str, whole: str) -> str:
    if not _VALUE.match(value):
        raise ValueError(f"{value!r} in {whole!r} is not a valid label value")
    return value


_SET = re.compile(r"^(?P<key>\S+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")


def parse_selector(text: str | None) -> Selector:
    """Parse a label selector; raises ValueError naming the offending part."""
    if text is None or not text.strip():
        return Selector()
    reqs: list[Requirement] = []
    for raw in _split(text):
        part = raw.strip()
        if not part:
            raise ValueError(f"empty requirement in label selector {text!r}")
        m = _SET.match(part)
        if m:
            values = tuple(_value(v.strip(), part) for v in m["values"].split(","))
            if not values or values == ("",):
                raise ValueError(f"{part!r}: a set needs at least one value")
            reqs.append(Requirement(_key(m["key"], part), m["op"], values))
            continue
        for op in ("!=", "==", "="):
            if op in part:
                key, _, value = part.partition(op)
                reqs.append(
                    Requirement(
                        _key(key.strip(), part), "!=" if op == "!=" else "=", (_value(value.strip(), part),)
                    )
                )
                break
        else:
            if part.startswith("!"):
                reqs.append(Requirement(_key(part[1:].strip(), part), "!"))
            else:
                reqs.append(Requirement(_key(part, part), "exists"))
    return Selector(tuple(reqs))


def default_shard_name(selector: Selector) -> str:
    """A DNS-label name for the shard, derived from its selector: a readable part and a hash
    of the whole selector (`disagg.dev/shard=a` gives `disagg.dev-shard-a-<8 hex>`), so two
    different selectors never share a name (and so never share a Lease)."""
    text = str(selector)
    slug = re.sub(r"[^a-z0-9.-]+", "-", text.lower()).strip("-.")
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    readable = slug[: SHARD_NAME_MAX - len(digest) - 1].strip("-.")
    return f"{readable}-{digest}" if readable else digest


def check_shard_name(name: str) -> str:
    if not re.match(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$", name) or len(name) > SHARD_NAME_MAX:
        raise ValueError(
            f"shard name {name!r} must be lowercase letters, digits, '-' or '.', at most "
            f"{SHARD_NAME_MAX} characters, starting and ending with a letter or digit"
        )
    return name


def lease_name(base: str, shard: str | None) -> str:
    """The Lease of a shard: `<base>-<shard>`; without a shard, `base` itself."""
    return f"{base}-{shard}" if shard else base


# ---------------------------------------------------------------------------- overlap between shards

#: The Lease annotation on which a shard records what it owns (`Scope.to_annotation`).
SCOPE_ANNOTATION = "disagg.dev/shard-scope"


@dataclass(frozen=True)
class Scope:
    """What one shard owns: the DisaggDeployments its selector matches in its namespaces (empty:
    every namespace). `name` is its Lease's name."""

    name: str
    selector: Selector = Selector()
    namespaces: frozenset[str] = frozenset()

    def to_annotation(self) -> str:
        return json.dumps(
            {"selector": str(self.selector), "namespaces": sorted(self.namespaces)}, separators=(",", ":")
        )

    @classmethod
    def from_annotation(cls, name: str, text: str | None) -> Scope | None:
        """The scope another shard recorded; None when absent or unreadable (nothing decided)."""
        if not text:
            return None
        try:
            raw = json.loads(text)
            return cls(
                name,
                parse_selector(raw.get("selector") or None),
                frozenset(str(n) for n in raw.get("namespaces") or ()),
            )
        except (ValueError, TypeError, AttributeError):
            return None

    def owns(self, namespace: str, labels: Mapping[str, str] | None) -> bool:
        return (not self.namespaces or namespace in self.namespaces) and self.selector.matches(labels)


def _witness_value(reqs: list[Requirement]) -> str | bool | None:
    """A value of one label that satisfies every requirement on it: a string, None for "absent",
    or False when no value does (the requirements contradict)."""
    allowed: set[str] | None = None  # None: any value
    excluded: set[str] = set()
    must_exist = must_be_absent = False
    for r in reqs:
        if r.op in ("=", "in"):
            allowed = set(r.values) if allowed is None else allowed & set(r.values)
            must_exist = True
        elif r.op in ("!=", "notin"):
            excluded |= set(r.values)
        elif r.op == "exists":
            must_exist = True
        else:  # "!"
            must_be_absent = True
    if must_be_absent:
        return False if must_exist else None
    if allowed is not None:
        left = sorted(allowed - excluded)
        return left[0] if left else False
    if not must_exist:
        return None
    # Any value outside a finite exclusion will do.
    return next(v for v in (f"x{i}" for i in range(len(excluded) + 1)) if v not in excluded)


def common_labels(a: Selector, b: Selector) -> dict[str, str] | None:
    """A label set that both selectors match (only the labels they name: absent ones are left
    out), or None when none exists: the two selectors are then disjoint for every object.

    Each key is decided on its own, so for the selector syntax parsed here this is exact: None
    means no object can ever match both; a label set means an object labelled so would match
    both. It does not mean that such an object exists (selectors on different keys, `team=a`
    and `tier=gold`, always have one: an object carrying both labels)."""
    by_key: dict[str, list[Requirement]] = {}
    for r in (*a.requirements, *b.requirements):
        by_key.setdefault(r.key, []).append(r)
    labels: dict[str, str] = {}
    for key, reqs in sorted(by_key.items()):
        v = _witness_value(reqs)
        if v is False:
            return None
        if v is not None:
            labels[key] = v
    return labels


def overlap(a: Scope, b: Scope) -> str | None:
    """Why shards `a` and `b` may both own one object, or None when they cannot (their
    namespace sets are disjoint, or their selectors contradict on some key)."""
    if a.namespaces and b.namespaces and not (a.namespaces & b.namespaces):
        return None
    labels = common_labels(a.selector, b.selector)
    if labels is None:
        return None
    where = (
        sorted(a.namespaces & b.namespaces)
        if a.namespaces and b.namespaces
        else sorted(a.namespaces | b.namespaces)
    )
    in_ns = f" in namespace {', '.join(where)}" if where else ""
    if a.selector == b.selector:
        return f"the same selector {str(a.selector) or '(every object)'!r}{in_ns}"
    shown = ",".join(f"{k}={v}" for k, v in labels.items()) or "(no labels)"
    return (
        f"selectors {str(a.selector) or '(every object)'!r} and {str(b.selector) or '(every object)'!r} "
        f"both match an object labelled {shown}{in_ns}"
    )
