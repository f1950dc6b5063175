"""`alibi report html DIR`: re-render a result folder's self-contained `report.html` from its JSON."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from alibi.io import atomic


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="render reports from result folders",
                       description="Render a person-readable report from the JSON a command wrote.")
    group = p.add_subparsers(dest="report_command", required=True)
    h = group.add_parser(
        "html", help="write a self-contained report.html for a result folder",
        description="Re-render the self-contained HTML report (figures inline, no network) of a result folder "
                    "from its JSON: report.json or report/report.json (alibi conform, alibi run), flips.json (alibi "
                    "analyze flips), fits.json (alibi analyze depth), detection.json (alibi mutants), "
                    "variations.json (alibi variations), matrix.json (alibi matrix); one section each. Each file is "
                    "read only once the manifest.json covering it verifies and is of the command that writes it "
                    "(exit 2, naming the file, otherwise). The folder keeps exactly its pinned files: its page goes "
                    "beside it as <folder>.report.html.")
    h.add_argument("folder", type=Path, help="the result folder")
    h.add_argument("--out", type=Path, default=None,
                   help="the HTML file to write (default: see above); refused inside a manifest-pinned folder")
    h.set_defaults(func=_html)


def _html(args: argparse.Namespace) -> int:
    # deferred: keeps jinja2 out of start-up
    from alibi.html import check_output, default_output, render_folder

    if args.out is not None:
        check_output(args.out)  # refuse a bad destination before any work
    start = time.perf_counter()
    page = render_folder(args.folder)
    out = check_output(args.out if args.out is not None else default_output(args.folder, page.sources[0]))
    atomic.write_text(out, page.html)
    size = len(page.html.encode("utf-8"))
    print(f"{out}: {size / 1e6:.2f} MB, rendered in {time.perf_counter() - start:.2f} s from "
          f"{', '.join(p.as_posix() for p in page.sources)}")
    return 0
