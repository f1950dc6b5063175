"""`alibi prompts build`: a pinned prompt set (N windows × T tokens) from Wikipedia or a text file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from alibi.errors import InputError
from alibi.io import atomic


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prompts", help="build and inspect pinned prompt sets")
    ps = p.add_subparsers(dest="prompts_command", required=True, parser_class=type(p))
    b = ps.add_parser("build", help="tokenize a pinned text source into N windows of T tokens")
    src = b.add_mutually_exclusive_group(required=True)
    src.add_argument("--wikipedia", type=Path, metavar="WHEEL_OR_BZ2",
                     help="the gensim 4.4.0 wheel (pip download --no-deps gensim==4.4.0) or its enwiki .bz2")
    src.add_argument("--text", type=Path, metavar="FILE", help="any UTF-8 text file")
    b.add_argument("--sha256", help="pin for --text: refuse the file unless its sha256 matches")
    b.add_argument("--attribution", help="attribution/licence line recorded for --text")
    b.add_argument("--tokenizer", type=Path, required=True, metavar="MODEL_DIR",
                   help="checkpoint folder whose tokenizer.json tokenizes the text")
    b.add_argument("--windows", type=int, default=8, help="number of windows N (default 8)")
    b.add_argument("--tokens", type=int, default=512, help="tokens per window T (default 512)")
    b.add_argument("--out", type=Path, required=True, help="output folder of the prompt set")
    b.set_defaults(func=build)
    s = ps.add_parser("show", help="verify a prompt set against its manifest and print its windows")
    s.add_argument("folder", type=Path)
    s.set_defaults(func=show)


def build(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    from alibi.model.prompts import build_prompt_set, file_text, wikipedia_text

    if args.wikipedia is not None and (args.sha256 or args.attribution):
        raise InputError("--sha256 and --attribution apply to --text; the Wikipedia source is pinned already")
    atomic.refuse_overlap(args.out, {"--text": args.text, "--wikipedia": args.wikipedia, "--tokenizer": args.tokenizer},
                          what="the prompt set")
    source = wikipedia_text(args.wikipedia) if args.wikipedia else file_text(args.text, args.sha256, args.attribution)
    ps = build_prompt_set(source, args.tokenizer, args.out, args.windows, args.tokens)
    print(f"prompt set {ps.folder}: {ps.windows} windows × {ps.tokens} tokens, digest {ps.digest}")
    return 0


def show(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    from alibi.model.prompts import WINDOWS_FILE, load_prompt_set

    ps = load_prompt_set(args.folder)
    print(f"prompt set {ps.folder}: {ps.windows} windows × {ps.tokens} tokens, digest {ps.digest} (verified)")
    for line in (ps.folder / WINDOWS_FILE).read_text(encoding="utf-8").splitlines():
        w = json.loads(line)
        print(f"[{w['window']}] @{w['start_token']}: {w['text'][:100]!r}…")
    return 0
