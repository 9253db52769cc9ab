"""Regenerate tests/infra/schemas/azure-types.json from a clone of Azure/bicep-types-az.

The extract holds, for every `Type@api-version` the templates under infra/ declare, the
type definitions Bicep itself type-checks a resource body against (bicep-types-az's
generated `types.json`, built from the Azure REST API specs), and nothing else: the
resource types reachable from those bodies, descriptions dropped.

    python tests/infra/schemas/extract.py /path/to/bicep-types-az.git   # a bare git dir
    python tests/infra/schemas/extract.py /path/to/bicep-types-az       # or a work tree

Source and licence: README.md beside this file.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
OUT = HERE / "azure-types.json"

_DECL = re.compile(r"^\s*resource\s+\w+\s+'([^'@]+)@([^']+)'", re.M)


def declared_types(infra: Path = ROOT / "infra") -> set[tuple[str, str]]:
    found = set()
    for path in sorted(infra.rglob("*.bicep")):
        found.update(_DECL.findall(path.read_text()))
    return found


class Repo:
    """Read files from a bare git dir (git show) or a work tree."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.bare = not (path / "generated").is_dir()

    def git(self, *args: str) -> str:
        return subprocess.run(
            ["git", f"--git-dir={self.path}", *args], check=True, capture_output=True, text=True
        ).stdout

    def commit(self) -> tuple[str, str]:
        if self.bare:
            out = self.git("log", "-1", "--format=%H %cs", "HEAD")
        else:
            out = subprocess.run(
                ["git", "-C", str(self.path), "log", "-1", "--format=%H %cs", "HEAD"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        commit, date = out.split()
        return commit, date

    def types_files(self) -> list[str]:
        if self.bare:
            names = self.git("ls-tree", "-r", "--name-only", "HEAD", "generated").splitlines()
        else:
            names = [
                p.relative_to(self.path).as_posix()
                for p in (self.path / "generated").rglob("types.json")
            ]
        return [n for n in names if n.endswith("/types.json")]

    def read(self, name: str) -> str:
        if self.bare:
            return self.git("show", f"HEAD:{name}")
        return (self.path / name).read_text()


def extract(repo: Repo, wanted: set[tuple[str, str]]) -> dict:
    files = repo.types_files()
    types: list[dict] = []
    resources: dict[str, list[int]] = {}
    for rtype, version in sorted(wanted):
        key = f"{rtype}@{version}"
        provider = rtype.split("/")[0].lower()
        candidates = [f for f in files if f.split("/")[-3:-1] == [provider, version]]
        for name in candidates:
            table = json.loads(repo.read(name))
            roots = [
                i
                for i, t in enumerate(table)
                if t["$type"] == "ResourceType" and t["name"].lower() == key.lower()
            ]
            if not roots:
                continue
            offset = len(types)
            # Keep only the part of the file's table reachable from the roots, renumbered.
            keep: dict[int, int] = {}
            order: list[int] = []
            stack = list(reversed(roots))
            while stack:
                i = stack.pop()
                if i in keep:
                    continue
                keep[i] = -1
                order.append(i)
                stack.extend(reversed(_refs(table[i])))
            for n, i in enumerate(order):
                keep[i] = offset + n
            for i in order:
                types.append(_renumber(_strip(table[i]), keep))
            resources.setdefault(key, []).extend(keep[r] for r in roots)
            resources[key] = sorted(set(resources[key]))
            # Record where it came from.
            resources.setdefault("__files__", []).append(name)  # type: ignore[arg-type]
    files_used = sorted(set(resources.pop("__files__", [])))  # type: ignore[arg-type]
    commit, date = repo.commit()
    return {
        "source": {
            "repository": "https://github.com/Azure/bicep-types-az",
            "commit": commit,
            "date": date,
            "license": "MIT (Copyright (c) Microsoft Corporation)",
            "files": files_used,
            "regenerate": "python tests/infra/schemas/extract.py PATH_TO_bicep-types-az",
        },
        "missing": sorted(f"{t}@{v}" for t, v in wanted if f"{t}@{v}" not in resources),
        "resources": dict(sorted(resources.items())),
        "types": types,
    }


def _refs(node) -> list[int]:
    out: list[int] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str) and v.startswith("#/"):
                out.append(int(v[2:]))
            else:
                out.extend(_refs(v))
    elif isinstance(node, list):
        for v in node:
            out.extend(_refs(v))
    return out


def _strip(node):
    if isinstance(node, dict):
        # A type's or property's description text (not a property named description).
        return {
            k: _strip(v) for k, v in node.items() if not (k == "description" and isinstance(v, str))
        }
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def _renumber(node, keep: dict[int, int]):
    if isinstance(node, dict):
        return {
            k: (f"#/{keep[int(v[2:])]}" if k == "$ref" else _renumber(v, keep))
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_renumber(v, keep) for v in node]
    return node


def dumps(data: dict) -> str:
    """JSON with one type definition a line, so a regeneration diffs readably."""
    compact = {"separators": (",", ":"), "sort_keys": True}
    head = {k: v for k, v in data.items() if k != "types"}
    lines = ["{"]
    for key, value in head.items():
        lines.append(f"{json.dumps(key)}:{json.dumps(value, **compact)},")
    lines.append('"types":[')
    lines.append(",\n".join(json.dumps(t, **compact) for t in data["types"]))
    lines.append("]}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", type=Path, help="bicep-types-az: bare git dir or work tree")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    data = extract(Repo(args.repo), declared_types())
    args.out.write_text(dumps(data))
    print(
        f"{args.out}: {len(data['resources'])} resource types, {len(data['types'])} type "
        f"definitions, {args.out.stat().st_size // 1024} KiB; missing: {data['missing'] or 'none'}"
    )
    return 1 if data["missing"] else 0


if __name__ == "__main__":
    sys.exit(main())
