#!/usr/bin/env bash
# WMT17 English->German: Europarl v7 + Common Crawl + News Commentary v12 + Rapid 2016
# (about 5.9M pairs), dev newstest2016, test newstest2017, sentencepiece 32K,
# hybrid_lstm_wmt_en_de (or ARCH=lstm_luong_wmt_en_de, the input-feeding baseline).
# Back-translated monolingual news (as WMT17 systems used): BT_EN=... BT_DE=... (plain or .gz),
# e.g. Sennrich et al.'s WMT16 back-translations of news (news.bt.en-de.{en,de}.gz, from
# http://data.statmt.org/rsennrich/wmt16_backtranslations/en-de/; see recipes/README.md).
#
#   bash recipes/wmt17_en_de/run.sh [all|prepare|clean|spm|binarize|train|generate|score]
#
# Settings are environment variables (DATA_DIR, MIRROR, GPUS, MAX_TOKENS, MAX_UPDATE, ...):
# see recipes/README.md. The stages themselves live in recipes/lib/wmt.sh.
set -euo pipefail
. "$(dirname "$0")/../lib/wmt.sh"

RECIPE=wmt17_en_de
CORPORA=(
  "europarl_v7 http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz training/europarl-v7.de-en.en training/europarl-v7.de-en.de"
  "commoncrawl http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz commoncrawl.de-en.en commoncrawl.de-en.de"
  "news_commentary_v12 http://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz training/news-commentary-v12.de-en.en training/news-commentary-v12.de-en.de"
  "rapid2016 http://data.statmt.org/wmt18/translation-task/rapid2016.tgz rapid2016.de-en.en rapid2016.de-en.de"
)
DEV="newstest2016 http://data.statmt.org/wmt19/translation-task/dev.tgz dev/newstest2016-ende-src.en.sgm dev/newstest2016-ende-ref.de.sgm"
TEST="newstest2017 http://data.statmt.org/wmt19/translation-task/dev.tgz dev/newstest2017-ende-src.en.sgm dev/newstest2017-ende-ref.de.sgm"
TEST_ABOUT="newstest2017 (= sacrebleu -t wmt17 -l en-de)"

wmt_main "$@"
