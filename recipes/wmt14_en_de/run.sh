#!/usr/bin/env bash
# WMT14 English->German: Europarl v7 + Common Crawl + News Commentary v9 (about 4.5M pairs),
# dev newstest2013, test newstest2014 (the full 3,003-sentence set), sentencepiece 32K,
# hybrid_lstm_wmt_en_de (or ARCH=lstm_luong_wmt_en_de, the input-feeding baseline).
#
#   bash recipes/wmt14_en_de/run.sh [all|prepare|clean|spm|binarize|train|generate|score]
#
# Settings are environment variables (DATA_DIR, MIRROR, GPUS, MAX_TOKENS, MAX_UPDATE, ...):
# see recipes/README.md. The stages themselves live in recipes/lib/wmt.sh.
set -euo pipefail
. "$(dirname "$0")/../lib/wmt.sh"

RECIPE=wmt14_en_de
CORPORA=(
  "europarl_v7 http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz training/europarl-v7.de-en.en training/europarl-v7.de-en.de"
  "commoncrawl http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz commoncrawl.de-en.en commoncrawl.de-en.de"
  "news_commentary_v9 http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz training/news-commentary-v9.de-en.en training/news-commentary-v9.de-en.de"
)
DEV="newstest2013 http://data.statmt.org/wmt19/translation-task/dev.tgz dev/newstest2013-src.en.sgm dev/newstest2013-ref.de.sgm"
TEST="newstest2014 http://data.statmt.org/wmt19/translation-task/dev.tgz dev/newstest2014-deen-src.en.sgm dev/newstest2014-deen-ref.de.sgm"

wmt_main "$@"
