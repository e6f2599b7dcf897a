"""benchmarks/quality_summary.py: the committed docs say what the committed report says, the
block's readings follow the report's intervals, and refreshing a file replaces only its block."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from benchmarks import quality, quality_summary as qs

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "results/quality/converged-sample.json"


@pytest.fixture(scope="module")
def report():
    return json.loads(COMMITTED.read_text(encoding="utf-8"))


def _block(text: str, name: str) -> str:
    begin = text.index(qs.begin_marker(name))
    return text[begin:text.index(qs.END, begin) + len(qs.END)]


@pytest.mark.parametrize("doc", ["README.md", "docs/quality.md"])
def test_committed_docs_carry_the_committed_reports_summary(doc, report):
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert qs.blocks(text) == ["converged-sample"]
    assert _block(text, "converged-sample") == qs.summary(report), (
        f"{doc}'s quality summary is not the committed report's: run python -m benchmarks.quality --report-only")


def _with_headline(report, ci95_bootstrap, ci95_welch, difference, equivalent, direction):
    changed = copy.deepcopy(report)
    m = changed["comparisons"]["hybrid - lstm"]["measures"]["BLEU"]
    m["difference"] = difference
    m["bootstrap"]["ci95"], m["welch"]["ci95"] = ci95_bootstrap, ci95_welch
    m["equivalence"].update(equivalent=equivalent, direction=direction)
    return changed


def test_not_decided_names_the_range_it_cannot_rule_out(report):
    text = qs.summary(_with_headline(report, [-0.30, 0.20], [-0.25, 0.10], -0.07, False, 0))
    seeds = min(len(report["summary"][k]["seeds"]) for k in ("hybrid", "lstm"))
    assert (f"{seeds} seeds per model detect no BLEU difference between `hybrid_lstm` and fairseq's `lstm`, and "
            "cannot rule out one between −0.30 and +0.20") in text


def test_equivalent_says_less_than_the_margin(report):
    text = qs.summary(_with_headline(report, [-0.30, 0.20], [-0.25, 0.10], -0.07, True, 0))
    assert "dropping input feeding changes BLEU by less than 0.5 against fairseq's `lstm`" in text
    assert "difference −0.07" in text and "cannot rule out" not in text


@pytest.mark.parametrize("direction,equivalent,words", [
    (-1, False, "dropping input feeding costs 0.41 BLEU against fairseq's `lstm` (both 95% intervals exclude 0);"),
    (-1, True, "costs 0.41 BLEU against fairseq's `lstm` (both 95% intervals exclude 0), a difference inside "
               "the ±0.5 BLEU margin"),
    (1, False, "dropping input feeding gains 0.41 BLEU"),
])
def test_a_direction_is_said_with_its_size(report, direction, equivalent, words):
    low, high = (-0.8, -0.1) if direction < 0 else (0.1, 0.8)
    text = qs.summary(_with_headline(report, [low, high], [low, high], 0.41 * direction, equivalent, direction))
    assert words in text


def test_width_met_drops_the_seeds_needed(report):
    met = copy.deepcopy(report)
    met["comparisons"]["hybrid - lstm"]["measures"]["BLEU"]["equivalence"]["width"].update(
        bootstrap_half_width=0.31, welch_half_width=0.33, met=True)
    text = qs.summary(met)
    assert "Half-widths ±0.31 and ±0.33 against the target ±0.35: met." in text
    assert "seeds per model" not in text.split("Half-widths")[1].split("\n")[0]
    unmet = qs.summary(report)
    needed = report["comparisons"]["hybrid - lstm"]["measures"]["BLEU"]["equivalence"]["width"]["seeds_needed"]
    assert f"not met; at this seed spread Welch's interval needs {needed} seeds per model" in unmet


def test_runs_line_counts_runs_and_names_unbalanced_seeds(report):
    balanced = copy.deepcopy(report)
    balanced["partial"] = None
    for row in balanced["summary"].values():
        row["seeds"] = [1, 2, 3]
    balanced["settings"].update(seeds=[1, 2, 3], if_seeds=3)
    assert qs.runs_line(balanced) == "**All 9 runs are in** (seeds 1–3 of every model)."
    uneven = copy.deepcopy(report)
    for key, seeds in (("lstm", 5), ("hybrid", 6), ("hybrid_if", 5)):
        uneven["summary"][key]["seeds"] = list(range(1, seeds + 1))
    uneven["settings"].update(seeds=list(range(1, 11)), if_seeds=10)
    line = qs.runs_line(uneven)
    assert line.startswith("**16 of 30 runs are in** (fairseq `lstm` seeds 1–5; `hybrid_lstm` seeds 1–6; ")
    none_yet = copy.deepcopy(uneven)  # a planned model without a finished run still counts in the plan
    del none_yet["summary"]["hybrid_if"]
    assert qs.runs_line(none_yet).startswith("**11 of 30 runs are in** (fairseq `lstm` seeds 1–5; `hybrid_lstm` ")


def test_range_row_is_the_lowest_and_highest_seed_of_the_stored_runs(report):
    """The demo is one run: the table says what one seed scored at worst and best, read here from
    the run records themselves rather than from the report's summary."""
    runs = ROOT / "results/quality/runs" / report["name"]
    row = next(line for line in qs.table(report) if line.startswith("| test BLEU, lowest-highest seed |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")[1:]]
    for key, cell in zip(qs._columns(report), cells):
        records = [json.loads((runs / f"{key}-seed{seed}.json").read_text(encoding="utf-8"))
                   for seed in report["summary"][key]["seeds"]]
        bleu = [record["scores"]["test@default"]["bleu"] for record in records]
        assert cell == f"{min(bleu):.2f}-{max(bleu):.2f}"


@pytest.mark.parametrize("seeds,text", [([4], "4"), ([1, 2, 3, 5, 7, 8], "1–3, 5, 7–8"), ([3, 1, 2], "1–3")])
def test_seed_ranges(seeds, text):
    assert qs.seed_ranges(seeds) == text


def test_refresh_replaces_only_the_block(tmp_path, report):
    name = report["name"]
    doc, other, plain = tmp_path / "doc.md", tmp_path / "other.md", tmp_path / "plain.md"
    doc.write_text(f"# Before\n\ntext\n\n{qs.begin_marker(name)}\nold numbers\n{qs.END}\n\nafter\n", encoding="utf-8")
    other.write_text(f"{qs.begin_marker('another-study')}\nkept\n{qs.END}\n", encoding="utf-8")
    plain.write_text("no block here\n", encoding="utf-8")
    assert qs.refresh(report, [doc, other, plain, tmp_path / "missing.md"]) == [doc]
    text = doc.read_text(encoding="utf-8")
    assert text == f"# Before\n\ntext\n\n{qs.summary(report)}\n\nafter\n"
    assert other.read_text(encoding="utf-8") == f"{qs.begin_marker('another-study')}\nkept\n{qs.END}\n"
    assert plain.read_text(encoding="utf-8") == "no block here\n"
    assert qs.refresh(report, [doc]) == []  # already the report's: not rewritten


def test_refresh_refuses_a_block_without_its_end(tmp_path, report):
    doc = tmp_path / "doc.md"
    doc.write_text(f"{qs.begin_marker(report['name'])}\nold numbers\n", encoding="utf-8")
    with pytest.raises(qs.SummaryError, match=r"doc\.md: the quality summary of 'converged-sample' begins but has no"):
        qs.refresh(report, [doc])
    assert doc.read_text(encoding="utf-8") == f"{qs.begin_marker(report['name'])}\nold numbers\n"


@pytest.mark.parametrize("committed", [True, False])
def test_the_study_refreshes_the_docs_only_for_the_committed_report(tmp_path, monkeypatch, report, committed):
    out, doc = tmp_path / "results", tmp_path / "README.md"
    doc.write_text(f"{qs.begin_marker(report['name'])}\nold\n{qs.END}\n", encoding="utf-8")
    monkeypatch.setattr(quality, "run", lambda args: report)
    monkeypatch.setattr(quality, "COMMITTED", out if committed else tmp_path / "elsewhere")
    monkeypatch.setattr(quality, "DOCS", (doc,))
    quality.main(["--report-only", "--out", str(out), "--work", str(tmp_path / "work")])
    assert json.loads((out / "converged-sample.json").read_text(encoding="utf-8")) == report
    expected = f"{qs.summary(report)}\n" if committed else f"{qs.begin_marker(report['name'])}\nold\n{qs.END}\n"
    assert doc.read_text(encoding="utf-8") == expected
