"""Governance: hash-pinned manifests, the identity contract between arms, and pre-registration.

- `manifest`: in-toto Statement v1 manifests over artifact folders (`write_manifest`,
  `read_manifest`, `verify_files`, `build_predicate`, `treatment_of`).
- `identity`: `require_identity(a, b, treatment)` — only the declared treatment may differ.
- `prereg`: protocol folders that are locked, amended through a hash-chained log, and verified.
- `environment`: the toolkit version/commit and the software and hardware a result came from.
"""

from alibi.governance.identity import (
    IdentityRecord,
    IdentityViolation,
    compare_manifests,
    require_identity,
)
from alibi.governance.manifest import (
    Manifest,
    Treatment,
    build_predicate,
    digest_path,
    read_manifest,
    resource,
    sha256_file,
    treatment_of,
    verify_files,
    write_manifest,
)
from alibi.governance.prereg import ProtocolRecord, ProtocolViolation, require_locked

__all__ = [
    "IdentityRecord", "IdentityViolation", "Manifest", "ProtocolRecord", "ProtocolViolation", "Treatment",
    "build_predicate", "compare_manifests", "digest_path", "read_manifest", "require_identity", "require_locked",
    "resource", "sha256_file", "treatment_of", "verify_files", "write_manifest",
]
