"""Open a page in headless Chromium: what the page logged, which images decoded, and a screenshot.

Two independent channels catch a broken page: a probe script, injected at the very top of a copy
of the page (and allowed by adding its hash to the page's Content-Security-Policy, which allows
nothing else), records every error event, CSP violation and console.error/warn, waits for every
image's `decode()` promise, clicks a sortable header once, and writes what it saw as JSON into the
DOM, which `--dump-dom` prints; and Chromium's own log (`--enable-logging=stderr`) prints every
console message as an `INFO:CONSOLE` line, including ones raised before the probe could run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from alibi.html.render import script_hash

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
NO_CHROMIUM = ("headless Chromium is not installed (Debian: apt-get install -y chromium; or set ALIBI_CHROMIUM "
               "to its path); the browser check needs a real browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
         "--enable-logging=stderr", "--v=0"]

PROBE = """(function () {
  var errors = [];
  window.addEventListener("error", function (e) {
    errors.push(e.message ? "error: " + e.message : "failed to load: " + (e.target && (e.target.currentSrc || e.target.src || e.target.tagName)));
  }, true);
  window.addEventListener("securitypolicyviolation", function (e) { errors.push("csp: " + e.violatedDirective + " " + e.blockedURI); });
  ["error", "warn"].forEach(function (level) {
    var original = console[level];
    console[level] = function () { errors.push(level + ": " + Array.prototype.join.call(arguments, " ")); original.apply(console, arguments); };
  });
  window.addEventListener("load", function () {
    // By the load event every image has loaded or failed; naturalWidth > 0 means its data decoded as an image.
    var images = Array.prototype.slice.call(document.images);
    var decoded = images.filter(function (img) { return img.complete && img.naturalWidth > 0 && img.naturalHeight > 0; });
    var sort = null, table = document.querySelector("table.sortable");
    if (table) {
      var th = table.tHead.rows[0].cells[0];
      th.click();
      sort = {aria: th.getAttribute("aria-sort"),
              all: Array.prototype.map.call(table.tBodies[0].rows, function (r) { return r.cells[0].textContent.trim(); })};
    }
    var out = document.createElement("pre");
    out.id = "alibi-probe";
    out.textContent = JSON.stringify({images: images.length, decoded: decoded.length, errors: errors, sort: sort});
    document.body.appendChild(out);
  });
})();"""


def chromium() -> str | None:
    """The Chromium binary: $ALIBI_CHROMIUM, else the first of the usual names on PATH."""
    forced = os.environ.get("ALIBI_CHROMIUM")
    if forced:
        return forced if Path(forced).is_file() else None
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


def _run(browser: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                              timeout=timeout, check=False)


def with_probe(html: str) -> str:
    """The page with the probe first in <head> and its hash added to the page's script-src (and nothing else)."""
    head = html.index("<head>") + len("<head>")
    probed = html[:head] + f"\n<script>{PROBE}</script>" + html[head:]
    csp, n = re.subn(r"(script-src )", lambda m: m.group(1) + script_hash(PROBE) + " ", probed, count=1)
    if n != 1:
        raise AssertionError("the page has no script-src directive to extend")
    return csp


def console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def probe(browser: str, page: Path) -> tuple[dict, list[str]]:
    """(what the probe saw, Chromium's console lines) for `page`, loaded from disk."""
    probed = page.with_name(page.stem + ".probe.html")
    probed.write_text(with_probe(page.read_text(encoding="utf-8")), encoding="utf-8")
    done = _run(browser, "--virtual-time-budget=2000", "--dump-dom", probed.as_uri())
    found = re.search(r'<pre id="alibi-probe">(.*?)</pre>', done.stdout, re.DOTALL)
    if found is None:
        raise AssertionError(f"the probe wrote no result (exit {done.returncode}); Chromium said: {done.stderr[-2000:]}")
    text = found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    return json.loads(text), console_lines(done.stderr)


def screenshot(browser: str, page: Path, png: Path, *, width: int = 1280, height: int = 2400) -> list[str]:
    """Write a screenshot of `page` (unmodified) to `png`; returns Chromium's console lines."""
    done = _run(browser, f"--window-size={width},{height}", f"--screenshot={png}", page.as_uri())
    if not png.is_file():
        raise AssertionError(f"Chromium wrote no screenshot (exit {done.returncode}): {done.stderr[-2000:]}")
    return console_lines(done.stderr)
