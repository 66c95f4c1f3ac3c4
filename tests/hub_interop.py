#!/usr/bin/env python3
"""hub_interop: the Python package huggingface_hub against the cache moeserve writes (test_hub.c).

  hub_interop.py read REPO SNAPSHOT FILE...   huggingface_hub, offline, finds SNAPSHOT as REPO's
                                              main revision and each FILE in it, and its cache
                                              scanner sees no fault in the layout
  hub_interop.py write REPO FILE...           huggingface_hub downloads each FILE of REPO's main
                                              revision from $HF_ENDPOINT into the cache

Exits 0 when every check holds, else prints what failed and exits 1."""
import hashlib
import os
import sys

import huggingface_hub as hh


def fail(msg):
    print("hub_interop: " + msg)
    sys.exit(1)


def read(repo, snapshot, files):
    got = hh.snapshot_download(repo, local_files_only=True)
    if os.path.realpath(got) != os.path.realpath(snapshot):
        fail(f"snapshot_download(local_files_only=True) found {got}, expected {snapshot}")
    for f in files:
        p = hh.try_to_load_from_cache(repo, f)
        if not isinstance(p, str) or os.path.realpath(p) != os.path.realpath(os.path.join(snapshot, f)):
            fail(f"try_to_load_from_cache({repo!r}, {f!r}) = {p!r}")
        blob = os.path.basename(os.readlink(p))
        data = open(p, "rb").read()
        if len(blob) == 64 and hashlib.sha256(data).hexdigest() != blob:
            fail(f"{f}: the blob {blob} does not hold bytes of that SHA-256")
    info = hh.scan_cache_dir()
    if info.warnings:
        fail("scan_cache_dir: " + "; ".join(str(w) for w in info.warnings))
    repos = [r for r in info.repos if r.repo_id == repo]
    if len(repos) != 1:
        fail(f"scan_cache_dir does not list {repo}")
    revs = list(repos[0].revisions)
    if len(revs) != 1 or "main" not in revs[0].refs or revs[0].commit_hash != os.path.basename(snapshot.rstrip("/")):
        fail(f"scan_cache_dir: revisions {[(r.commit_hash, sorted(r.refs)) for r in revs]}")
    names = sorted(f.file_name for f in revs[0].files)
    if names != sorted(os.path.basename(f) for f in os.listdir(snapshot)):
        fail(f"scan_cache_dir: files {names}")


def write(repo, files):
    for f in files:
        hh.hf_hub_download(repo, f, revision="main")


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "read":
        read(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif len(sys.argv) >= 3 and sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3:])
    else:
        fail(__doc__)
    print("hub_interop: ok")
