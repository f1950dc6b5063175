"""`alibi prereg init|lock|amend|verify|status|evaluate DIR`: pre-registered protocols pinned by hash,
and their acceptance criteria judged by code."""

from __future__ import annotations

import argparse
from pathlib import Path

from alibi.errors import InputError, one_line
from alibi.governance import prereg
from alibi.governance.criteria import evaluate_study
from alibi.io import atomic


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("prereg", help="pre-register a protocol: init, lock, amend, verify, status",
                                   description=__doc__)
    sub = parser.add_subparsers(dest="prereg_command", required=True, parser_class=type(parser))
    for name, help_text, func in (
        ("init", "create DIR with a protocol.md template, analysis.yaml and predictions/", _init),
        ("lock", "pin the sha256 of every file in DIR (once, before measuring)", _lock),
        ("amend", "record changed files in the hash-chained amendment log", _amend),
        ("verify", "exit 1 unless the files match the lock plus amendments", _verify),
        ("status", "show the lock, the amendments and any unrecorded change", _status),
    ):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("folder", type=Path, help="the protocol folder, e.g. prereg/my-study")
        if name == "amend":
            p.add_argument("--reason", required=True, help="what changed and why (kept in the log)")
        if name == "init":
            p.add_argument("--title", default=None, help="the protocol's title (default: from the folder name)")
        p.set_defaults(func=func)
    p = sub.add_parser("evaluate", help="judge a locked protocol's acceptance criteria against result files",
                       description="Judge every criterion of DIR/analysis.yaml against the named result files; "
                                   "writes criteria.json (--out). Exit 0 pass, 1 a criterion fails or is "
                                   "inapplicable, 2 bad input.")
    p.add_argument("folder", type=Path, help="the locked protocol folder")
    p.add_argument("--result", action="append", default=[], metavar="NAME=FILE", required=True,
                   help="a result file under the source name the criteria use (repeat for each source)")
    p.add_argument("--out", type=Path, help="write the evaluation here (criteria.json beside the results)")
    p.set_defaults(func=_evaluate)


def _init(args: argparse.Namespace) -> int:
    for path in prereg.init(args.folder, args.title):
        print(f"wrote {path}")
    print(f"edit the protocol, predictions and parameters, then: alibi prereg lock {args.folder}")
    return 0


def _lock(args: argparse.Namespace) -> int:
    digest = prereg.lock(args.folder)
    print(f"locked {args.folder}: lock sha256 {digest}")
    print("commit the folder now, before any measurement it governs")
    return 0


def _amend(args: argparse.Namespace) -> int:
    head = prereg.amend(args.folder, args.reason)
    print(f"amended {args.folder}: head sha256 {head}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    st = prereg.state(args.folder)
    for msg in st.problems:
        print(f"FAIL {one_line(msg)}")
    if st.problems:
        print(f"{args.folder}: {len(st.problems)} problem(s)")
        return 1
    print(f"{args.folder}: verified; lock {st.lock_sha256}, {st.amendments} amendment(s), head {st.head_sha256}")
    return 0


def _status(args: argparse.Namespace) -> int:
    st = prereg.state(args.folder)
    print(f"protocol  {args.folder}")
    print(f"locked    {'yes' if st.locked else 'no'}" + (f" (lock sha256 {st.lock_sha256})" if st.lock_sha256 else ""))
    if st.locked:
        print(f"amended   {st.amendments} time(s); head sha256 {st.head_sha256}")
    for c in st.pending:
        print(f"pending   {c.change:<8} {one_line(c.path)}")
    for msg in st.problems:
        if "without an amendment" not in msg and "not locked" not in msg:
            print(f"damaged   {one_line(msg)}")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    sources = {}
    for item in args.result:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--result {item!r}: expected NAME=FILE, e.g. --result real=out/real/flips/flips.json")
        if name in sources:
            raise InputError(f"--result {name}: given twice; name each source once")
        sources[name] = Path(path)
    if args.out is not None:  # writing into the protocol folder would break its lock; into a result, change it
        atomic.refuse_overlap(args.out, {"the protocol folder": args.folder,
                                         **{f"--result {n}": p for n, p in sources.items()}}, what="--out")
    judged = evaluate_study(args.folder, sources)
    for o in judged.outcomes:
        mark = {True: "holds", False: "FAILS", None: "inapplicable"}[o.holds]
        print(f"  {o.criterion.id:<28} {mark:<12} {o.reason}")
    print(f"{args.folder}: {judged.verdict} ({sum(o.holds is True for o in judged.outcomes)} of "
          f"{len(judged.outcomes)} criteria hold)")
    if args.out:
        atomic.write_text(args.out, judged.to_json())
        print(f"wrote {args.out}")
    return 0 if judged.verdict == "pass" else 1
