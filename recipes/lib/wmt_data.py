"""Fetching and unpacking WMT data for the WMT recipes (recipes/lib/wmt.sh).

    python recipes/lib/wmt_data.py sha256 --checksums FILE NAME      # prints the checksum
    python recipes/lib/wmt_data.py probe --checksums FILE [--extra-bytes N] URL...  # fail early
    python recipes/lib/wmt_data.py extract ARCHIVE MEMBER=OUT...      # one pass over ARCHIVE

What it owns: looking a file's checksum up by base name in a checksums TSV (a sha256, or
``md5:HEX`` where only an md5 is published); checking, before
any download, that every URL is reachable and that the disk has room for it; pulling text
files out of ``.tgz`` / ``.tar`` / ``.gz`` archives in one pass (member names compared after
``os.path.normpath``, so ``./dev/x`` is ``dev/x``), converting WMT's ``.sgm``
test sets to plain text exactly as sacrebleu does; and pasting corpora together with a
line-count check. Every output is written to a temporary file and renamed into place.
"""
from __future__ import annotations

import argparse
import gzip
import io
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from typing import Dict, Iterator, List, Tuple


def fail(message: str) -> None:
    sys.exit(f"error: {message}")


def read_checksums(path: str) -> Dict[str, Tuple[str, int]]:
    """base name -> (checksum, size in bytes) from a TSV (name, sha256 or md5:HEX, size[, url])."""
    table: Dict[str, Tuple[str, int]] = {}
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if not line.strip() or line.startswith("#"):
                    continue
                fields = line.rstrip("\n").split("\t")
                table[fields[0]] = (fields[1].lower(), int(fields[2]))
    except OSError as error:
        fail(f"CHECKSUMS={path!r} cannot be read: {error.strerror}")
    except (IndexError, ValueError):
        fail(f"CHECKSUMS={path!r}: bad line {line.strip()!r} (want: name<TAB>sha256<TAB>bytes)")
    return table


def lookup(table: Dict[str, Tuple[str, int]], name: str, checksums: str) -> Tuple[str, int]:
    if name not in table:
        fail(f"{name} has no checksum in {checksums} (known: {', '.join(sorted(table))})")
    return table[name]


def reachable(url: str, timeout: float) -> str:
    """'' when ``url`` can be fetched, else why not."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        path = urllib.request.url2pathname(parsed.path)
        return "" if os.path.isfile(path) else "no such file"
    if parsed.scheme not in ("http", "https"):
        return f"unsupported scheme {parsed.scheme!r} (use http://, https:// or file://)"
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
        return ""
    except (urllib.error.URLError, OSError) as error:
        return str(getattr(error, "reason", error))


def probe(urls: List[str], checksums: str, downloads: str, timeout: float, factor: float,
          extra: int = 0) -> None:
    """Fail with one line unless every URL not yet downloaded is reachable and the disk
    has room for it (``factor`` x its size: archive plus what is extracted from it) and for
    ``extra`` bytes more (local files the recipe adds, e.g. back-translations)."""
    table = read_checksums(checksums)
    needed = extra
    for url in urls:
        name = os.path.basename(urllib.parse.urlparse(url).path)
        _sha, size = lookup(table, name, checksums)
        if os.path.isfile(os.path.join(downloads, name)):
            continue  # verified again (and skipped) by download.py
        why = reachable(url, timeout)
        if why:
            fail(f"cannot reach {url}: {why} (check MIRROR, or the network)")
        done = os.path.getsize(os.path.join(downloads, name + ".part")) if os.path.isfile(
            os.path.join(downloads, name + ".part")) else 0
        needed += int((size - done) + (factor - 1) * size)
    os.makedirs(downloads, exist_ok=True)
    free = shutil.disk_usage(downloads).free
    if needed > free:
        fail(f"not enough disk space in {downloads}: about {needed / 1e9:.1f} GB needed for "
             f"the downloads and their extracted text{' and the back-translations' if extra else ''}, "
             f"{free / 1e9:.1f} GB free (set DATA_DIR)")


def text_members(archive: str, wanted: List[str]) -> Iterator[Tuple[str, io.BufferedIOBase]]:
    """(wanted name, readable stream) for each wanted member, in one pass over the archive;
    names match after ``os.path.normpath`` (real archives may spell ``dev/x`` as ``./dev/x``)."""
    if archive.endswith((".tgz", ".tar.gz", ".tar")):
        by_path = {os.path.normpath(name): name for name in wanted}
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                name = by_path.get(os.path.normpath(member.name))
                if name is not None and member.isfile():
                    yield name, tar.extractfile(member)
    elif archive.endswith(".gz"):
        with gzip.open(archive, "rb") as handle:
            yield wanted[0], handle
    else:
        with open(archive, "rb") as handle:
            yield wanted[0], handle


def extract(archive: str, pairs: List[str]) -> None:
    targets: Dict[str, str] = {}
    for pair in pairs:
        member, _, out = pair.partition("=")
        if not out:
            fail(f"extract: {pair!r} is not MEMBER=OUT")
        targets[member] = out
    found = set()
    try:
        for member, stream in text_members(archive, list(targets)):
            out = targets[member]
            os.makedirs(os.path.dirname(os.path.abspath(out)) or ".", exist_ok=True)
            with tempfile.NamedTemporaryFile("wb", dir=os.path.dirname(os.path.abspath(out)),
                                             delete=False) as tmp:
                shutil.copyfileobj(stream, tmp, 1 << 20)
            if member.endswith(".sgm"):  # WMT's fake SGML, converted as sacrebleu does
                from sacrebleu.dataset.fake_sgml import FakeSGMLDataset  # deferred: 0.2 s; only .sgm needs it

                plain = tmp.name + ".txt"
                FakeSGMLDataset._convert_format(FakeSGMLDataset, tmp.name, plain)
                os.replace(plain, tmp.name)
            os.replace(tmp.name, out)
            found.add(member)
    except (tarfile.TarError, OSError, EOFError) as error:
        fail(f"cannot read {archive}: {error} (delete it to download it again)")
    missing = [m for m in targets if m not in found]
    if missing:
        fail(f"{archive} has no {', '.join(missing)} (is it the right archive?)")


def count_lines(path: str) -> int:
    with open(path, "rb") as handle:
        return sum(block.count(b"\n") for block in iter(lambda: handle.read(1 << 20), b""))


def paste(out_prefix: str, langs: List[str], parts: List[str]) -> None:
    """Concatenate parallel parts (each a prefix with a file per language) into
    ``out_prefix.<lang>``; a part whose sides differ in length stops with one line."""
    for part in parts:
        counts = {lang: count_lines(f"{part}.{lang}") for lang in langs}
        if len(set(counts.values())) != 1:
            fail(f"{part}: sides differ in length ({counts}); a broken or wrong archive?")
    for lang in langs:
        out = f"{out_prefix}.{lang}"
        with tempfile.NamedTemporaryFile("wb", dir=os.path.dirname(os.path.abspath(out)),
                                         delete=False) as tmp:
            for part in parts:
                with open(f"{part}.{lang}", "rb") as handle:
                    shutil.copyfileobj(handle, tmp, 1 << 20)
        os.replace(tmp.name, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sha256")
    s.add_argument("--checksums", required=True)
    s.add_argument("name")
    p = sub.add_parser("probe")
    p.add_argument("--checksums", required=True)
    p.add_argument("--downloads", required=True)
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument("--space-factor", type=float, default=3.0)
    p.add_argument("--extra-bytes", type=int, default=0, help="more bytes the recipe will need")
    p.add_argument("urls", nargs="+")
    e = sub.add_parser("extract")
    e.add_argument("archive")
    e.add_argument("pairs", nargs="+", metavar="MEMBER=OUT")
    c = sub.add_parser("paste")
    c.add_argument("--out", required=True)
    c.add_argument("--langs", default="en,de")
    c.add_argument("parts", nargs="+")
    args = parser.parse_args()
    if args.command == "sha256":
        print(lookup(read_checksums(args.checksums), args.name, args.checksums)[0])
    elif args.command == "probe":
        probe(args.urls, args.checksums, args.downloads, args.timeout, args.space_factor,
              args.extra_bytes)
    elif args.command == "extract":
        extract(args.archive, args.pairs)
    else:
        paste(args.out, args.langs.split(","), args.parts)


if __name__ == "__main__":
    main()
