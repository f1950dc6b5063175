"""`alibi manifest write|verify|provenance`: pin an artifact folder by hash, check one, check two arms'
identity, or find the commit whose code produced a result."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from alibi.errors import InputError, one_line
from alibi.governance.identity import TREATMENTS, compare_manifests
from alibi.governance.kernel_log import read_kernel_log
from alibi.governance.manifest import (
    KINDS,
    build_predicate,
    engine_treatment,
    manifest_path,
    resource,
    statement_problems,
    treatment_of,
    verify_files,
    write_manifest,
)
from alibi.governance.provenance import find_provenance
from alibi.io import jsonio


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("manifest", help="write and verify hash-pinned artifact manifests",
                                   description=__doc__)
    sub = parser.add_subparsers(dest="manifest_command", required=True, parser_class=type(parser))

    w = sub.add_parser("write", help="write DIR/manifest.json covering every file in DIR")
    w.add_argument("folder", type=Path, help="the artifact folder")
    w.add_argument("--kind", required=True, help=f"artifact kind, e.g. {', '.join(KINDS)}")
    w.add_argument("--input", action="append", default=[], metavar="NAME=PATH",
                   help="an input the artifact was made from (checkpoint, prompts, tokenizer, "
                        "quantization_config, tiles); pinned by its sha256 (repeatable)")
    w.add_argument("--seed", type=int, default=None, help="the random seed used, if any")
    w.add_argument("--kernel-log", type=Path, metavar="FILE",
                   help="the engine's log (vLLM): its 'Selected <kernel class> for <layer>' lines are recorded "
                        "as treatment evidence (predicate.treatment.kernel_log)")
    w.add_argument("--kernel", metavar="NAME",
                   help="the alibi kernel that ran (e.g. vllm-cutlass): its name, build digest and declared "
                        "epilogue join the treatment; must agree with --kernel-log")
    w.add_argument("--arm", metavar="LABEL", help="the arm's label in the treatment (default: the folder's name)")
    w.set_defaults(func=_write)

    v = sub.add_parser("verify", help="check one manifest's files, or the identity contract between two",
                       description="With one manifest: every covered file still matches its digest. With two: "
                                   "they differ in nothing but the declared treatment (exit 1 otherwise).")
    v.add_argument("a", type=Path, help="a manifest.json or the folder holding it")
    v.add_argument("b", type=Path, nargs="?", help="the other arm's manifest (identity contract)")
    v.add_argument("--treatment", action="append", default=None, metavar="NAME|FIELD",
                   help=f"what may differ: {', '.join(TREATMENTS)} or a dotted predicate field such as "
                        "inputs.checkpoint (repeatable; default: kernel)")
    v.add_argument("--json", action="store_true", help="print the identity record as JSON")
    v.set_defaults(func=_verify)

    pv = sub.add_parser("provenance", help="find the commit(s) whose source tree produced a result",
                        description="Search every commit reachable from HEAD for the source digest a result's "
                                    "manifest records (results made on a copy without git history record no "
                                    "commit). Exit 0 when a commit matches, 1 when none does.")
    pv.add_argument("result", type=Path, nargs="+", help="a manifest.json, the folder holding it, or a JSON result")
    pv.add_argument("--repo", type=Path, default=Path("."), help="the toolkit's git checkout (default: .)")
    pv.set_defaults(func=_provenance)


def _write(args: argparse.Namespace) -> int:
    inputs = {}
    for item in args.input:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--input {item!r}: expected NAME=PATH, e.g. --input prompts=prompts/eval.jsonl")
        inputs[name] = resource(path, path)
    treatment = _treatment(args)
    path = write_manifest(args.folder, args.kind, build_predicate(inputs=inputs, seed=args.seed, treatment=treatment))
    print(f"wrote {path}")
    return 0


def _treatment(args: argparse.Namespace):
    """The treatment `--kernel` and `--kernel-log` describe, or None when neither is given."""
    if args.kernel is None and args.kernel_log is None:
        if args.arm is not None:
            raise InputError("--arm labels a treatment: give --kernel NAME and/or --kernel-log FILE with it")
        return None

    arm = args.arm or args.folder.resolve().name
    log = read_kernel_log(args.kernel_log) if args.kernel_log is not None else None
    if args.kernel is None:
        return engine_treatment(log, arm)
    # deferred: keeps torch out of start-up
    from alibi.kernels.registry import get_kernel

    return treatment_of(get_kernel(args.kernel), arm, kernel_log=log)


def _verify(args: argparse.Namespace) -> int:
    if args.b is None:
        p = manifest_path(args.a)
        if not p.is_file():
            raise InputError(f"{p}: no such manifest")
        statement, problems = _parsed(p)
        problems = problems or statement_problems(statement)
        problems += [] if problems else verify_files(p)
        for msg in problems:
            print(f"FAIL {one_line(msg)}")
        print(f"{one_line(str(p))}: " + ("every covered file matches its digest" if not problems
                                        else f"{len(problems)} problem(s)"))
        return 1 if problems else 0
    # Each side must be a well-formed manifest before the two can be compared field by field: a
    # damaged one (deeply nested, a `subject` that is not a list, ...) fails the contract as it is.
    malformed = []
    for label, path in (("A", args.a), ("B", args.b)):
        p = manifest_path(path)
        if not p.is_file():
            raise InputError(f"{one_line(str(p))}: no such manifest; pass a manifest.json or the folder holding one")
        statement, problems = _parsed(p)
        malformed += [f"{label} ({one_line(str(p))}): {one_line(m)}" for m in problems or statement_problems(statement)]
    if malformed:
        for msg in malformed:
            print(f"FAIL {msg}")
        print(f"identity contract broken: {len(malformed)} problem(s)")
        return 1
    record = compare_manifests(args.a, args.b, args.treatment or ["kernel"])
    if args.json:
        print(json.dumps(record.as_dict(), indent=2, sort_keys=True))
    else:
        for msg in record.problems:
            print(f"FAIL {one_line(msg)}")
        if record.verified:
            differing = ", ".join(record.differing) or "nothing"
            print(f"identity holds: only the treatment may differ; differing: {differing}")
        else:
            print(f"identity contract broken: {len(record.problems)} problem(s)")
    return 0 if record.verified else 1


def _parsed(p: Path) -> tuple[object, list[str]]:
    """The manifest's JSON and no problem, or None and the one problem that it is not readable JSON."""
    try:
        return jsonio.read(p), []
    except InputError as exc:
        return None, [str(exc)]


def _provenance(args: argparse.Namespace) -> int:
    missing = 0
    for result in args.result:
        p = find_provenance(result, args.repo)
        recorded = p.recorded_commit or "none recorded"
        if p.found:
            print(f"{result}: source digest {p.recorded_digest[:16]}… is the tree of commit(s) {', '.join(p.matches)} "
                  f"(recorded commit: {recorded})")
        else:
            missing += 1
            print(f"{result}: source digest {p.recorded_digest[:16]}… matches none of {p.searched} commits: "
                  f"it ran on uncommitted code (recorded commit: {recorded})")
    return 1 if missing else 0
