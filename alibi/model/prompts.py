"""Pinned prompt sets: N windows of T token ids, cut deterministically from a pinned text source.

Sources:

- `wikipedia`: the English Wikipedia excerpt inside the gensim 4.4.0 wheel
  (`pip download --no-deps gensim==4.4.0`), given as the wheel or as the extracted `.bz2`. The
  `.bz2`'s sha256 is pinned (it is the same in every platform's wheel); a known wheel's own
  sha256 is checked too. Text is CC BY-SA: the set carries `ATTRIBUTION.md`.
- `text`: any UTF-8 text file, pinned by the sha256 the caller passes (`--sha256`), or recorded
  as found when none is passed.

The text is tokenized once as one stream; the stream is cut into consecutive, non-overlapping
windows of T tokens, and N of them are taken at evenly spaced indices (`i·n_windows // N`), so
the windows cover the source from start to end and the choice depends on nothing but N, T and
the text. A set is a folder:

    tokens.safetensors   `input_ids` int32 [N,T]
    windows.jsonl        per window: index, first token's offset in the stream, decoded text
    ATTRIBUTION.md       source, licence and attribution
    manifest.json        alibi manifest (kind `prompts`): source digests, tokenizer digest, N, T

A prompt set's digest is its folder digest (`alibi.governance.manifest.digest_tree`).
"""

from __future__ import annotations

import bz2
import json
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from alibi.errors import InputError, one_line
from alibi.governance.manifest import (
    build_predicate,
    digest_set,
    digest_tree,
    read_manifest,
    verify_files,
    write_manifest,
)
from alibi.io import atomic
from alibi.model.checkpoint import tokenizer_digest
from alibi.model.digests import bytes_sha256, file_sha256, tensors_sha256
from alibi.model.wikitext import CLEANER_VERSION, articles, corpus_text
from alibi.tiles.safetensors_header import read_header

TOKENS_FILE, WINDOWS_FILE, ATTRIBUTION_FILE = "tokens.safetensors", "windows.jsonl", "ATTRIBUTION.md"


@dataclass(frozen=True)
class WikipediaSource:
    """The pinned Wikipedia excerpt: `member` inside the wheel, its sha256, known wheels' sha256s."""

    member: str
    member_sha256: str
    wheels: Mapping[str, str]
    attribution: str


GENSIM_WIKIPEDIA = WikipediaSource(
    member="gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
    member_sha256="a53f4648dec40467ebdcbc7a1307eddb51fe6e28e9309f6ebde81ba0d04bea2d",
    wheels={
        "gensim-4.4.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl":
            "91a7fa5e814e7b1bad4b2dffa8d62c1e55410d5cbdf930714c1997ffb4404db8",
    },
    attribution=(
        "Text from English Wikipedia (https://en.wikipedia.org/), articles from the dump "
        "enwiki-latest-pages-articles1.xml-p000000010p000030302 as shortened and shipped in the gensim "
        "4.4.0 wheel (gensim/test/test_data/). Wikipedia contributors, licensed under the Creative Commons "
        "Attribution-ShareAlike license (CC BY-SA 3.0/4.0, https://creativecommons.org/licenses/by-sa/4.0/). "
        "The text was converted to plain text (markup removed) and tokenized; article authorship is "
        "recorded in each article's history on Wikipedia. Derived prompt files are shared under the same licence."
    ),
)


@dataclass(frozen=True)
class SourceText:
    """Text resolved from a source: `text` itself and a JSON-able `provenance` (kind, digests, licence)."""

    text: str
    provenance: Mapping[str, object]
    attribution: str


def _sha256_file(path: Path) -> str:
    return file_sha256(path)


# The pinned excerpt is a small test file of gensim (well under a megabyte); a member of that name declaring
# more than this is not it, and is refused before a byte of it is decompressed (a zip bomb cannot fill memory).
MAX_EXCERPT_BYTES = 64 * 2**20


def _bounded_member(z: zipfile.ZipFile, member: str, path: Path) -> bytes:
    """The bytes of `member`, refused (InputError) before decompression when its declared size exceeds
    MAX_EXCERPT_BYTES; zipfile stops at the declared size and checks the CRC, so no more is ever inflated."""
    info = z.getinfo(member)
    if info.file_size > MAX_EXCERPT_BYTES:
        raise InputError(f"{path}: {member} declares {info.file_size:,} bytes, more than any Wikipedia excerpt this "
                         f"toolkit pins ({MAX_EXCERPT_BYTES:,}); it is not the pinned excerpt: pass the unmodified "
                         "gensim 4.4.0 wheel")
    with z.open(info) as fh:
        return fh.read(MAX_EXCERPT_BYTES + 1)


def wikipedia_text(path: str | Path, source: WikipediaSource = GENSIM_WIKIPEDIA) -> SourceText:
    """Cleaned article text of the pinned Wikipedia excerpt, from the gensim wheel or the `.bz2`."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file; download the source with "
                         "`pip download --no-deps gensim==4.4.0 -d DIR` and pass the .whl (or the extracted .bz2)")
    wheel_sha = None
    if path.suffix == ".whl":
        wheel_sha = _sha256_file(path)
        known = source.wheels.get(path.name)
        if known is not None and known != wheel_sha:
            raise InputError(f"{path}: sha256 {wheel_sha} does not match the pinned {known} for this wheel; "
                             "download it again from PyPI")
        try:
            with zipfile.ZipFile(path) as z:
                raw = _bounded_member(z, source.member, path)
        except KeyError:
            raise InputError(f"{path}: does not contain {source.member}; pass the gensim 4.4.0 wheel") from None
        except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as exc:
            raise InputError(f"{path}: not a readable wheel ({one_line(str(exc))}); download it again") from None
    else:
        if path.stat().st_size > MAX_EXCERPT_BYTES:
            raise InputError(f"{path}: {path.stat().st_size:,} bytes, more than any Wikipedia excerpt this toolkit "
                             f"pins ({MAX_EXCERPT_BYTES:,}); pass the gensim 4.4.0 wheel or its .bz2 member")
        raw = path.read_bytes()
    member_sha = bytes_sha256(raw)
    if member_sha != source.member_sha256:
        raise InputError(f"{path}: the Wikipedia excerpt's sha256 is {member_sha}, but the pinned source is "
                         f"{source.member_sha256}; use the unmodified gensim 4.4.0 wheel")
    try:
        xml = bz2.decompress(raw)
    except OSError as exc:
        raise InputError(f"{path}: the excerpt is not valid bzip2 ({exc})") from exc
    text = corpus_text(articles(xml))
    provenance = {
        "kind": "wikipedia",
        "file": path.name,
        "member": source.member,
        "member_digest": digest_set(member_sha),
        "wheel_digest": None if wheel_sha is None else digest_set(wheel_sha),
        "cleaner_version": CLEANER_VERSION,
        "license": "CC BY-SA",
    }
    return SourceText(text, provenance, source.attribution)


def file_text(path: str | Path, sha256: str | None = None, attribution: str | None = None) -> SourceText:
    """A UTF-8 text file as a source, checked against `sha256` when given."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such text file")
    raw = path.read_bytes()
    digest = bytes_sha256(raw)
    if sha256 is not None and digest != sha256.lower():
        raise InputError(f"{path}: sha256 is {digest}, but --sha256 pins {sha256}; use the pinned file or fix the pin")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc})") from exc
    provenance = {"kind": "text", "file": path.name, "digest": digest_set(digest), "pinned": sha256 is not None}
    return SourceText(text, provenance, attribution or f"Text from {path.name} (sha256 {digest}); licence as stated by its source.")


def _tokenizer(model_dir: str | Path):
    try:
        # deferred: keeps tokenizers out of start-up
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise InputError("building a prompt set needs the 'tokenizers' package "
                         "(`pip install 'integer-alibi[model]'`)") from exc
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise InputError(f"{path}: missing; pass a checkpoint folder with a tokenizer.json (--tokenizer DIR)")
    return Tokenizer.from_file(str(path))


def select_windows(n_tokens: int, windows: int, tokens: int) -> list[int]:
    """Start offsets of `windows` evenly spaced, non-overlapping windows of `tokens` in a stream of `n_tokens`."""
    available = n_tokens // tokens
    if windows < 1 or tokens < 1:
        raise InputError(f"--windows and --tokens must be positive (got {windows}, {tokens})")
    if available < windows:
        raise InputError(f"the source has {n_tokens} tokens: only {available} windows of {tokens} fit, "
                         f"{windows} requested; ask for fewer or shorter windows")
    return [(i * available // windows) * tokens for i in range(windows)]


@dataclass(frozen=True)
class PromptSet:
    """A loaded prompt set: `input_ids` int64 [N,T], its `folder`, `digest` (folder digest),
    `tokenizer_digest` (of the tokenizer that made the ids) and the manifest `predicate`."""

    input_ids: torch.Tensor
    folder: Path
    digest: str
    tokenizer_digest: str
    predicate: Mapping[str, object]

    @property
    def windows(self) -> int:
        return self.input_ids.shape[0]

    @property
    def tokens(self) -> int:
        return self.input_ids.shape[1]


def build_prompt_set(source: SourceText, tokenizer_dir: str | Path, out: str | Path,
                     windows: int = 8, tokens: int = 512) -> PromptSet:
    """Tokenize `source`, cut `windows` × `tokens` windows, and write the set to `out` atomically."""
    atomic.refuse_overlap(out, {"--tokenizer": tokenizer_dir}, what="the prompt set")
    atomic.check_writable_dir(out)
    atomic.check_replaceable(out)
    tok = _tokenizer(tokenizer_dir)
    stream = tok.encode(source.text, add_special_tokens=False).ids
    starts = select_windows(len(stream), windows, tokens)
    ids = torch.tensor([stream[s : s + tokens] for s in starts], dtype=torch.int32)
    tok_digest = tokenizer_digest(tokenizer_dir)
    with atomic.staged_dir(out) as stage:
        # no safetensors metadata: its order is not deterministic; the manifest records N, T, tokenizer
        save_file({"input_ids": ids}, str(stage / TOKENS_FILE))
        lines = [json.dumps({"window": i, "start_token": s, "text": tok.decode(ids[i].tolist(), skip_special_tokens=False)},
                            ensure_ascii=False) for i, s in enumerate(starts)]
        (stage / WINDOWS_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")
        (stage / ATTRIBUTION_FILE).write_text(f"# Attribution\n\n{source.attribution}\n", encoding="utf-8")
        write_manifest(stage, "prompts", build_predicate(
            inputs={"tokenizer": {"name": "tokenizer", "digest": digest_set(tok_digest)}},
            parameters={"source": dict(source.provenance), "windows": windows, "tokens": tokens,
                        "stream_tokens": len(stream), "window_starts": starts,
                        "selection": "non-overlapping windows of T tokens at stream indices i*floor(n/T)//N*T",
                        "text_digest": digest_set(bytes_sha256(source.text.encode("utf-8"))),
                        "tokens_digest": digest_set(tensors_sha256({"input_ids": ids}))}))
    return load_prompt_set(out)


def load_prompt_set(folder: str | Path) -> PromptSet:
    """Read a prompt set, verifying every file against its manifest (InputError on any mismatch)."""
    folder = Path(folder)

    manifest = read_manifest(folder)
    if manifest.kind != "prompts":
        raise InputError(f"{folder}: its manifest is of kind {manifest.kind!r}, not a prompt set; "
                         "build one with `alibi prompts build`")
    problems = verify_files(folder)
    if problems:
        raise InputError(f"{folder}: does not match its manifest ({problems[0]}); rebuild the prompt set")
    where = one_line(str(folder / TOKENS_FILE))
    header = read_header(folder / TOKENS_FILE, "prompt-set token file")
    entry = header.tensors.get("input_ids")
    if entry is None:
        raise InputError(f"{where}: holds no input_ids tensor; rebuild the prompt set with `alibi prompts build`")
    if len(entry.shape) != 2 or min(entry.shape) < 1 or entry.dtype not in ("I32", "I64"):
        raise InputError(f"{where}: input_ids is {entry.dtype} {list(entry.shape)}; a prompt set holds int32 token ids "
                         "[N windows, T tokens] with N, T ≥ 1; rebuild it with `alibi prompts build`")
    try:
        ids = load_file(str(folder / TOKENS_FILE))["input_ids"]
    except (SafetensorError, OSError, KeyError, ValueError, RuntimeError) as exc:
        raise InputError(f"{where}: unreadable ({one_line(str(exc))[:200]}); rebuild the prompt set") from None
    if bool((ids < 0).any()):
        raise InputError(f"{where}: input_ids holds negative token ids; rebuild the prompt set")
    tokenizer = (manifest.predicate.get("inputs") or {}).get("tokenizer")
    tok = tokenizer.get("digest", {}).get("sha256") if isinstance(tokenizer, dict) else None
    if not isinstance(tok, str):
        raise InputError(f"{one_line(str(folder))}: its manifest records no tokenizer input (predicate.inputs.tokenizer); "
                         "a prompt set must say which tokenizer made its ids: rebuild it with `alibi prompts build "
                         "--tokenizer MODEL_DIR`")
    return PromptSet(ids.to(torch.int64), folder, digest_tree(folder), tok, manifest.predicate)


def require_tokenizer_match(prompts: PromptSet, model_dir: str | Path) -> None:
    """InputError unless `prompts` was tokenized with the tokenizer of the checkpoint in `model_dir`."""
    model_tok = tokenizer_digest(model_dir)
    if model_tok != prompts.tokenizer_digest:
        raise InputError(f"{prompts.folder}: was tokenized with tokenizer {prompts.tokenizer_digest[:12]}…, but "
                         f"{model_dir} has tokenizer {model_tok[:12] or 'none'}…; rebuild the prompt set with "
                         f"`alibi prompts build --tokenizer {model_dir}`")
