"""Tests for the synthetic TY2024 Form 1040 engine and the TaxCalcBench loader; expected values are worked by
hand from the 2024 figures (the fixtures' derivations are in tests/data/taxcalcbench/README.md)."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from lit_credit.tasks import FormTask
from lit_credit.tasks.form1040 import (
    EVALUATED_LINES,
    MEF_LINE_ELEMENTS,
    TaxInput,
    compute_1040,
    engine_mismatches,
    generate_case,
    line_accuracy,
    load_taxcalcbench,
    normalize_line_key,
    score_lines,
    tax_on_income,
)


def test_single_w2_tax_table_and_refund() -> None:
    lines = compute_1040(TaxInput("single", w2s=((50_000, 5_000),)))
    assert tuple(lines) == EVALUATED_LINES
    # 15 = 50,000 - 14,600 = 35,400; table row 35,400-35,450, midpoint 35,425:
    # 1,160 + 12% * (35,425 - 11,600) = 1,160 + 2,859 = 4,019; refund 5,000 - 4,019 = 981.
    assert lines["1a"] == 50_000 and lines["9"] == 50_000 and lines["11"] == 50_000
    assert lines["12"] == 14_600
    assert lines["15"] == 35_400
    assert lines["16"] == 4_019
    assert lines["19"] == 0 and lines["24"] == 4_019
    assert lines["25d"] == 5_000 and lines["33"] == 5_000
    assert lines["34"] == 981 and lines["35a"] == 981 and lines["37"] == 0


def test_mfj_two_children_qualified_dividends_worksheet() -> None:
    inp = TaxInput(
        "married_filing_jointly",
        w2s=((70_000, 5_000), (50_000, 4_000)),
        ordinary_dividends=5_000,
        qualified_dividends=5_000,
        capital_gain=3_000,
        num_qualifying_children=2,
    )
    lines = compute_1040(inp)
    # 9 = 120,000 + 5,000 + 3,000 = 128,000; 15 = 128,000 - 29,200 = 98,800.
    # Worksheet: l4 = 8,000; l5 = 90,800; l7 = min(98,800, 94,050) = 94,050; l8 = 90,800; l9 = 3,250 (0 %);
    # l10 = 8,000; l12 = 4,750; l16 = 98,800 - (90,800 + 3,250) = 4,750; l17 = 4,750; l18 = 712.50 -> 713;
    # l20 = 8,000 - 8,000 = 0; l22 = table(90,800) midpoint 90,825: 2,320 + 12% * 67,625 = 10,435;
    # l23 = 713 + 10,435 = 11,148; l24 = table(98,800) midpoint 98,825:
    # 2,320 + 8,532 + 22% * 4,525 = 11,847.50 -> 11,848; line 16 = min = 11,148.
    assert lines["9"] == 128_000 and lines["15"] == 98_800
    assert lines["16"] == 11_148
    # CTC 2 * 2,000 = 4,000 (AGI under 400,000), below tax -> 19 = 4,000, no ACTC.
    assert lines["19"] == 4_000 and lines["28"] == 0
    assert lines["24"] == 7_148
    # payments 9,000 -> overpaid 1,852.
    assert lines["33"] == 9_000 and lines["34"] == 1_852 and lines["37"] == 0


def test_qualified_dividends_inside_zero_percent_band() -> None:
    lines = compute_1040(
        TaxInput("single", w2s=((40_000, 0),), ordinary_dividends=10_000, qualified_dividends=10_000)
    )
    # 15 = 35,400; l5 = 25,400; l9 = 35,400 - 25,400 = 10,000 all at 0 %;
    # l22 = table(25,400) midpoint 25,425: 1,160 + 12% * 13,825 = 2,819.
    assert lines["15"] == 35_400
    assert lines["16"] == 2_819
    assert lines["37"] == 2_819 and lines["34"] == 0


def test_ctc_phaseout() -> None:
    lines = compute_1040(TaxInput("single", w2s=((210_000, 45_000),), num_qualifying_children=1))
    # AGI 210,000 exceeds 200,000 by 10,000 -> 10 * 50 = 500; credit 2,000 - 500 = 1,500.
    # 15 = 195,400 (>= 100,000: formula): 1,160 + 4,266 + 11,742.50 + 21,942 + 32% * 3,450 = 40,214.50 -> 40,215.
    assert lines["15"] == 195_400
    assert lines["16"] == 40_215
    assert lines["19"] == 1_500
    assert lines["24"] == 38_715
    assert lines["28"] == 0
    # Partial thousand rounds up: 200,001 -> one 1,000 step -> 50.
    assert compute_1040(TaxInput("single", w2s=((200_001, 0),), num_qualifying_children=1))["19"] == 1_950


def test_actc_low_income_hoh() -> None:
    lines = compute_1040(TaxInput("head_of_household", w2s=((20_000, 500),), num_qualifying_children=2))
    # 15 = max(0, 20,000 - 21,900) = 0 -> tax 0, 19 = 0; unused 4,000; cap 2 * 1,700 = 3,400;
    # 15% * (20,000 - 2,500) = 2,625 -> 28 = 2,625; 33 = 500 + 2,625 = 3,125 = refund.
    assert lines["15"] == 0 and lines["16"] == 0 and lines["19"] == 0
    assert lines["28"] == 2_625 and lines["32"] == 2_625
    assert lines["33"] == 3_125 and lines["34"] == 3_125 and lines["35a"] == 3_125
    # Per-child cap binds at higher earned income: 15% * (40,000 - 2,500) = 5,625 > 3,400.
    # 15 = 18,100, table midpoint 18,125: 1,655 + 12% * 1,575 = 1,844 -> 19 = 1,844, unused 2,156 -> 28 = 2,156.
    lines = compute_1040(TaxInput("head_of_household", w2s=((40_000, 0),), num_qualifying_children=2))
    assert lines["16"] == 1_844 and lines["19"] == 1_844 and lines["28"] == 2_156


def test_hoh_with_interest_and_child() -> None:
    lines = compute_1040(
        TaxInput(
            "head_of_household", w2s=((80_000, 7_000),), taxable_interest=1_000, num_qualifying_children=1
        )
    )
    # 11 = 81,000; 15 = 81,000 - 21,900 = 59,100; midpoint 59,125: 1,655 + 12% * 42,575 = 1,655 + 5,109 = 6,764.
    assert lines["11"] == 81_000 and lines["12"] == 21_900 and lines["15"] == 59_100
    assert lines["16"] == 6_764
    assert lines["19"] == 2_000 and lines["24"] == 4_764
    assert lines["34"] == 2_236


def test_additional_standard_deduction() -> None:
    lines = compute_1040(TaxInput("single", w2s=((40_000, 0),), taxpayer_65_or_blind=2))
    # 12 = 14,600 + 2 * 1,950 = 18,500; 15 = 21,500; midpoint 21,525: 1,160 + 12% * 9,925 = 2,351.
    assert lines["12"] == 18_500 and lines["15"] == 21_500 and lines["16"] == 2_351
    assert compute_1040(TaxInput("married_filing_jointly", taxpayer_65_or_blind=1))["12"] == 30_750
    assert compute_1040(TaxInput("married_filing_separately", taxpayer_65_or_blind=1))["12"] == 16_150
    with pytest.raises(ValueError, match="at most 2"):
        TaxInput("single", taxpayer_65_or_blind=3)


def test_tax_table_vs_formula() -> None:
    # 99,990: table row 99,950-100,000, midpoint 99,975: 5,426 + 22% * 52,825 = 17,047.50 -> 17,048.
    assert tax_on_income(99_990, "single") == 17_048
    # 100,000: exact formula: 5,426 + 22% * 52,850 = 17,053.
    assert tax_on_income(100_000, "single") == 17_053
    # 100,525 + 1,000 in the 24 % bracket: 17,168.50 + 240 = 17,408.50 -> 17,409.
    assert tax_on_income(101_525, "single") == 17_409
    # Small rows: under 5 -> 0; 5-15 -> tax on 10 = 1; 25-50 -> tax on 37.50 = 3.75 -> 4;
    # 2,975-3,000 -> 298.75 -> 299; 3,000-3,050 -> 302.50 -> 303.
    assert tax_on_income(4, "single") == 0
    assert tax_on_income(7, "single") == 1
    assert tax_on_income(30, "single") == 4
    assert tax_on_income(2_990, "single") == 299
    assert tax_on_income(3_000, "single") == 303
    # MFJ 10 % bracket to 23,200: row 23,150-23,200 midpoint 23,175 -> 2,317.50 -> 2,318.
    assert tax_on_income(23_160, "married_filing_jointly") == 2_318
    # Top bracket, MFS above 365,600: formula, brackets sum computed independently.
    mfs = 1_160 + 4_266 + 11_742.5 + 21_942 + 0.32 * 51_775 + 0.35 * 121_875 + 0.37 * 34_400
    assert tax_on_income(400_000, "married_filing_separately") == int(mfs + 0.5)


def test_input_validation() -> None:
    with pytest.raises(ValueError, match="filing_status"):
        TaxInput("married")
    with pytest.raises(ValueError, match="qualified_dividends"):
        TaxInput("single", ordinary_dividends=100, qualified_dividends=200)
    with pytest.raises(ValueError, match="capital_gain"):
        TaxInput("single", capital_gain=-1)


def test_scoring_strict_and_lenient() -> None:
    gold = {"16": 4_019, "24": 4_019, "34": 981}
    pred = {"line_16": "$4,021", "L24": "4019.00", "34": "abc"}
    assert score_lines(pred, gold, lenient=False) == {"16": False, "24": True, "34": False}
    assert score_lines(pred, gold, lenient=True) == {"16": True, "24": True, "34": False}
    assert score_lines({"16": 4_025}, {"16": 4_019}, lenient=True) == {"16": False}
    assert score_lines({}, {"16": 1}, lenient=True) == {"16": False}
    assert score_lines({"16": None}, {"16": 1}, lenient=True) == {"16": False}
    assert line_accuracy(pred, gold) == pytest.approx(1 / 3)
    assert line_accuracy(pred, gold, lenient=True) == pytest.approx(2 / 3)
    assert normalize_line_key("Line 35a") == "35a" and normalize_line_key("L1a") == "1a"
    with pytest.raises(ValueError):
        line_accuracy(pred, {})


def test_generate_case_determinism_and_difficulty() -> None:
    for difficulty in (1, 2, 3):
        a = [generate_case(random.Random(7), difficulty) for _ in range(2)]
        assert a[0] == a[1]
    rng = random.Random(0)
    d1 = [generate_case(rng, 1) for _ in range(50)]
    assert all(c.filing_status == "single" and len(c.w2s) == 1 for c in d1)
    assert all(c.taxable_interest == c.ordinary_dividends == c.capital_gain == 0 for c in d1)
    assert all(c.num_qualifying_children == c.num_other_dependents == 0 for c in d1)
    d2 = [generate_case(rng, 2) for _ in range(100)]
    assert all(c.taxable_interest + c.ordinary_dividends > 0 for c in d2)
    assert all(c.qualified_dividends == c.capital_gain == c.num_qualifying_children == 0 for c in d2)
    assert len({c.filing_status for c in d2}) == 4
    d3 = [generate_case(rng, 3) for _ in range(200)]
    assert any(c.qualified_dividends > 0 for c in d3) and any(c.capital_gain > 0 for c in d3)
    assert any(c.num_qualifying_children > 0 for c in d3) and any(c.estimated_payments > 0 for c in d3)
    assert any(len(c.w2s) > 1 for c in d3)
    for c in d1 + d2 + d3:  # every generated case computes, with consistent payment lines
        lines = compute_1040(c)
        assert lines["33"] == lines["25d"] + lines["26"] + lines["32"]
        assert lines["34"] - lines["37"] == lines["33"] - lines["24"]
    with pytest.raises(ValueError, match="difficulty"):
        generate_case(rng, 4)


def test_qualified_dividends_twenty_percent_band() -> None:
    lines = compute_1040(
        TaxInput("single", w2s=((600_000, 0),), ordinary_dividends=100_000, qualified_dividends=100_000)
    )
    # 15 = 700,000 - 14,600 = 685,400; l5 = 585,400 > 518,900 so l9 = 0, l16 = 0, l17 = 0: all 100,000 at 20 %
    # -> l21 = 20,000; l22 = formula(585,400) = 17,168.50 + 21,942 + 16,568 + 35% * 341,675 (119,586.25)
    # = 175,264.75 -> 175,265; l23 = 195,265 < regular tax on 685,400.
    assert lines["15"] == 685_400
    assert lines["16"] == 195_265


# ------------------------------------------------------------------------------------- TaxCalcBench loader

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "taxcalcbench"
TEST_DATA = FIXTURES / "ty24" / "test_data"
READ = [
    "hoh-senior-interest-dividends-long-term-gain",
    "mfj-two-w2-children-estimated-tax",
    "single-w2-basic",
]


def _leaves(node: object, key: str = "") -> object:
    """Wrap every scalar of a plain nested dict as a benchmark ``{"label", "value"}`` leaf."""
    if isinstance(node, dict):
        return {k: _leaves(v, k) for k, v in node.items()}
    if isinstance(node, list):
        return [_leaves(v, key) for v in node]
    return {"label": key.replace("_", " "), "value": node}


def _xml(lines: dict[str, int], status_cd: str | None = "1", ns: bool = True) -> str:
    """An MeF Return with the lines' elements (zeros left out, as MeF does)."""
    body = "".join(f"<{MEF_LINE_ELEMENTS[k]}>{v}</{MEF_LINE_ELEMENTS[k]}>" for k, v in lines.items() if v)
    status = (
        f"<IndividualReturnFilingStatusCd>{status_cd}</IndividualReturnFilingStatusCd>" if status_cd else ""
    )
    xmlns = ' xmlns="http://www.irs.gov/efile"' if ns else ""
    return (f'<Return{xmlns}><ReturnHeader/><ReturnData><IRS1040 documentId="1">{status}{body}</IRS1040>'
            f"</ReturnData></Return>")  # fmt: skip


BASE = {"irs1040": {"filing_status": "single", "tp_date_of_birth": "1990-01-01"},
        "w2": [{"wages": 50_000, "withholding": 5_000, "ein": "11-1111111"}]}  # fmt: skip
BASE_INPUT = TaxInput("single", w2s=((50_000, 5_000),))


def _case(root: Path, name: str, return_data: dict = BASE, xml: str | None = None) -> Path:
    """A case in the benchmark layout; ``output.xml`` defaults to the engine's lines for BASE_INPUT (no
    filing-status code)."""
    d = root / name
    d.mkdir(parents=True)
    (d / "input.json").write_text(
        json.dumps({"input": {"return_header": {}, "return_data": _leaves(return_data)}})
    )
    (d / "output.xml").write_text(_xml(compute_1040(BASE_INPUT), status_cd=None) if xml is None else xml)
    return d


def test_reads_the_benchmark_layout_and_unwraps_values() -> None:
    bench = load_taxcalcbench(FIXTURES)  # a directory above ty24/test_data, like the repository root
    assert bench.root == TEST_DATA
    assert [name for name, _, _ in bench.cases] == READ
    inputs = {name: inp for name, inp, _ in bench.cases}
    assert inputs["single-w2-basic"] == TaxInput("single", w2s=((52_300, 4_100),))
    # Cents kept; sons born 2012 and 2016 are under 17, the 2005 student is an other dependent; 500 + 500.
    assert inputs["mfj-two-w2-children-estimated-tax"] == TaxInput(
        "married_filing_jointly", w2s=((68_250.40, 5_120), (41_900.75, 2_950.50)), num_qualifying_children=2,
        num_other_dependents=1, estimated_payments=1_000,
    )  # fmt: skip
    # Interest = box 1 + box 3; gain = 12,000 - 7,000 (long-term 1099-B) + 500 (1099-DIV 2a); born 1958 -> 65.
    assert inputs["hoh-senior-interest-dividends-long-term-gain"] == TaxInput(
        "head_of_household", w2s=((61_000, 6_200),), taxable_interest=1_550, ordinary_dividends=2_400,
        qualified_dividends=1_800, capital_gain=5_500, num_other_dependents=1, taxpayer_65_or_blind=1,
    )  # fmt: skip


def test_gold_lines_come_from_irs1040_with_absent_elements_zero() -> None:
    gold = {name: g for name, _, g in load_taxcalcbench(TEST_DATA).cases}
    # Hand-derived (fixture README): 15 = 52,300 - 14,600; 16 = table midpoint 37,725 -> 4,295; owes 195.
    assert gold["single-w2-basic"] == {
        "1a": 52_300, "9": 52_300, "10": 0, "11": 52_300, "12": 14_600, "15": 37_700, "16": 4_295, "19": 0,
        "24": 4_295, "25d": 4_100, "26": 0, "27": 0, "28": 0, "29": 0, "32": 0, "33": 4_100, "34": 0, "35a": 0,
        "37": 195,
    }  # fmt: skip
    mfj = gold["mfj-two-w2-children-estimated-tax"]
    # IRS1040's WagesAmt (110,151), not the IRSW2 forms' (68,250 and 41,901) that follow it in ReturnData.
    assert mfj["1a"] == 110_151 and mfj["19"] == 4_500 and mfj["25d"] == 8_071 and mfj["26"] == 1_000
    assert mfj["34"] == mfj["35a"] == 4_318 and mfj["37"] == 0
    hoh = gold["hoh-senior-interest-dividends-long-term-gain"]
    assert hoh["12"] == 23_850 and hoh["16"] == 4_388 and hoh["19"] == 500 and hoh["35a"] == 2_312


def test_engine_agrees_with_the_fixture_gold() -> None:
    for name, inp, gold in load_taxcalcbench(TEST_DATA).cases:
        assert engine_mismatches(inp, gold) == {}, name
        assert compute_1040(inp) == gold


def test_skips_what_the_engine_cannot_represent_and_reports_counts() -> None:
    bench = load_taxcalcbench(TEST_DATA)
    assert set(bench.skipped) == {"hoh-w2-eic-one-child", "single-w2-malformed-wages",
                                  "single-w2-schedule-c-consulting"}  # fmt: skip
    sched_c = bench.skipped["single-w2-schedule-c-consulting"]
    assert sched_c.startswith("not modelled:") and "irs1040_schedulec" in sched_c and "line 10" in sched_c
    assert "line 27 (the earned income credit) is 4089" in bench.skipped["hoh-w2-eic-one-child"]
    malformed = bench.skipped["single-w2-malformed-wages"]
    assert malformed.startswith("malformed:") and "single-w2-malformed-wages/input.json" in malformed
    assert "input.return_data.w2[0].wages.value = '52,3OO'" in malformed
    summary = bench.summary().splitlines()
    assert summary[0] == f"TaxCalcBench {TEST_DATA}: read 3 of 6 cases, skipped 3"
    assert len(summary) == 4 and all(line.startswith("  skipped ") for line in summary[1:])
    assert bench.mismatches == {}


def test_finds_the_cases_from_any_root(tmp_path: Path) -> None:
    repo = tmp_path / "tax-calc-bench"
    shutil.copytree(TEST_DATA, repo / "tax_calc_bench" / "ty24" / "test_data")
    for root in (repo, repo / "tax_calc_bench", repo / "tax_calc_bench" / "ty24", TEST_DATA):
        assert [name for name, _, _ in load_taxcalcbench(root).cases] == READ
    single = load_taxcalcbench(TEST_DATA / "single-w2-basic")  # one case directory
    assert [name for name, _, _ in single.cases] == ["single-w2-basic"] and not single.skipped
    with pytest.raises(FileNotFoundError, match="not found"):
        load_taxcalcbench(tmp_path / "nope")
    (tmp_path / "empty" / "docs").mkdir(parents=True)
    with pytest.raises(
        FileNotFoundError, match=r"no TaxCalcBench case under .*tax_calc_bench/ty24/test_data"
    ):
        load_taxcalcbench(tmp_path / "empty")


def test_dependents_boxes_and_dates(tmp_path: Path) -> None:
    data = {
        "irs1040": {
            "filing_status": "married_jointly", "tp_date_of_birth": "01/01/1960", "tp_blind": False,
            "sp_date_of_birth": "1960/01/02", "sp_blind": True,
            "dependent_detail": [
                {"dependent_date_of_birth": "2008-01-01", "dependent_relationship": "Grand-child"},
                {"dependent_date_of_birth": "2007-12-31", "dependent_relationship": "son"},
                {"dependent_date_of_birth": "2015-06-01", "dependent_relationship": "Other"},
            ],
            "estimated_tax_payment_3": 300, "estimated_tax_payment_4": None, "applied_from_prior_year": 200,
        },
        "w2": {"wages": 90_000, "withholding": 9_000},  # one object stands for a one-item list
    }  # fmt: skip
    # Boxes: taxpayer born 1960-01-01 is 65 at the end of 2024 (born before 1960-01-02); the spouse born on
    # 1960-01-02 is not 65 but blind -> 2. Born 2008-01-01 is under 17 at year end -> child; 2007-12-31 is 17 ->
    # other dependent; "Other" relationship -> other dependent. Line 26 = 300 + 200.
    expected = TaxInput("married_filing_jointly", w2s=((90_000, 9_000),), num_qualifying_children=1,
                        num_other_dependents=2, estimated_payments=500, taxpayer_65_or_blind=2)  # fmt: skip
    _case(tmp_path, "mfj", data, _xml(compute_1040(expected), "2"))
    # Married filing separately: the spouse's boxes do not count (taxpayer born 1950 -> 1 box).
    mfs = {"irs1040": {"filing_status": "married_filing_separately", "tp_date_of_birth": "1950-05-05",
                       "sp_date_of_birth": "1940-01-01", "sp_blind": True}, "w2": BASE["w2"]}  # fmt: skip
    mfs_input = TaxInput("married_filing_separately", w2s=((50_000, 5_000),), taxpayer_65_or_blind=1)
    _case(tmp_path, "mfs", mfs, _xml(compute_1040(mfs_input), "3"))
    bench = load_taxcalcbench(tmp_path)
    assert bench.skipped == {}
    assert dict((n, i) for n, i, _ in bench.cases) == {"mfj": expected, "mfs": mfs_input}


def test_namespace_free_xml_and_odd_files_never_stop_the_others(tmp_path: Path) -> None:
    lines = compute_1040(BASE_INPUT)
    _case(tmp_path, "a-good", xml=_xml(lines, ns=False))  # with or without the efile namespace
    _case(tmp_path, "b-not-xml", xml="<Return><ReturnData>")
    _case(tmp_path, "c-root", xml="<Form><ReturnData><IRS1040/></ReturnData></Form>")
    _case(
        tmp_path,
        "d-no-1040",
        xml="<Return><ReturnData><IRSW2><WagesAmt>1</WagesAmt></IRSW2></ReturnData></Return>",
    )
    _case(tmp_path, "e-cents", xml=_xml({**lines, "16": "4295.50"}))
    _case(tmp_path, "f-twice", xml=_xml(lines).replace("<TaxAmt>", "<TaxAmt>1</TaxAmt><TaxAmt>"))
    _case(tmp_path, "g-status", xml=_xml(lines, status_cd="2"))
    _case(tmp_path, "h-no-xml").joinpath("output.xml").unlink()
    bad_json = _case(tmp_path, "i-bad-json")
    bad_json.joinpath("input.json").write_text("{")
    bench = load_taxcalcbench(tmp_path)
    assert [name for name, _, _ in bench.cases] == ["a-good"] and bench.cases[0][2] == lines
    reasons = bench.skipped
    assert all(r.startswith("malformed: ") for r in reasons.values())
    assert "b-not-xml/output.xml: not well-formed XML" in reasons["b-not-xml"]
    assert "root element is <Form>, expected <Return>" in reasons["c-root"]
    assert "expected one <IRS1040> under <ReturnData>, found 0" in reasons["d-no-1040"]
    assert "/Return/ReturnData/IRS1040/TaxAmt = '4295.50' is not whole dollars" in reasons["e-cents"]
    assert "<TaxAmt> appears twice" in reasons["f-twice"]
    assert (
        "IndividualReturnFilingStatusCd 2 disagrees with input.json's filing status 'single'"
        in reasons["g-status"]
    )
    assert reasons["h-no-xml"] == f"malformed: missing file {tmp_path / 'h-no-xml' / 'output.xml'}"
    assert "i-bad-json/input.json: not valid JSON" in reasons["i-bad-json"]


@pytest.mark.parametrize(
    ("irs1040", "field"),
    [
        ({"filing_status": "married"}, "input.return_data.irs1040.filing_status.value = 'married': use one of"),
        ({"filing_status": "single", "tp_blind": "maybe"}, "irs1040.tp_blind.value = 'maybe' is not true or false"),
        ({"filing_status": "single", "tp_date_of_birth": "17.4.1990"}, "irs1040.tp_date_of_birth.value = '17.4.1990' is not a date"),
        ({"filing_status": "single", "dependent_detail": [{"dependent_relationship": "son"}]},
         "irs1040.dependent_detail[0].dependent_date_of_birth: missing"),
        ({"filing_status": "single", "dependent_detail": [{"dependent_date_of_birth": "2010-01-01",
                                                          "dependent_relationship": "roommate"}]},
         "dependent_detail[0].dependent_relationship.value 'roommate' is not a known relationship"),
    ],
)  # fmt: skip
def test_malformed_input_names_the_field(tmp_path: Path, irs1040: dict, field: str) -> None:
    _case(tmp_path, "c", {"irs1040": irs1040, "w2": BASE["w2"]})
    (reason,) = load_taxcalcbench(tmp_path).skipped.values()
    assert reason.startswith(f"malformed: {tmp_path / 'c' / 'input.json'}: ") and field in reason


def test_malformed_leaves_and_layout(tmp_path: Path) -> None:
    d = _case(tmp_path, "no-input")
    d.joinpath("input.json").write_text(json.dumps({"return_data": {}}))
    d = _case(tmp_path, "no-value")
    d.joinpath("input.json").write_text(json.dumps(
        {"input": {"return_data": {"irs1040": {"filing_status": {"label": "Filing status"}}}}}))  # fmt: skip
    d = _case(tmp_path, "bool-amount")
    d.joinpath("input.json").write_text(json.dumps({"input": {"return_data": _leaves(
        {"irs1040": {"filing_status": "single"}, "w2": [{"wages": True}]})}}))  # fmt: skip
    reasons = load_taxcalcbench(tmp_path).skipped
    assert "expected a JSON object {'input': {'return_header'" in reasons["no-input"]
    assert (
        "irs1040.filing_status: expected a {'label': ..., 'value': ...} leaf, got keys ['label']"
        in reasons["no-value"]
    )
    assert "w2[0].wages.value = True is not a dollar amount" in reasons["bool-amount"]


def _with(**sections: object) -> dict:
    return {**BASE, **sections}


def _w2(**boxes: object) -> list:
    return [{**BASE["w2"][0], **boxes}]


def _sale(term: str, proceeds: float, basis: float, **extra: object) -> dict:
    return {"irs1099_b_grp": [{"irs1099_b": [
        {"input_sale_term": term, "proceeds": proceeds, "cost_basis": basis, **extra}]}]}  # fmt: skip


@pytest.mark.parametrize(
    ("return_data", "reason"),
    [
        (_with(irs1040_schedule1={"irs1099_g": [{"g_unemployment_comp": 4_000}], "student_interest": 0}),
         "irs1040_schedule1 (irs1099_g): Schedule 1 additional income / adjustments"),
        (_with(irs1099_r=[{"gross_distribution_amt_input": 9_000}]), "irs1099_r: Form 1099-R distributions"),
        (_with(ssa_1099={"ssa_1099_grp": [{"ssa_net_benefits": 20_000}]}), "ssa_1099 (ssa_1099_grp): social security"),
        (_with(will_itemize=True), "will_itemize: itemized deductions"),
        (_with(some_new_form={"amount": 12}), "some_new_form (amount): a section this loader does not map"),
        (_with(irs1040={**BASE["irs1040"], "filing_status": "qualifying_widow"}), "qualifying surviving spouse"),
        (_with(irs1040={**BASE["irs1040"], "tp_dependent": True}), "tp_dependent: a filer who can be claimed"),
        (_with(irs8949=_sale("short_term", 5_000, 4_000)), "short-term sale"),
        (_with(irs8949=_sale("long_term", 1_000, 4_000)), "net capital loss -3000"),
        (_with(irs8949=_sale("long_term", 5_000, 4_000, wash_sale_loss=200)), "1099-B wash sale"),
        (_with(irs1040_schedule_d={"lt_capital_loss_carryover_input": 2_500}), "capital loss carryover"),
        (_with(irs1040_scheduleb={"irs1099_int": [{"interest_1099int_interest": 900,
                                                   "interest_1099int_fed_inc_tax_withheld": 90}]}),
         "irs1099_int[0].interest_1099int_fed_inc_tax_withheld: 1099-INT box 4 withholding (line 25b)"),
        (_with(irs1040_scheduleb={"irs1099_div": [{"dividend_1099div_ordinary_div": 900,
                                                   "dividend_1099div_section_199a_dividends": 900}]}),
         "1099-DIV box 5 section 199A dividends"),
        (_with(w2=_w2(employers_use_grp=[{"box_12_code": "a", "box_12_amount": 35}])), "box 12 code A, uncollected"),
        (_with(w2=_w2(allocated_tips=400)), "W-2 box 8 allocated tips"),
        (_with(w2=_w2(dependent_care_benefits=2_000)), "W-2 box 10 dependent care benefits"),
        (_with(w2=_w2(medicare_wages_and_tips=210_000)), "Medicare wages over 200,000 (Form 8959)"),
        # 6.2 % of 168,600 = 10,453.20 is the most one employer withholds; two employers withheld 10,500.
        (_with(w2=[{"wages": 90_000, "ein": "1", "social_security_tax": 5_580},
                   {"wages": 80_000, "ein": "2", "social_security_tax": 4_920}]), "excess social security"),
        # AGI 30,000 <= 38,250 (single): a 401(k) deferral may earn the saver's credit.
        (_with(w2=[{"wages": 30_000, "employers_use_grp": [{"box_12_code": "D", "box_12_amount": 1_500}]}]),
         "saver's credit (Form 8880)"),
    ],
)  # fmt: skip
def test_unmodelled_inputs_are_skipped_with_their_reason(
    tmp_path: Path, return_data: dict, reason: str
) -> None:
    _case(tmp_path, "c", return_data)
    bench = load_taxcalcbench(tmp_path)
    assert (
        bench.cases == [] and bench.skipped["c"].startswith("not modelled: ") and reason in bench.skipped["c"]
    )


def test_harmless_fields_do_not_skip(tmp_path: Path) -> None:
    # Names, codes, zero amounts, false flags, state boxes and tax-exempt interest change no evaluated line.
    data = _with(
        return_header={"state": "AK"},
        irs2441={"received_care": False, "provider_name": "none"},
        w2=_w2(employer_name="Acme", state_wages=50_000, employers_use_grp=[{"box_12_code": "DD", "box_12_amount": 7_000}]),
        irs1040_scheduleb={"irs1099_int": [{"interest_1099int_tax_exempt": 300}], "foreign_accounts_input": True},
    )  # fmt: skip
    _case(tmp_path, "c", data)
    bench = load_taxcalcbench(tmp_path)
    assert bench.skipped == {} and bench.cases[0][1] == BASE_INPUT


def test_cross_check_against_the_engine(tmp_path: Path) -> None:
    lines = compute_1040(BASE_INPUT)
    # 15 = 35,400, 16 = 4,019 (midpoint 35,425), withheld 5,000 -> 34 = 981. The gold refunds nothing (the
    # overpayment went to next year's estimated tax, which the input model cannot say).
    assert lines["34"] == lines["35a"] == 981
    _case(tmp_path, "applied", xml=_xml({**lines, "35a": 0}))
    bench = load_taxcalcbench(tmp_path)
    assert bench.cases == []
    assert (
        bench.skipped["applied"] == "engine differs from output.xml on line(s) 35a (engine 981, output.xml 0)"
    )
    kept = load_taxcalcbench(tmp_path, keep_mismatches=True)
    assert kept.skipped == {} and kept.mismatches == {"applied": {"35a": (981, 0)}}
    assert kept.cases[0][2]["35a"] == 0  # the benchmark's gold is what gets scored
    assert "read applied although differs from output.xml on line(s) 35a" in kept.summary()


def test_formtask_test_split_is_the_readable_benchmark(tmp_path: Path) -> None:
    task = FormTask(taxcalcbench_dir=str(FIXTURES))
    test = task.dataset("test")
    assert len(test) == 3 * len(EVALUATED_LINES)  # 3 readable cases x 19 lines
    assert {row_id.split("/")[0] for row_id in test["id"]} == set(READ)
    assert dict(zip(test["id"], test["gold"]))["single-w2-basic/37"] == 195
    assert len(task.taxcalcbench.skipped) == 3
    only_bad = tmp_path / "bad"
    shutil.copytree(TEST_DATA / "single-w2-malformed-wages", only_bad / "single-w2-malformed-wages")
    with pytest.raises(
        ValueError, match=r"(?s)task\.taxcalcbench_dir=.*no case could be read.*w2\[0\]\.wages"
    ):
        FormTask(taxcalcbench_dir=str(only_bad)).dataset("test")
    with pytest.raises(FileNotFoundError, match=r"task\.taxcalcbench_dir=.*not found"):
        FormTask(taxcalcbench_dir=str(tmp_path / "missing")).dataset("test")
