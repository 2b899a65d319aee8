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
