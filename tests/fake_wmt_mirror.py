"""A tiny fake WMT mirror for testing the WMT recipes offline.

    python tests/fake_wmt_mirror.py DEST [--pairs 400] [--test 40]

Writes, in the layouts the real archives have, every file recipes/wmt14_en_de and
recipes/wmt17_en_de download (training tarballs with their ``training/`` prefixes and a
few other language pairs beside en-de, ``dev.tgz`` with WMT's ``.sgm`` dev and test sets,
``test-filtered.tgz`` with a filtered newstest2014 whose member names start with ``./``),
filled with sentences from the bundled sample corpus (data/ende-sample), plus
``DEST/checksums.tsv`` for them (an md5 for test-filtered.tgz, as for the real one) and
``DEST/backtranslation.{en,de}.gz``. Each training corpus
also holds the pairs the clean stage must drop (empty, too long, bad ratio, duplicate) and
typographic punctuation for it to normalise. Prints the command that runs a recipe on it.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import tarfile
from pathlib import Path
from typing import Dict, List, Tuple

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "data" / "ende-sample"

# base name -> (real URL, {member: (split, lang) or "other"})
TRAIN = {
    "training-parallel-europarl-v7.tgz": ("http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz",
                                          "training/europarl-v7.de-en", "training/europarl-v7.fr-en"),
    "training-parallel-commoncrawl.tgz": ("http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
                                          "commoncrawl.de-en", "commoncrawl.fr-en"),
    "training-parallel-nc-v9.tgz": ("http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz",
                                    "training/news-commentary-v9.de-en", "training/news-commentary-v9.cs-en"),
    "training-parallel-nc-v12.tgz": ("http://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz",
                                     "training/news-commentary-v12.de-en", "training/news-commentary-v12.ru-en"),
    "rapid2016.tgz": ("http://data.statmt.org/wmt18/translation-task/rapid2016.tgz",
                      "rapid2016.de-en", "rapid2016.fi-en"),
}
DEV_URL = "http://data.statmt.org/wmt19/translation-task/dev.tgz"
# (sgm file prefix, set id): the dev and test sets both recipes read from dev.tgz
TEST_SETS = [("dev/newstest2013", "newstest2013"), ("dev/newstest2014-deen", "newstest2014"),
             ("dev/newstest2016-ende", "newstest2016"), ("dev/newstest2017-ende", "newstest2017")]
FILTERED_URL = "https://statmt.org/wmt14/test-filtered.tgz"


def filtered(rows: List[str]) -> List[str]:
    """The fake filtered newstest2014: the full one without every fourth sentence."""
    return [row for i, row in enumerate(rows) if i % 4 != 3]


def lines(name: str) -> List[str]:
    return (SAMPLE / name).read_text(encoding="utf-8").splitlines()


def noisy(en: List[str], de: List[str]) -> Tuple[List[str], List[str]]:
    """Pairs the clean stage must drop or normalise, mixed into a training corpus."""
    long_en = " ".join(["word"] * 90)
    extra = [("", ""), (long_en, long_en), ("One two three four five six seven eight.", "Eins."),
             (en[0], de[0]), ("„Quotes“ and  spaces ,here.", "„Anführungszeichen“ und  Leerzeichen ,hier.")]
    return en + [e for e, _ in extra], de + [d for _, d in extra]


def sgm(set_id: str, kind: str, lang: str, segments: List[str]) -> bytes:
    head = (f'<srcset setid="{set_id}" srclang="any">\n' if kind == "src"
            else f'<refset setid="{set_id}" srclang="any" trglang="{lang}">\n')
    body = [f'<doc sysid="{"ref" if kind == "ref" else "src"}" docid="doc1" genre="news" origlang="en">', "<p>"]
    body += [f'<seg id="{i}"> {text} </seg>' for i, text in enumerate(segments, 1)]
    body += ["</p>", "</doc>", "</srcset>" if kind == "src" else "</refset>"]
    return (head + "\n".join(body) + "\n").encode("utf-8")


def tgz(path: Path, members: Dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def text(rows: List[str]) -> bytes:
    return ("\n".join(rows) + "\n").encode("utf-8")


def build(dest: Path, pairs: int = 400, test: int = 40) -> Path:
    """Write the fake mirror into ``dest``; returns its checksums file."""
    dest.mkdir(parents=True, exist_ok=True)
    train_en, train_de = lines("train.en"), lines("train.de")
    checksums = []
    for index, (name, (url, prefix, other)) in enumerate(TRAIN.items()):
        chunk = slice(index * pairs, (index + 1) * pairs)
        en, de = noisy(train_en[chunk], train_de[chunk])
        tgz(dest / name, {f"{prefix}.en": text(en), f"{prefix}.de": text(de),
                          f"{other}.en": text(en[:5]), f"{other}.xx": text(de[:5])})
        checksums.append((name, url))
    valid_en, valid_de, test_en, test_de = lines("valid.en"), lines("valid.de"), lines("test.en"), lines("test.de")
    members = {"dev/newstest2013.en": text(valid_en[:test]), "dev/newstest2013.de": text(valid_de[:test])}
    for i, (prefix, set_id) in enumerate(TEST_SETS):
        en, de = (valid_en, valid_de) if i % 2 == 0 else (test_en, test_de)
        part = slice(i * test, (i + 1) * test)
        src_name = f"{prefix}-src.en.sgm"
        members[src_name] = sgm(set_id, "src", "en", en[part])
        members[f"{prefix}-ref.de.sgm"] = sgm(set_id, "ref", "de", de[part])
    tgz(dest / "dev.tgz", members)
    checksums.append(("dev.tgz", DEV_URL))
    full = slice(1 * test, 2 * test)  # newstest2014 in dev.tgz
    tgz(dest / "test-filtered.tgz", {
        "./test/newstest2014-deen-src.en.sgm": sgm("newstest2014", "src", "en", filtered(test_en[full])),
        "./test/newstest2014-deen-ref.de.sgm": sgm("newstest2014", "ref", "de", filtered(test_de[full])),
        "./test/newstest2014-csen-src.en.sgm": sgm("newstest2014", "src", "en", test_en[:3]),
    })
    checksums.append(("test-filtered.tgz", FILTERED_URL))
    bt = slice(len(TRAIN) * pairs, (len(TRAIN) + 1) * pairs)
    for lang, rows in (("en", train_en[bt]), ("de", train_de[bt])):
        (dest / f"backtranslation.{lang}.gz").write_bytes(gzip.compress(text(rows), mtime=0))
    table = dest / "checksums.tsv"
    def checksum(name: str) -> str:
        data = (dest / name).read_bytes()
        if name == "test-filtered.tgz":
            return "md5:" + hashlib.md5(data).hexdigest()
        return hashlib.sha256(data).hexdigest()

    table.write_text("# fake mirror built by tests/fake_wmt_mirror.py\n" + "".join(
        f"{name}\t{checksum(name)}\t{(dest / name).stat().st_size}\t{url}\n"
        for name, url in checksums), encoding="utf-8")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--pairs", type=int, default=400, help="sentence pairs per training corpus")
    parser.add_argument("--test", type=int, default=40, help="sentences per dev/test set")
    args = parser.parse_args()
    dest = args.dest.resolve()
    table = build(dest, args.pairs, args.test)
    print(f"fake WMT mirror in {dest}; try (tiny model, CPU, a minute or two):\n"
          f"  . .venv/bin/activate   # after make install\n"
          f"  MIRROR={dest.as_uri()} CHECKSUMS={table} DATA_DIR=work/fake-wmt14 RESULTS=work/fake-wmt14/results \\\n"
          f"  GPUS=cpu SPM_VOCAB=400 MAX_UPDATE=30 MAX_TOKENS=1000 SAVE_INTERVAL=10 CHECKPOINT=avg AVG_N=2 \\\n"
          f"  EXTRA_TRAIN_ARGS='--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32 "
          f"--encoder-hidden-size 32 --decoder-hidden-size 32 --decoder-out-embed-dim 32' \\\n"
          f"  bash recipes/wmt14_en_de/run.sh all")


if __name__ == "__main__":
    main()
