"""Resumable, checksummed downloads for the recipes.

    python recipes/lib/download.py --url URL --dest PATH --sha256 HEX [--retries 5]
    python recipes/lib/download.py --url URL --dest PATH --md5 HEX      # where only an md5 is published

- A finished file whose checksum (sha256, or md5 where that is all that is published, e.g.
  sacreBLEU's for WMT14's test-filtered.tgz) matches is kept (nothing is fetched).
- Bytes arrive in ``PATH.part``; an interrupted download resumes from its size (HTTP
  ``Range`` requests; ``file://`` mirrors seek), with retries and backoff.
- The finished ``.part`` is checked against the sha256 before it is renamed to ``PATH``:
  a corrupted or changed archive fails with one line naming the URL, and is deleted.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import BinaryIO, Optional, Tuple

from tqdm import tqdm

CHUNK = 1 << 20


class DownloadError(RuntimeError):
    pass


def digest_of(path: Path, algorithm: str = "sha256") -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def open_from(url: str, offset: int, timeout: float) -> Tuple[BinaryIO, Optional[int], bool]:
    """(stream, total size if known, whether the stream starts at ``offset``)."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        path = urllib.request.url2pathname(parsed.path)
        handle = open(path, "rb")
        handle.seek(offset)
        return handle, os.path.getsize(path), True
    request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
    response = urllib.request.urlopen(request, timeout=timeout)
    resumed = offset > 0 and response.status == 206
    length = response.headers.get("Content-Length")
    total = int(length) + (offset if resumed else 0) if length is not None else None
    return response, total, resumed or offset == 0


def download(url: str, dest: Path, sha256: str, retries: int = 5, timeout: float = 60.0,
             backoff: float = 2.0, quiet: bool = False, algorithm: str = "sha256") -> Path:
    """``sha256``: the expected hex digest, of ``algorithm`` (sha256 or md5)."""
    dest = Path(dest)
    if dest.is_file() and digest_of(dest, algorithm) == sha256:
        if not quiet:
            print(f"{dest.name}: present, checksum ok", file=sys.stderr)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    last_error: Optional[BaseException] = None
    for attempt in range(1, retries + 1):
        offset = part.stat().st_size if part.exists() else 0
        try:
            stream, total, resumed = open_from(url, offset, timeout)
            if not resumed:  # the server ignored the Range request: start again
                offset = 0
            if offset and not quiet:
                print(f"{dest.name}: resuming at byte {offset}", file=sys.stderr)
            with stream, open(part, "ab" if offset else "wb") as out, tqdm(
                total=total, initial=offset, unit="B", unit_scale=True, desc=dest.name,
                disable=quiet, file=sys.stderr,
            ) as bar:
                for block in iter(lambda: stream.read(CHUNK), b""):
                    out.write(block)
                    bar.update(len(block))
            if total is not None and part.stat().st_size < total:
                raise DownloadError(f"connection closed at byte {part.stat().st_size} of {total}")
            break
        except (OSError, urllib.error.URLError, DownloadError) as error:
            last_error = error
            if attempt < retries:
                time.sleep(backoff * attempt)
    else:
        raise DownloadError(
            f"could not fetch {url} after {retries} attempts: {last_error}"
        )
    got = digest_of(part, algorithm)
    if got != sha256:
        part.unlink()
        raise DownloadError(
            f"checksum mismatch for {url}: expected {algorithm} {sha256}, got {got} "
            "(a corrupted or changed archive; it was deleted, rerun to fetch it again)"
        )
    os.replace(part, dest)
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--dest", required=True)
    expected = parser.add_mutually_exclusive_group(required=True)
    expected.add_argument("--sha256")
    expected.add_argument("--md5")
    parser.add_argument("--retries", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--backoff", type=float, default=2.0)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    if args.retries < 1:
        sys.exit(f"download.py: error: --retries {args.retries} must be >= 1")
    try:
        algorithm = "sha256" if args.sha256 else "md5"
        download(args.url, Path(args.dest), (args.sha256 or args.md5).lower(), args.retries,
                 args.timeout, args.backoff, args.quiet, algorithm)
    except DownloadError as error:
        sys.exit(f"download.py: error: {error}")


if __name__ == "__main__":
    main()
