"""Tests for the synthetic TY2024 Form 1040 engine; expected values are worked by hand from the 2024 figures."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from lit_credit.tasks.form1040 import (
    EVALUATED_LINES,
    TaxInput,
    compute_1040,
    generate_case,
    line_accuracy,
    load_taxcalcbench,
    normalize_line_key,
    parse_dollars,
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
    assert parse_dollars("-$1,234.00") == -1234.0
    assert parse_dollars(True) is None and parse_dollars("nan") is None
    assert normalize_line_key("Line 35a") == "35a" and normalize_line_key("L1a") == "1a"
    with pytest.raises(ValueError):
        line_accuracy(pred, {})


def _write_case(root: Path, name: str, inp: object, expected: object | None) -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "input.json").write_text(json.dumps(inp))
    if expected is not None:
        (d / "expected.json").write_text(json.dumps(expected))


def test_loader_roundtrip(tmp_path: Path) -> None:
    _write_case(
        tmp_path,
        "b_case",
        {"filing_status": "single", "w2s": [{"wages": 50_000, "federal_withholding": 5_000}]},
        {"line_16": 4_019, "L34": "$981", "1a": 50_000},
    )
    _write_case(
        tmp_path, "a_case", {"filing_status": "head_of_household", "w2s": [[20_000, 500]]}, {"35a": 500}
    )
    cases = load_taxcalcbench(tmp_path)
    assert [c[0] for c in cases] == ["a_case", "b_case"]
    _name, inp, gold = cases[1]
    assert inp == TaxInput("single", w2s=((50_000, 5_000),))
    assert gold == {"16": 4_019, "34": 981, "1a": 50_000}
    assert line_accuracy(compute_1040(inp), gold) == 1.0


def test_loader_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope"):
        load_taxcalcbench(tmp_path / "nope")
    _write_case(tmp_path / "r1", "c1", {"filing_status": "single"}, None)
    with pytest.raises(FileNotFoundError, match=r"expected\.json"):
        load_taxcalcbench(tmp_path / "r1")
    _write_case(tmp_path / "r2", "c2", {"filing_status": "single", "wages": 1}, {"16": 0})
    with pytest.raises(ValueError, match=r"'c2'.*'wages'.*fix"):
        load_taxcalcbench(tmp_path / "r2")
    _write_case(tmp_path / "r3", "c3", {"w2s": []}, {"16": 0})
    with pytest.raises(ValueError, match="filing_status"):
        load_taxcalcbench(tmp_path / "r3")
    _write_case(tmp_path / "r4", "c4", {"filing_status": "single"}, {"16": "12.5"})
    with pytest.raises(ValueError, match="whole dollars"):
        load_taxcalcbench(tmp_path / "r4")


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
