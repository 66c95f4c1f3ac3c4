#!/usr/bin/env python3
"""corpus_convert.py -- turn extracted Debian documentation packages into plain English prose.

Dev-time tool, driven by tools/build_corpus.sh (read that first). Standard library only.

Input:  --root DIR   one sub-directory per package, named after the package, holding what
                     `dpkg-deb -x PKG.deb DIR/PKG` extracted.
Output: --out DIR    train.txt, heldout.txt, heldout-test.txt (the excerpt for tests/data),
                     docs.tsv (one line per kept document: split, package, path, bytes).

Format of train.txt / heldout.txt: documents separated by a line holding exactly
`<|endoftext|>`; paragraphs inside a document separated by one blank line; each paragraph is one
line of text (whitespace collapsed, typographic punctuation folded to ASCII). The tokenizer and
training scripts split on the separator line and never feed it to the BPE trainer as text.

What is kept: the English prose of each page. Per-package rules (RULES below) pick the English
files (for multi-language packages only en / en-US / C), HTML pages lose their navigation,
sidebars, code blocks (<pre>, highlight divs, synopses), tables of contents and scripts; POD
loses verbatim blocks; info/man pages lose indented examples by the prose filter. Every
paragraph must look like English prose (letters ratio, English function-word ratio, few
non-ASCII characters); paragraphs of 8+ words are de-duplicated across the whole corpus (first
occurrence in package/path order wins), and documents with under MIN_DOC_CHARS of prose are
dropped.

Held-out split (whole documents, never also in train), in order of sha1("package/path"):
first documents from TEST_PACKAGES (permissive licences) until ~--test-kb KB, then documents
from any package until ~--heldout-kb KB in all. heldout-test.txt is ~--test-kb KB of whole
paragraphs of the TEST_PACKAGES held-out documents (it goes to tests/data/heldout.txt);
heldout-test.sources names the documents it came from.
"""

import argparse
import gzip
import hashlib
import html
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from multiprocessing import Pool

DOC_SEP = "<|endoftext|>"
MIN_DOC_CHARS = 300
INFO_CHUNK = 16000  # info / dictionary sources are cut into documents of about this size

# package -> list of (format, include regex on the path relative to the package dir, exclude regex)
SPHINX_EXCL = r"(/_sources/|/_modules/|/_static/|/genindex|/py-modindex|/search\.html$|/searchindex)"
RULES = {
    "debian-reference-en": [("html", r"usr/share/debian-reference/.*\.en\.html$", None)],
    "debian-handbook": [("html", r"html/en-US/.*\.html$", None)],
    "debian-faq": [("html", r"FAQ/.*\.html$", None)],
    "developers-reference": [("html", r"usr/share/developers-reference/.*\.html$", None)],
    "debian-policy": [("html", r"usr/share/doc/debian-policy/.*\.html$", r"README\.html$")],
    "maint-guide": [("html", r"html/.*\.en\.html$", None)],
    "debmake-doc": [("html", r"html/.*\.en\.html$", None)],
    "debian-history": [("html", r"docs/.*\.en\.html$", None)],
    "harden-doc": [("html", r"html/en-US/.*\.html$", None)],
    "installation-guide-amd64": [("html", r"installation-guide-amd64/en/.*\.html$", None)],
    "python3.11-doc": [("html", r"html/.*\.html$", SPHINX_EXCL + r"|/whatsnew/changelog\.html$")],
    "perl-doc": [("pod", r"\.pod$", None)],
    "git-doc": [("html", r"usr/share/doc/git-doc/.*\.html$", r"RelNotes")],
    "postgresql-doc-15": [("html", r"html/.*\.html$", None)],
    "linux-doc-6.1": [("html", r"html/.*\.html$", SPHINX_EXCL + r"|/translations/")],
    "bash-doc": [("html", r"bashref\.html$", None)],
    "apache2-doc": [("html", r"manual/.*\.html\.en$", None)],
    "python-django-doc": [("html", r"html/.*\.html$", SPHINX_EXCL)],
    "gimp-help-en": [("html", r"help/en/.*\.html$", None)],
    "gnome-user-docs": [("mallard", r"help/C/.*\.page$", None)],
    "sqlite3-doc": [("html", r"usr/share/doc/sqlite3/.*\.html$", None)],
    "rust-doc": [("html", r"html/(book|reference|nomicon|rust-by-example|edition-guide|rustc|"
                          r"rustdoc|embedded-book)/.*\.html$",
                  r"(print|toc|404|SUMMARY)\.html$|/(first-edition|second-edition)/")],
    "nodejs-doc": [("html", r"api/.*\.html$", r"/all\.html$")],
    "sphinx-doc": [("html", r"html/.*\.html$", SPHINX_EXCL)],
    "gnuplot-doc": [("html", r"htmldocs/.*\.html$", None)],
    "libreoffice-help-en-us": [("html", r"help/en-US/text/.*\.html$", None)],
    "jargon-text": [("jargon", r"jargon\.txt\.gz$", None)],
    "exim4-doc-html": [("html", r"spec_html/.*\.html$", None)],
    "bind9-doc": [("html", r"arm/.*\.html$", SPHINX_EXCL)],
    "cmake-doc": [("html", r"html/.*\.html$", SPHINX_EXCL)],
    "postfix-doc": [("html", r"postfix/html/.*\.html$", None)],
    "debian-edu-doc-en": [("html", r"debian-edu-bookworm-manual\.html$", None)],
    "gnucash-docs": [("html", r"gnucash-(guide|help)-en/.*\.html$", None)],
    "lilypond-doc-html": [("html", r"Documentation/(learning|notation|usage|extending|essay|"
                                   r"music-glossary|web|contributor)/.*\.html$", None)],
    "python-sqlalchemy-doc": [("html", r"html/.*\.html$", SPHINX_EXCL + r"|/changelog/")],
    "python-pandas-doc": [("html", r"html/(user_guide|getting_started|development|whatsnew)/.*\.html$",
                           SPHINX_EXCL)],
    "racket-doc": [("html", r"racket/(guide|reference|scribble|more|quick|continue|"
                            r"style|teachpack|htdp-langs)/.*\.html$", None)],
    "kicad-doc-en": [("html", r"help/en/.*\.html$", None)],
    "grass-doc": [("html", r"grass-doc/html/.*\.html$", None)],
    "erlang-doc": [("html", r"doc/html/.*\.html$", r"/java/|/wx-")],
    "systemd": [("man", r"usr/share/man/man[1-8]/.*\.gz$", None)],
    "gnome-devel-docs": [("mallard", r"help/C/.*\.page$", None)],
    "maxima-doc": [("html", r"maxima-doc/html/.*\.html$", None)],
    "python-flask-doc": [("html", r"html/.*\.html$", SPHINX_EXCL)],
    "python-celery-doc": [("html", r"html/.*\.html$", SPHINX_EXCL)],
    "python-werkzeug-doc": [("html", r"html/.*\.html$", SPHINX_EXCL)],
    "python-jinja2-doc": [("html", r"html/.*\.html$", SPHINX_EXCL)],
    "python-scrapy-doc": [("html", r"html/.*\.html$", SPHINX_EXCL)],
    "zsh-doc": [("info", r"usr/share/info/.*\.info(-\d+)?\.gz$", None)],
    "octave-doc": [("info", r"usr/share/info/octave\.info(-\d+)?\.gz$", None)],
    "texinfo": [("info", r"usr/share/info/.*\.info(-\d+)?\.gz$", None)],
    "groff": [("info", r"usr/share/info/.*\.info(-\d+)?\.gz$", None)],
    "gettext": [("info", r"usr/share/info/.*\.info(-\d+)?\.gz$", None)],
    "wget": [("info", r"usr/share/info/.*\.info(-\d+)?\.gz$", None)],
    "screen": [("info", r"usr/share/info/.*\.info(-\d+)?\.gz$", None)],
    "gnu-standards": [("info", r"usr/share/info/.*\.info(-\d+)?\.gz$", None)],
    "autoconf-doc": [("info", r"usr/share/info/.*\.info(-\d+)?\.gz$", None)],
    "guile-3.0-doc": [("info", r"usr/share/info/.*\.info(-\d+)?\.gz$", None)],
    "coreutils": [("info", r"usr/share/info/.*\.info(-\d+)?\.gz$", None)],
    "grep": [("info", r"usr/share/info/.*\.info(-\d+)?\.gz$", None)],
    "sed": [("info", r"usr/share/info/.*\.info(-\d+)?\.gz$", None)],
    "tar": [("info", r"usr/share/info/.*\.info(-\d+)?\.gz$", None)],
    "findutils": [("info", r"usr/share/info/.*\.info(-\d+)?\.gz$", None)],
    "diffutils": [("info", r"usr/share/info/.*\.info(-\d+)?\.gz$", None)],
    "manpages": [("man", r"usr/share/man/man[1-8]/.*\.gz$", None)],
    "dict-foldoc": [("foldoc", r"foldoc\.dict\.dz$", None)],
}

# held-out documents from these packages may be copied into the repository (tests/data):
# permissive licences (PSF-2.0, PostgreSQL, public domain, BSD-3, MIT/Apache-2.0).
TEST_PACKAGES = ["python3.11-doc", "postgresql-doc-15", "sqlite3-doc", "python-django-doc",
                 "rust-doc"]

# --------------------------------------------------------------------------- text normalisation

_FOLD = {
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u2033": '"', "\u00ab": '"', "\u00bb": '"',
    "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "--", "\u2015": "--",
    "\u2212": "-", "\u2026": "...", "\u00a0": " ", "\u2009": " ", "\u200a": " ", "\u2002": " ",
    "\u2003": " ", "\u202f": " ", "\u200b": "", "\u00ad": "", "\ufeff": "", "\u00b6": "",
    "\u2192": "->", "\u2190": "<-", "\u00d7": "x", "\u2022": "", "\u25aa": "", "\u00b7": "",
}
_FOLD_RE = re.compile("|".join(map(re.escape, _FOLD)))
_WS_RE = re.compile(r"\s+")


def clean(s):
    s = _FOLD_RE.sub(lambda m: _FOLD[m.group(0)], s)
    return _WS_RE.sub(" ", s).strip()


STOP = set("""a an the of to in on at by for from with as is are was were be been being it its
this that these those and or but not no if then than so such which who whom whose what when
where why how all any each some more most other can could may might must shall should will would
do does did has have had you your we our they their there here he she his her i me my one only
also into over under about after before between through while because both either neither
very just""".split())
_WORD_RE = re.compile(r"[A-Za-z]+(?:'[a-z]+)?")


def is_prose(p, heading=False):
    """Heuristic English-prose test for one paragraph (already cleaned)."""
    n = len(p)
    if n < (2 if heading else 8):
        return False
    nonascii = sum(1 for c in p if ord(c) > 126)
    if nonascii > 0.03 * n:
        return False
    letters = sum(1 for c in p if c.isalpha() or c == " ")
    if letters < 0.78 * n:
        return False
    words = _WORD_RE.findall(p)
    if heading:
        return 1 <= len(words) <= 16 and len(p) < 120
    if len(words) < 5:
        return False
    stop = sum(1 for w in words if w.lower() in STOP)
    if stop < 0.12 * len(words):
        return False
    # code-ish paragraphs that slipped through
    if p.count("(") > 6 and p.count(";") > 3:
        return False
    return True


# --------------------------------------------------------------------------- HTML / Mallard

BLOCK = set("""p div li dd dt h1 h2 h3 h4 h5 h6 blockquote td th tr br section article caption
figcaption ul ol dl table title body main aside center hr
item note terms tr page steps list listing example quote""".split())
HEADINGS = {"h1", "h2", "h3"}
SKIP_TAGS = {"script", "style", "head", "pre", "nav", "header", "footer", "noscript", "svg", "math",
             "button", "form", "select", "textarea", "iframe", "object",
             # mallard (inline <code> is kept; block code lands in its own paragraph and fails
             # the prose test)
             "info", "screen", "media", "synopsis", "links", "credit"}
SKIP_CLASS = re.compile(
    r"(^|\s)(sphinxsidebar\w*|related|docnav|footer|header|navheader|navfooter|highlight[\w-]*|headerlink|"
    r"toc|toctree-wrapper|contents|topic|synopsis|cmdsynopsis|funcsynopsis|programlisting|screen|"
    r"literallayout|literal-block|doctest|sig|sig-object|sidebar|breadcrumbs?|menu\w*|"
    r"mobile-nav|navigation|nav-\w+|copyright|docinfo|example-contents|refsynopsisdiv|"
    r"legalnotice|revhistory|authorgroup|indexterm|index|footnotes?|admonition-title|"
    r"rustdoc|playground|codehilite|sourceCode|xref-list|api_stability|api_metadata|"
    r"inlinemediaobject|mediaobject|figure|titlepage|version-switcher)(\s|$)")
SKIP_ID = re.compile(r"^(sidebar|menu-bar|toc|column2|nav|navigation|header|footer|search|"
                     r"searchbox|breadcrumbs|gtoc|apitoc)$")
VOID = {"br", "img", "hr", "meta", "link", "input", "wbr", "area", "base", "col", "embed",
        "param", "source", "track"}


class HTMLProse(HTMLParser):
    def __init__(self, mallard=False):
        super().__init__(convert_charrefs=True)
        self.mallard = mallard
        self.skip = None  # (tag, depth) of the element being skipped
        self.buf = []
        self.paras = []  # (text, is_heading)
        self.heading = False

    def flush(self):
        if self.buf:
            t = clean("".join(self.buf))
            if t:
                self.paras.append((t, self.heading))
            self.buf = []

    def handle_starttag(self, tag, attrs):
        if self.skip is not None:
            if tag == self.skip[0] and tag not in VOID:
                self.skip = (tag, self.skip[1] + 1)
            return
        a = dict(attrs)
        cls = a.get("class") or ""
        if tag in SKIP_TAGS or \
                (cls and SKIP_CLASS.search(cls)) or SKIP_ID.match(a.get("id") or "") or \
                a.get("role") == "navigation":
            if tag in VOID:
                return
            self.flush()
            self.skip = (tag, 1)
            return
        if tag in BLOCK:
            self.flush()
            self.heading = tag in HEADINGS or (self.mallard and tag == "title")

    def handle_startendtag(self, tag, attrs):
        if self.skip is None and tag in BLOCK:
            self.flush()

    def handle_endtag(self, tag):
        if self.skip is not None:
            if tag == self.skip[0]:
                d = self.skip[1] - 1
                self.skip = None if d == 0 else (tag, d)
            return
        if tag in BLOCK:
            self.flush()
            self.heading = False

    def handle_data(self, data):
        if self.skip is None:
            self.buf.append(data)


def read_text(path):
    with open(path, "rb") as f:
        raw = f.read()
    if path.endswith(".gz") or raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def conv_html(path, mallard=False):
    p = HTMLProse(mallard=mallard)
    try:
        p.feed(read_text(path))
        p.close()
    except Exception:  # malformed markup: keep what was parsed
        pass
    p.flush()
    return [p.paras]


# --------------------------------------------------------------------------- POD

_POD_CODE = re.compile(r"([A-Z])(<+)\s*(.*?)\s*(>+)", re.S)


def pod_inline(s):
    # innermost-first removal of formatting codes; multi-bracket forms C<< x >> too
    for _ in range(8):
        m2 = re.search(r"([BCEFILSXZ])(<{2,})\s+(.*?)\s+(>{2,})", s, re.S)
        if m2 and len(m2.group(2)) == len(m2.group(4)):
            s = s[:m2.start()] + pod_code(m2.group(1), m2.group(3)) + s[m2.end():]
            continue
        m = re.search(r"([BCEFILSXZ])<([^<>]*)>", s)
        if not m:
            break
        s = s[:m.start()] + pod_code(m.group(1), m.group(2)) + s[m.end():]
    return s


_POD_E = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/", "quot": '"', "amp": "&"}


def pod_code(c, body):
    if c in "XZ":
        return ""
    if c == "E":
        if body in _POD_E:
            return _POD_E[body]
        try:
            return chr(int(body, 0)) if body[:1].isdigit() else html.unescape("&%s;" % body)
        except ValueError:
            return ""
    if c == "L":
        if "|" in body:
            return body.split("|", 1)[0]
        body = body.strip('"')
        return body.split("/", 1)[-1].strip('"') if "/" in body and "://" not in body else body
    return body


def conv_pod(path):
    text = read_text(path)
    paras = []
    in_pod = True
    skip_block = 0
    for block in re.split(r"\n[ \t]*\n", text):
        if not block.strip():
            continue
        if block.startswith("="):
            cmd, _, rest = block.partition(" ")
            cmd = cmd.strip().split("\n")[0]
            rest = rest.strip()
            if cmd == "=cut":
                in_pod = False
            elif cmd in ("=pod",) or cmd.startswith("=head") or cmd == "=item":
                in_pod = True
            if cmd == "=begin":
                skip_block += 1
            elif cmd == "=end":
                skip_block = max(0, skip_block - 1)
            elif cmd == "=for":
                pass
            elif skip_block == 0 and cmd.startswith("=head") and rest:
                t = clean(pod_inline(rest))
                if t not in ("NAME", "DESCRIPTION", "SYNOPSIS", "SEE ALSO", "AUTHOR", "AUTHORS"):
                    paras.append((t, True))
            elif skip_block == 0 and cmd == "=item" and rest and rest not in ("*", "-"):
                paras.append((clean(pod_inline(rest.lstrip("*- "))), False))
            continue
        if not in_pod or skip_block or block[:1] in (" ", "\t"):
            continue  # code, or a verbatim paragraph
        paras.append((clean(pod_inline(block)), False))
    return [paras]


# --------------------------------------------------------------------------- info

_INFO_NOTE = re.compile(r"\*[Nn]ote\s+([^:]*?)::|\*[Nn]ote\s+([^:]*?):\s*\([^)]*\)[^.,]*[.,]?", re.S)
_UNDERLINE = re.compile(r"^[*=\-.]{3,}\s*$")


def info_paragraphs(node):
    lines = node.split("\n")
    out = []
    cur = []
    in_menu = False

    def end():
        if cur:
            t = "\n".join(cur)
            t = _INFO_NOTE.sub(lambda m: m.group(1) or m.group(2) or "", t)
            out.append((clean(t), False))
            cur.clear()
    for i, ln in enumerate(lines):
        if ln.startswith("File:") and "Node:" in ln:
            continue
        if ln.startswith("* Menu:"):
            end()
            in_menu = True
            continue
        if in_menu:
            if not ln.strip() or ln.startswith("* ") or ln.startswith(" "):
                continue
            in_menu = False
        if _UNDERLINE.match(ln):
            if cur:  # the line before was a heading
                h = cur.pop()
                end()
                out.append((clean(h), True))
            continue
        if not ln.strip():
            end()
            continue
        cur.append(ln)
    end()
    return out


def conv_info(path):
    text = read_text(path)
    nodes = [n for n in text.split("\x1f") if "Node:" in n[:300]]
    docs, cur, size = [], [], 0
    for n in nodes:
        ps = info_paragraphs(n)
        cur.extend(ps)
        size += sum(len(p) for p, _ in ps)
        if size >= INFO_CHUNK:
            docs.append(cur)
            cur, size = [], 0
    if cur:
        docs.append(cur)
    return docs


# --------------------------------------------------------------------------- man

def conv_man(path):
    env = dict(os.environ, MANWIDTH="4000", MAN_KEEP_FORMATTING="0", LANG="C.UTF-8",
               LC_ALL="C.UTF-8", MANROFFSEQ="", GROFF_NO_SGR="1")
    try:
        r = subprocess.run(["man", "--nh", "--nj", "-l", path], env=env, capture_output=True,
                           timeout=60)
        txt = subprocess.run(["col", "-bx"], input=r.stdout, capture_output=True,
                             timeout=60).stdout.decode("utf-8", "replace")
    except Exception:
        return [[]]
    paras = []
    for block in re.split(r"\n\s*\n", txt):
        lines = [ln for ln in block.split("\n") if ln.strip()]
        # leading (sub)section headings: a short line indented less than the text below it
        while lines:
            first = lines[0]
            ind = len(first) - len(first.lstrip())
            if len(lines) > 1 and ind >= len(lines[1]) - len(lines[1].lstrip()):
                break
            if len(first.split()) > 6:
                break
            if first.strip() != first.strip().upper():
                paras.append((clean(first), True))
            lines.pop(0)
        if lines:
            paras.append((clean(" ".join(lines)), False))
    return [paras[1:-1] if len(paras) > 2 else paras]


# --------------------------------------------------------------------------- FOLDOC

def conv_foldoc(path):
    text = read_text(path)
    docs, cur, size = [], [], 0
    for block in re.split(r"\n\s*\n", text):
        if not block.startswith("   "):
            # headword block (the entry name, then its synonyms on further lines)
            hw = clean(block.split("\n")[0])
            if hw and not hw.startswith("00-"):
                cur.append((hw, True))
            continue
        t = block.strip()
        if re.fullmatch(r"\(\d{4}-\d\d-\d\d\)", t):
            continue
        t = re.sub(r"\{([^}]*)\}", lambda m: re.sub(r"\s*\(\S+://\S*\)", "", m.group(1)), t)
        t = re.sub(r"^<[^>]*>\s*", "", t)
        t = re.sub(r"\(?\b\w+://\S+", "", t)
        p = clean(t)
        cur.append((p, False))
        size += len(p)
        if size >= INFO_CHUNK:
            docs.append(cur)
            cur, size = [], 0
    if cur:
        docs.append(cur)
    return docs


def conv_jargon(path):
    """The Jargon File's plain-text edition: `:headword: n.` lines, indented paragraphs."""
    text = read_text(path)
    docs, cur, size = [], [], 0
    for block in re.split(r"\n\s*\n", text):
        t = block.strip()
        m = re.match(r":([^:]+):", t)
        if m and "\n" not in t:
            cur.append((clean(m.group(1)), True))
            continue
        t = re.sub(r"\{([^}]*)\}", r"\1", t)
        p = clean(t)
        cur.append((p, False))
        size += len(p)
        if size >= INFO_CHUNK:
            docs.append(cur)
            cur, size = [], 0
    if cur:
        docs.append(cur)
    return docs


CONVERTERS = {"jargon": conv_jargon, "html": conv_html, "mallard": lambda p: conv_html(p, mallard=True), "pod": conv_pod,
              "info": conv_info, "man": conv_man, "foldoc": conv_foldoc}


# --------------------------------------------------------------------------- driver

def list_files(root, pkg):
    out = []
    base = os.path.join(root, pkg)
    for fmt, inc, exc in RULES[pkg]:
        ri, rx = re.compile(inc), re.compile(exc) if exc else None
        for d, dirs, files in os.walk(base):
            dirs.sort()
            for f in sorted(files):
                full = os.path.join(d, f)
                rel = os.path.relpath(full, base)
                if os.path.islink(full) or not ri.search(rel) or (rx and rx.search(rel)):
                    continue
                out.append((pkg, rel, fmt, full))
    return out


def info_order(item):
    # guile.info.gz, guile.info-1.gz, guile.info-2.gz ... -> numeric order
    m = re.search(r"\.info(?:-(\d+))?\.gz$", item[1])
    return (item[0], re.sub(r"\.info(-\d+)?\.gz$", "", item[1]), int(m.group(1) or 0) if m else 0,
            item[1])


def work(item):
    pkg, rel, fmt, full = item
    docs = CONVERTERS[fmt](full)
    return [(pkg, rel if len(docs) == 1 else "%s#%d" % (rel, i), d) for i, d in enumerate(docs)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--packages", default=",".join(RULES), help="comma separated subset")
    ap.add_argument("--heldout-kb", type=int, default=200)
    ap.add_argument("--test-kb", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    args = ap.parse_args()

    items = []
    for pkg in args.packages.split(","):
        if not os.path.isdir(os.path.join(args.root, pkg)):
            sys.exit("missing extracted package %s under %s" % (pkg, args.root))
        items.extend(list_files(args.root, pkg))
    items.sort(key=info_order)
    print("converting %d files" % len(items), file=sys.stderr)

    seen = set()
    kept = []  # (pkg, rel, text)
    stats = {}
    with Pool(args.jobs) as pool:
        for res in pool.imap(work, items, chunksize=8):
            for pkg, rel, paras in res:
                out = []
                for t, head in paras:
                    if not is_prose(t, head):
                        continue
                    if not head and len(t.split()) >= 8:
                        h = hashlib.sha1(t.lower().encode()).digest()[:10]
                        if h in seen:
                            continue
                        seen.add(h)
                    out.append((t, head))
                # a heading survives only when prose follows it (drops empty sections, runs of
                # headings such as NAME / KEYWORDS / SYNOPSIS) and when it is not a repeat
                body_paras = []
                for j, (t, head) in enumerate(out):
                    if head and (j + 1 == len(out) or out[j + 1][1]):
                        continue
                    if body_paras and body_paras[-1] == t:
                        continue
                    body_paras.append(t)
                body = "\n\n".join(body_paras)
                if sum(len(t) for t, head in out if not head) < MIN_DOC_CHARS:
                    continue
                kept.append((pkg, rel, body))
                s = stats.setdefault(pkg, [0, 0])
                s[0] += 1
                s[1] += len(body.encode()) + 1

    # held-out split by hash of the document name: first whole documents from TEST_PACKAGES
    # until the test excerpt is covered, then documents from any package up to --heldout-kb
    def h32(pkg, rel):
        return int(hashlib.sha1(("%s/%s" % (pkg, rel)).encode()).hexdigest()[:8], 16)
    total = sum(len(b) for _, _, b in kept)
    order = sorted(range(len(kept)), key=lambda i: h32(kept[i][0], kept[i][1]))
    held, acc, tacc = set(), 0, 0
    for i in order:
        if tacc >= args.test_kb * 1000:
            break
        if kept[i][0] in TEST_PACKAGES and len(kept[i][2]) < 40000:
            held.add(i)
            tacc += len(kept[i][2].encode())
    acc = tacc
    for i in order:
        if acc >= args.heldout_kb * 1000:
            break
        if i not in held:
            held.add(i)
            acc += len(kept[i][2].encode())

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "train.txt"), "w") as ft, \
            open(os.path.join(args.out, "heldout.txt"), "w") as fh, \
            open(os.path.join(args.out, "docs.tsv"), "w") as fd:
        nt = nh = 0
        for i, (pkg, rel, body) in enumerate(kept):
            f = fh if i in held else ft
            if (i in held and nh) or (i not in held and nt):
                f.write("\n" + DOC_SEP + "\n")
            f.write(body + "\n")
            if i in held:
                nh += 1
            else:
                nt += 1
            fd.write("%s\t%s\t%s\t%d\n" % ("heldout" if i in held else "train", pkg, rel,
                                          len(body.encode())))
    # excerpt for the repository's perplexity tests: permissive-licence packages only, whole
    # paragraphs, documents in hash order
    test, tb, srcs = [], 0, []
    for i in order:
        pkg, rel, body = kept[i]
        if i not in held or pkg not in TEST_PACKAGES or tb >= args.test_kb * 1000:
            continue
        paras = []
        for p in body.split("\n\n"):
            if tb >= args.test_kb * 1000:
                break
            paras.append(p)
            tb += len(p.encode()) + 2
        test.append("\n\n".join(paras))
        srcs.append("%s\t%s" % (pkg, rel))
    with open(os.path.join(args.out, "heldout-test.txt"), "w") as f:
        f.write("\n\n".join(test) + "\n")
    with open(os.path.join(args.out, "heldout-test.sources"), "w") as f:
        f.write("\n".join(srcs) + "\n")

    print("%-26s %7s %10s" % ("package", "docs", "MB"), file=sys.stderr)
    for pkg in sorted(stats, key=lambda p: -stats[p][1]):
        print("%-26s %7d %10.2f" % (pkg, stats[pkg][0], stats[pkg][1] / 1e6), file=sys.stderr)
    print("total %d docs %.2f MB; held out %d docs %.1f KB; test excerpt %.1f KB from %d docs"
          % (len(kept), total / 1e6, len(held), acc / 1e3, tb / 1e3, len(test)), file=sys.stderr)


if __name__ == "__main__":
    main()
