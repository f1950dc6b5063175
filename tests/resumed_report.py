"""The one record a resumed run adds to its report folder (issue 26: how many units it read from disk), taken
out, so tests can compare a resumed run's files with an uninterrupted run's byte for byte otherwise."""

from __future__ import annotations

import json
import re


def without_units_record(files: dict[str, bytes], folder: str = "") -> tuple[dict[str, bytes], int]:
    """A report folder's files (under `folder`, e.g. "report/" in a run folder) with the one record a
    resumed run adds (how many units it read from disk, issue 26) taken out, and that count (0 when
    absent): report.json's and the manifest's `source` entries, report.md's line, report.html's three
    source facts, and the manifest's digests of those three files."""
    files = dict(files)
    report = json.loads(files[folder + "report.json"])
    n = report["source"].pop("units_from_disk", 0)
    report["source"].pop("units", None), report["source"].pop("units_verified", None)
    files[folder + "report.json"] = json.dumps(report, sort_keys=True).encode()
    files[folder + "report.md"] = b"\n".join(line for line in files[folder + "report.md"].split(b"\n")
                                             if not line.startswith(b"- units from disk:"))
    files[folder + "report.html"] = re.sub(rb"<dt>units_from_disk</dt><dd>\d+</dd><dt>units</dt><dd>\d+</dd>"
                                           rb"<dt>units_verified</dt><dd>\w+</dd>", b"", files[folder + "report.html"])
    manifest = json.loads(files["manifest.json"])
    for key in ("units_from_disk", "units", "units_verified"):
        manifest["predicate"]["parameters"].get("source", {}).pop(key, None)
    manifest["subject"] = [s for s in manifest["subject"]
                           if s["name"] not in {folder + f for f in ("report.json", "report.md", "report.html")}]
    files["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    return files, n
