"""Give every committed result folder that records its code only as a `SOURCE_COMMIT` text file (or only
inside its own JSON result) a manifest with that commit and its source digest (issue 26).

Such folders (session logs, JSON results and archives made on the GPU machine before manifests
covered them) named the commit that ran in a text file only. This writes `manifest.json` (kind
`results`) covering every file of the folder, with `toolkit.git_commit` the commit the file names
and `toolkit.source_digest` the digest of that commit's `alibi/` sources, computed from git's
object store (`alibi.governance.provenance.commit_source_digest`), so `alibi manifest verify` pins
the bytes and `alibi manifest provenance` finds the commit. Nothing is measured here: the
environment of the run is the one the folder's own `env*.txt` and README describe, and the
manifest names those files instead of this machine's (`environment.described_in`).
`toolkit.pinned_after_the_fact: true` says the manifest was written after the results, from the
recorded commit, not by the run itself. A folder in RECORDED_IN_RESULT has no SOURCE_COMMIT file:
its JSON result carries the `toolkit` record the run itself wrote (commit, `git_dirty: false`, source
digest); that commit is taken only when its sources have exactly that digest. A pre-registered study's folder (`PREREGISTERED`) also gets
`protocol`: the lock hash and amendment head of its protocol folder in that commit's tree, so
"locked before measured" rests on the commit the results name, not on self-reported times.

    python analysis/pin_results.py [--check]     # --check: write nothing, exit 1 if a folder lacks one
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "analysis" / "results"
KIND = "results"
CREATED_AT = "2026-12-02T00:00:00Z"
# result folder (relative to RESULTS) -> the protocol folder it was measured under
PREREGISTERED = {"h200/tokens": "prereg/smollm2-token-transfer",
                 # amendment 1 of the same protocol (analysis/results/h200/determinism/README.md)
                 **{f"h200/determinism/{part}": "prereg/smollm2-token-transfer" for part in ("greedy", "probe", "study")},
                 **{f"h200/determinism/b5db8e0/{part}": "prereg/smollm2-token-transfer"
                    for part in ("probe", "tokens", "variations", "batch", "evaluation", "batch-controls", "evaluation-2",
                                 "variations-2", "evaluation-3")},
                 **{f"h200/determinism/76b0b83/{part}": "prereg/smollm2-token-transfer" for part in ("probe", "bench")}}  # when the manifests were written (fixed: a re-run gives the same bytes)


# result folder (relative to RESULTS) -> its JSON result whose `toolkit` record (written by the run) names the commit
RECORDED_IN_RESULT = {"cpu/runner-bench": "bench-runner.json",
                      # moved from cpu/pow2_cost.{json,md} into a folder of its own to carry the manifest;
                      # made again it takes over an hour here (the deterministic runner is the default now)
                      "cpu/pow2-cost": "pow2_cost.json"}


def recorded_commit(result: Path) -> str:
    """The commit a JSON result's own `toolkit` record names, when the run recorded a clean tree and that
    commit's `alibi/` sources have the digest it recorded; ValueError otherwise."""
    import json

    from alibi.governance.provenance import commit_source_digest

    toolkit = json.loads(result.read_text(encoding="utf-8")).get("toolkit") or {}
    commit, digest = toolkit.get("git_commit"), (toolkit.get("source_digest") or {}).get("sha256")
    if not commit or toolkit.get("git_dirty") is not False:
        raise ValueError(f"{result}: its toolkit record names no commit of a clean tree ({commit}, git_dirty "
                         f"{toolkit.get('git_dirty')}); it cannot be pinned after the fact")
    if commit_source_digest(REPO, commit) != digest:
        raise ValueError(f"{result}: commit {commit[:12]}'s sources do not have the digest it records")
    return commit


def source_commit(folder: Path) -> str:
    """The one commit the folder's SOURCE_COMMIT file(s) name (or its JSON result records, RECORDED_IN_RESULT);
    ValueError when they disagree."""
    recorded = RECORDED_IN_RESULT.get(folder.relative_to(RESULTS).as_posix())
    if recorded is not None:
        return recorded_commit(folder / recorded)
    commits = {p.read_text().split()[0] for p in sorted(folder.glob("SOURCE_COMMIT*"))}
    if len(commits) != 1:
        raise ValueError(f"{folder}: its SOURCE_COMMIT files name {sorted(commits)}; pin each result on its own")
    return commits.pop()


def folders() -> list[Path]:
    """Result folders that record their code only in SOURCE_COMMIT files, or only in their JSON result."""
    return sorted({p.parent for p in RESULTS.rglob("SOURCE_COMMIT*")} | {RESULTS / f for f in RECORDED_IN_RESULT})


def _git_show(commit: str, path: str) -> bytes | None:
    import subprocess

    done = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:{path}"], capture_output=True, check=False)
    return done.stdout if done.returncode == 0 else None


def protocol_at(commit: str, protocol: str) -> dict:
    """The protocol record (`alibi.governance.prereg.ProtocolRecord` fields) of `protocol` in `commit`'s tree:
    sha256 of its lock.json, the amendments recorded then and the head of their chain."""
    import json

    from alibi.io.digests import sha256_bytes

    lock = _git_show(commit, f"{protocol}/lock.json")
    if lock is None:
        raise ValueError(f"{protocol} is not locked in commit {commit}: the results were not measured under a lock")
    log = (_git_show(commit, f"{protocol}/amendments.jsonl") or b"").decode().splitlines()
    entries = [json.loads(line) for line in log if line.strip()]
    lock_sha = sha256_bytes(lock)
    return {"folder": protocol, "lock_sha256": lock_sha, "amendments": len(entries),
            "head_sha256": entries[-1]["entry_sha256"] if entries else lock_sha, "as_of_commit": commit}


def predicate(folder: Path) -> dict:
    from alibi.governance.provenance import commit_source_digest

    commit = source_commit(folder)
    rel = folder.relative_to(RESULTS).as_posix()
    protocol = PREREGISTERED.get(rel)
    return {
        "toolkit": {"name": "integer-alibi", "git_commit": commit,
                    "source_digest": {"sha256": commit_source_digest(REPO, commit)},
                    "pinned_after_the_fact": True, "pinned_by": "analysis/pin_results.py"},
        "environment": {"described_in": sorted(p.name for p in folder.glob("env*.txt")) +
                        (["README.md"] if (folder / "README.md").is_file() else [])},
        "inputs": {}, "seed": None, "treatment": None, "arms": None,
        "parameters": ({"commit_recorded_in": RECORDED_IN_RESULT[rel]} if rel in RECORDED_IN_RESULT else
                       {"source_commit_files": sorted(p.name for p in folder.glob("SOURCE_COMMIT*"))}),
        "protocol": None if protocol is None else protocol_at(commit, protocol),
        "run": {"created_at": CREATED_AT},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a folder lacks its manifest")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from alibi.governance.manifest import write_manifest

    missing = [f for f in folders() if not (f / "manifest.json").is_file()]
    for folder in missing:
        if args.check:
            print(f"{folder.relative_to(REPO)}: no manifest")
            continue
        write_manifest(folder, KIND, predicate(folder))
        print(f"wrote {(folder / 'manifest.json').relative_to(REPO)} (commit {source_commit(folder)[:12]})")
    return 1 if args.check and missing else 0


if __name__ == "__main__":
    sys.exit(main())
