#!/usr/bin/env bash
# build_corpus.sh -- English prose corpus for the built-in model, from Debian documentation.
#
# Dev-time tool (not run by CI). Needs: apt-get (Debian bookworm, main), dpkg-deb, man, col,
# python3 (standard library only), xz. Run as root (apt-get download into a temp dir; nothing is
# installed system-wide). About 560 MB of .deb files are downloaded; ~10 min on 2 cores.
#
#   tools/build_corpus.sh [OUT_DIR]          (default OUT_DIR: /work/corpus)
#
# Environment: XZ_LIMIT_MB (default 25) -- train.txt.xz is kept under this size by dropping
#   whole training documents (sha1-of-text order) from train.txt when needed; KEEP_DEBS=DIR keeps
#   the downloaded .deb files there (and reuses any already there) instead of a temp dir.
#
# Writes:
#   OUT_DIR/train.txt        training text (documents separated by a line "<|endoftext|>")
#   OUT_DIR/heldout.txt      ~200 KB of whole held-out documents (not in train.txt)
#   OUT_DIR/train.txt.xz     xz -9 of train.txt: the training input carried to the GPU machine
#                            (also copied to corpus/train.txt.xz in the repository, git-ignored)
#   OUT_DIR/docs.tsv         every kept document: split, package, path, bytes
#   tests/data/heldout.txt   ~100 KB excerpt of held-out documents from permissively licensed
#                            packages (committed; perplexity tests)
#   tools/corpus-manifest.txt  packages, versions and .deb sha256 used, output sizes/hashes, and
#                            the provenance of tests/data/heldout.txt (committed)
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-/work/corpus}
XZ_LIMIT_MB=${XZ_LIMIT_MB:-25}

# Debian main documentation with a lot of English prose. Each package's files are picked and
# converted by the rules in tools/corpus_convert.py (RULES); keep the two lists in step.
PKGS=(
  debian-reference-en debian-handbook debian-faq developers-reference debian-policy maint-guide
  debmake-doc debian-history harden-doc installation-guide-amd64 debian-edu-doc-en
  python3.11-doc perl-doc git-doc postgresql-doc-15 linux-doc-6.1 bash-doc apache2-doc
  python-django-doc gimp-help-en gnome-user-docs sqlite3-doc rust-doc nodejs-doc sphinx-doc
  gnuplot-doc libreoffice-help-en-us jargon-text exim4-doc-html bind9-doc cmake-doc postfix-doc
  gnucash-docs lilypond-doc-html zsh-doc octave-doc texinfo groff gettext wget screen
  python-sqlalchemy-doc python-pandas-doc racket-doc kicad-doc-en grass-doc erlang-doc systemd
  gnome-devel-docs maxima-doc python-flask-doc python-celery-doc python-werkzeug-doc
  python-jinja2-doc python-scrapy-doc
  gnu-standards autoconf-doc guile-3.0-doc coreutils grep sed tar findutils diffutils manpages
  dict-foldoc
)

if [ -n "${KEEP_DEBS:-}" ]; then
  DEBS=$KEEP_DEBS; mkdir -p "$DEBS"; TMP=$(mktemp -d)
else
  TMP=$(mktemp -d); DEBS=$TMP/debs; mkdir -p "$DEBS"
fi
trap 'rm -rf "$TMP"' EXIT

if ! ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1; then
  apt-get update -qq
fi

echo "== downloading ${#PKGS[@]} packages" >&2
missing=()
for p in "${PKGS[@]}"; do
  v=$(apt-cache policy "$p" | awk '/Candidate:/{print $2}')
  [ -n "$v" ] && [ "$v" != "(none)" ] || { echo "package $p not available" >&2; exit 1; }
  f=$(ls "$DEBS/${p}_"*.deb 2>/dev/null | head -1 || true)
  if [ -z "$f" ] || [ "$(dpkg-deb -f "$f" Version)" != "$v" ]; then
    rm -f "$DEBS/${p}_"*.deb
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  (cd "$DEBS" && apt-get download -q "${missing[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2 || true)
fi

echo "== extracting" >&2
X=$TMP/x
MAN=$TMP/manifest.pkgs
: > "$MAN"
for p in "${PKGS[@]}"; do
  f=$(ls "$DEBS/${p}_"*.deb | head -1)
  mkdir -p "$X/$p"
  dpkg-deb -x "$f" "$X/$p"
  printf '%-26s %-34s %s  %s\n' "$p" "$(dpkg-deb -f "$f" Version)" \
    "$(sha256sum "$f" | cut -c1-64)" "$(basename "$f")" >> "$MAN"
done

echo "== converting" >&2
mkdir -p "$OUT"
python3 "$REPO/tools/corpus_convert.py" --root "$X" --out "$OUT" \
  --packages "$(IFS=,; echo "${PKGS[*]}")" 2> "$TMP/convert.log"
cat "$TMP/convert.log" >&2

echo "== compressing (xz -9, limit ${XZ_LIMIT_MB} MB)" >&2
frac=1.0
while :; do
  xz -9 -T1 -k -c "$OUT/train.txt" > "$OUT/train.txt.xz"
  size=$(stat -c %s "$OUT/train.txt.xz")
  if [ "$size" -le $((XZ_LIMIT_MB * 1000 * 1000)) ]; then break; fi
  # too big: keep a deterministic subset of the training documents and try again
  frac=$(python3 - "$OUT/train.txt" "$size" "$XZ_LIMIT_MB" <<'EOF'
import hashlib, sys
path, size, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
keep = limit * 1e6 / size * 0.97
docs = open(path, encoding="utf-8").read().split("\n<|endoftext|>\n")
docs = [d.strip("\n") for d in docs]
kept = [d for d in docs
        if int(hashlib.sha1(d.encode()).hexdigest()[:8], 16) < keep * 2**32]
with open(path, "w", encoding="utf-8") as f:
    f.write("\n<|endoftext|>\n".join(kept) + "\n")
print("%.4f" % keep)
EOF
)
  echo "   xz was $size bytes: kept a $frac fraction of the training documents" >&2
done

# the GPU run reads corpus/train.txt.xz in the repository (ignored by git, carried to the GPU)
mkdir -p "$REPO/corpus"
cp "$OUT/train.txt.xz" "$REPO/corpus/train.txt.xz"

mkdir -p "$REPO/tests/data"
cp "$OUT/heldout-test.txt" "$REPO/tests/data/heldout.txt"

mb() { python3 -c "import os,sys; print('%.2f MB' % (os.path.getsize(sys.argv[1]) / 1e6))" "$1"; }
{
  echo "# tools/corpus-manifest.txt -- written by tools/build_corpus.sh; do not edit by hand."
  echo "# Corpus for the built-in model: English prose converted from these Debian bookworm (main)"
  echo "# documentation packages (apt-get download + dpkg-deb -x; conversion rules in"
  echo "# tools/corpus_convert.py). Columns: package, version, sha256 of the .deb, file."
  echo "# built: $(date -u +%Y-%m-%d)"
  echo
  cat "$MAN"
  echo
  echo "# outputs (not committed except tests/data/heldout.txt)"
  echo "train.txt        $(mb "$OUT/train.txt")  sha256 $(sha256sum "$OUT/train.txt" | cut -c1-64)"
  echo "heldout.txt      $(mb "$OUT/heldout.txt")  sha256 $(sha256sum "$OUT/heldout.txt" | cut -c1-64)"
  echo "train.txt.xz     $(mb "$OUT/train.txt.xz")  sha256 $(sha256sum "$OUT/train.txt.xz" | cut -c1-64)"
  echo "train fraction kept for the xz limit: $frac"
  echo
  echo "# per-package documents and MB after conversion (before any subsampling)"
  sed -n '/^package/,$p' "$TMP/convert.log" | sed 's/^/#   /'
  echo
  echo "# tests/data/heldout.txt ($(mb "$REPO/tests/data/heldout.txt"), sha256"
  echo "#   $(sha256sum "$REPO/tests/data/heldout.txt" | cut -c1-64)): paragraphs of these held-out"
  echo "#   documents (package <TAB> path inside the package), none of them in train.txt. Licences"
  echo "#   (debian/copyright of each package): python3.11-doc PSF-2.0; postgresql-doc-15"
  echo "#   PostgreSQL (BSD-style); sqlite3-doc public domain; python-django-doc BSD-3-Clause;"
  echo "#   rust-doc MIT or Apache-2.0."
  sed 's/^/heldout-test    /' "$OUT/heldout-test.sources"
} > "$REPO/tools/corpus-manifest.txt"

echo "== done: $(mb "$OUT/train.txt") train.txt, $(mb "$OUT/heldout.txt") heldout.txt," \
     "$(mb "$OUT/train.txt.xz") train.txt.xz; manifest tools/corpus-manifest.txt" >&2
