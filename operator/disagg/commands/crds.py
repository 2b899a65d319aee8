"""`disagg crds`: generate the DisaggDeployment CRD from `disagg.api`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _repo_root() -> Path:
    # operator/disagg/commands/crds.py -> repository root
    return Path(__file__).resolve().parents[3]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "crds",
        help="generate the DisaggDeployment CRD (crds/ and the Helm chart)",
        description=(
            "Render the CustomResourceDefinition from the pydantic API models and write it to "
            "crds/ and charts/disagg-operator/crds/ (or --output-dir). With --check, write nothing "
            "and exit 1 if a checked-in file differs."
        ),
    )
    parser.add_argument(
        "--output-dir",
        action="append",
        type=Path,
        metavar="DIR",
        help="directory to write to (repeatable); default: crds/ and charts/disagg-operator/crds/ of the repository",
    )
    parser.add_argument(
        "--check", action="store_true", help="only compare; exit 1 with a diff if files differ"
    )
    parser.add_argument("--stdout", action="store_true", help="print the CRD instead of writing files")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from disagg import crdgen

    text = crdgen.render_crd()
    if args.stdout:
        sys.stdout.write(text)
        return 0
    if args.output_dir:
        paths = [d / crdgen.CRD_FILENAME for d in args.output_dir]
    else:
        paths = crdgen.crd_paths(_repo_root())
    if args.check:
        diffs = [crdgen.diff(p, text) for p in paths]
        diffs = [d for d in diffs if d]
        if diffs:
            sys.stdout.write("".join(diffs))
            print("CRD files are out of date; run `disagg crds` and commit the result.", file=sys.stderr)
            return 1
        print("CRD files are up to date.", file=sys.stderr)
        return 0
    for p in crdgen.write(paths, text):
        print(f"wrote {p}", file=sys.stderr)
    return 0
