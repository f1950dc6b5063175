"""Plain text from a MediaWiki XML dump: article bodies with the markup taken out.

Deterministic and dependency-free (stdlib `xml.etree`, `re`, `html`), so a prompt set built from
the same dump is the same on every machine. `CLEANER_VERSION` changes whenever the rules below
change, and prompt-set manifests record it.

Rules, in order: keep pages of namespace 0 that are not redirects; drop HTML comments, `<ref>`
footnotes, templates `{{…}}` and tables `{|…|}` (innermost first, so nesting is handled); cut
the article at its first trailing section (See also, References, External links, …); turn links
`[[target|label]]` into their label and drop file, image, category and interlanguage links;
keep the label of external links `[url label]`; drop bold/italic quotes, list markers, remaining
HTML tags; unescape entities; turn headings into plain lines; squeeze blank lines.
"""

from __future__ import annotations

import html
import io
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

CLEANER_VERSION = 1

_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_REF = re.compile(r"<ref[^>/]*/>|<ref[^>]*>.*?</ref>", re.DOTALL | re.IGNORECASE)
_TEMPLATE = re.compile(r"\{\{[^{}]*\}\}")
_TABLE = re.compile(r"\{\|(?:(?!\{\|)(?!\|\}).)*\|\}", re.DOTALL)
_LINK = re.compile(r"\[\[([^\[\]]*)\]\]")
_EXTERNAL = re.compile(r"\[(?:https?|ftp)://[^\s\]]+\s*([^\]]*)\]")
_BARE_URL = re.compile(r"(?:https?|ftp)://\S+")
_QUOTES = re.compile(r"'{2,}")
_TAG = re.compile(r"</?[a-zA-Z][^>]*>")
_HEADING = re.compile(r"^(=+)\s*(.*?)\s*\1\s*$", re.MULTILINE)
_LIST = re.compile(r"^[*#:;]+\s*", re.MULTILINE)
_BLANKS = re.compile(r"\n\s*\n+")
_SPACES = re.compile(r"[ \t]+")
_DROP_LINK = re.compile(r"^\s*(?:file|image|category|media|wikipedia|wp|help|template|portal|wikt|[a-z]{2,3}(?:-[a-z]+)?):",
                        re.IGNORECASE)
_TRAILING = re.compile(r"^=+\s*(?:see also|references|external links|further reading|notes|bibliography|"
                       r"sources|footnotes|citations)\s*=+\s*$", re.MULTILINE | re.IGNORECASE)


@dataclass(frozen=True)
class Article:
    """One cleaned article: its `title` and plain-text `text`."""

    title: str
    text: str


def _strip_nested(text: str, pattern: re.Pattern, limit: int = 50) -> str:
    for _ in range(limit):
        new = pattern.sub("", text)
        if new == text:
            break
        text = new
    return text


def _link_label(match: re.Match) -> str:
    inner = match.group(1)
    if _DROP_LINK.match(inner):
        return ""
    return inner.rsplit("|", 1)[-1]


def clean_wikitext(text: str) -> str:
    """The plain text of one article's wikitext (see the module docstring for the rules)."""
    text = _COMMENT.sub("", text)
    text = _REF.sub("", text)
    text = _strip_nested(text, _TEMPLATE)
    text = _strip_nested(text, _TABLE)
    cut = _TRAILING.search(text)
    if cut:
        text = text[: cut.start()]
    for _ in range(10):  # links nest inside file captions: resolve the innermost first
        new = _LINK.sub(_link_label, text)
        if new == text:
            break
        text = new
    text = _EXTERNAL.sub(lambda m: m.group(1), text)
    text = _BARE_URL.sub("", text)
    text = _QUOTES.sub("", text)
    text = _TAG.sub("", text)
    text = html.unescape(text)
    text = _HEADING.sub(lambda m: m.group(2), text)
    text = _LIST.sub("", text)
    text = "\n".join(_SPACES.sub(" ", line).strip() for line in text.splitlines())
    text = _BLANKS.sub("\n\n", text)
    return text.strip()


def articles(xml_bytes: bytes, min_chars: int = 200) -> list[Article]:
    """The cleaned articles of a MediaWiki XML export, in file order (shorter than `min_chars` dropped)."""
    out: list[Article] = []
    for _, elem in ET.iterparse(io.BytesIO(xml_bytes), events=("end",)):
        if not elem.tag.endswith("}page") and elem.tag != "page":
            continue
        fields = {child.tag.rsplit("}", 1)[-1]: child for child in elem.iter()}
        ns = fields.get("ns")
        text = fields.get("text")
        if ns is not None and ns.text == "0" and "redirect" not in fields and text is not None and text.text:
            body = clean_wikitext(text.text)
            if len(body) >= min_chars:
                out.append(Article(fields["title"].text or "", body))
        elem.clear()
    return out


def corpus_text(items: list[Article]) -> str:
    """All articles as one text: title line, blank line, body; articles separated by a blank line."""
    return "\n\n".join(f"{a.title}\n\n{a.text}" for a in items) + "\n"
