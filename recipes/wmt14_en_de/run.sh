#!/usr/bin/env bash
# WMT14 English->German: Europarl v7 + Common Crawl + News Commentary v9 (about 4.5M pairs),
# dev newstest2013, sentencepiece 32K, hybrid_lstm_wmt_en_de (or ARCH=lstm_luong_wmt_en_de,
# the input-feeding baseline). Two test sets are scored: newstest2014 "full" (3,003
# sentences, = sacrebleu -t wmt14/full; what fairseq, tensor2tensor and TFDS report) and the
# filtered newstest2014 (2,737 sentences, = sacrebleu -t wmt14; what Luong et al. 2015 report).
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
TEST="newstest2014_full http://data.statmt.org/wmt19/translation-task/dev.tgz dev/newstest2014-deen-src.en.sgm dev/newstest2014-deen-ref.de.sgm"
TEST_ABOUT="newstest2014 full: 3,003 sentences (= sacrebleu -t wmt14/full -l en-de; as fairseq, tensor2tensor, TFDS)"
# sacreBLEU's URL and md5 for wmt14 (the only checksum published for this file)
TEST_FILTERED="newstest2014_filtered https://statmt.org/wmt14/test-filtered.tgz test/newstest2014-deen-src.en.sgm test/newstest2014-deen-ref.de.sgm"
TEST_FILTERED_ABOUT="newstest2014 filtered: 2,737 sentences (= sacrebleu -t wmt14 -l en-de; as Luong et al. 2015)"

wmt_main "$@"
