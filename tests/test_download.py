"""recipes/lib/download.py: resumable, checksummed, retried downloads (loopback only)."""
import hashlib
import http.server
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "recipes" / "lib"))
from download import DownloadError, download  # noqa: E402

PAYLOAD = bytes(range(256)) * 4000  # ~1 MB


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def archive(tmp_path):
    path = tmp_path / "mirror" / "corpus.tgz"
    path.parent.mkdir()
    path.write_bytes(PAYLOAD)
    return path


def test_file_mirror_download_and_skip_when_present(archive, tmp_path):
    dest = tmp_path / "out" / "corpus.tgz"
    download(archive.as_uri(), dest, sha(PAYLOAD), quiet=True)
    assert dest.read_bytes() == PAYLOAD and not dest.with_name("corpus.tgz.part").exists()
    archive.unlink()  # a finished, verified file is not fetched again
    download(archive.as_uri(), dest, sha(PAYLOAD), quiet=True)


def test_interrupted_download_resumes(archive, tmp_path, capsys):
    dest = tmp_path / "corpus.tgz"
    dest.with_name("corpus.tgz.part").write_bytes(PAYLOAD[:300_000])
    download(archive.as_uri(), dest, sha(PAYLOAD))
    assert dest.read_bytes() == PAYLOAD
    assert "resuming at byte 300000" in capsys.readouterr().err


def test_corrupted_archive_fails_its_checksum_with_the_url(archive, tmp_path):
    archive.write_bytes(PAYLOAD[:-1] + b"X")
    dest = tmp_path / "corpus.tgz"
    proc = subprocess.run(
        [sys.executable, str(REPO / "recipes" / "lib" / "download.py"), "--url", archive.as_uri(),
         "--dest", str(dest), "--sha256", sha(PAYLOAD), "--quiet"],
        capture_output=True, text=True,
    )
    assert proc.returncode != 0
    assert proc.stderr.strip().startswith("download.py: error: checksum mismatch for file://")
    assert not dest.exists() and not dest.with_name("corpus.tgz.part").exists()


def test_md5_checked_download(archive, tmp_path):
    """Where only an md5 is published (WMT14's test-filtered.tgz): --md5 instead of --sha256."""
    script = [sys.executable, str(REPO / "recipes" / "lib" / "download.py"), "--url", archive.as_uri(), "--quiet"]
    good = subprocess.run(script + ["--dest", str(tmp_path / "a.tgz"), "--md5", hashlib.md5(PAYLOAD).hexdigest()],
                          capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    assert (tmp_path / "a.tgz").read_bytes() == PAYLOAD
    bad = subprocess.run(script + ["--dest", str(tmp_path / "b.tgz"), "--md5", "0" * 32],
                         capture_output=True, text=True)
    assert bad.stderr.strip().startswith(f"download.py: error: checksum mismatch for {archive.as_uri()}: "
                                         f"expected md5 {'0' * 32}, got {hashlib.md5(PAYLOAD).hexdigest()}")
    assert not (tmp_path / "b.tgz").exists() and not (tmp_path / "b.tgz.part").exists()


class FlakyRangeHandler(http.server.BaseHTTPRequestHandler):
    """Serves PAYLOAD with Range support; the first response stops half way."""
    requests = []

    def do_GET(self):
        start = 0
        if "Range" in self.headers:
            start = int(self.headers["Range"].split("=")[1].split("-")[0])
        FlakyRangeHandler.requests.append(start)
        body = PAYLOAD[start:]
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if len(FlakyRangeHandler.requests) == 1:
            self.wfile.write(body[: len(body) // 3])
            self.wfile.flush()
            self.connection.close()  # the connection drops
            return
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_http_download_retries_and_resumes_with_range(tmp_path):
    FlakyRangeHandler.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FlakyRangeHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/corpus.tgz"
        dest = tmp_path / "corpus.tgz"
        download(url, dest, sha(PAYLOAD), retries=3, timeout=10, backoff=0.01, quiet=True)
    finally:
        server.shutdown()
        server.server_close()
    assert dest.read_bytes() == PAYLOAD
    assert FlakyRangeHandler.requests[0] == 0 and FlakyRangeHandler.requests[1] > 0


def test_unreachable_mirror_names_the_url(tmp_path):
    with pytest.raises(DownloadError, match=r"could not fetch file://.*missing.tgz after 2 attempts"):
        download((tmp_path / "missing.tgz").as_uri(), tmp_path / "x.tgz", "0" * 64,
                 retries=2, backoff=0.0, quiet=True)
