"""Synthetic tax-year-2024 US Form 1040 engine (pure Python, no ML).

Computes the Form 1040 lines that TaxCalcBench evaluates (:data:`EVALUATED_LINES`) for a deliberately small
input model (:class:`TaxInput`), generates random cases of graded difficulty (:func:`generate_case`), reads
the public TaxCalcBench TY2024 cases (``<case>/input.json`` + ``<case>/output.xml``, :func:`load_taxcalcbench`:
the cases the input model can represent, a reason for each other one, and a cross-check of the engine against
the benchmark's gold) and scores predicted lines strictly (exact dollars) or leniently (within $5)
(:func:`score_lines`, :func:`line_accuracy`).

TY2024 figures used (Rev. Proc. 2023-34 and the 2024 Form 1040 instructions / Schedule 8812):

* standard deduction 14,600 single / MFS, 29,200 MFJ, 21,900 HoH; additional standard deduction per
  65-or-blind box 1,950 (single, HoH) or 1,550 (MFJ, MFS);
* ordinary brackets 10/12/22/24/32/35/37 % with the thresholds in :data:`BRACKETS`;
* qualified dividends and capital gain tax worksheet: 0 % up to 47,025 single / MFS, 94,050 MFJ, 63,000 HoH;
  15 % up to 518,900 single, 583,750 MFJ, 291,850 MFS, 551,350 HoH; 20 % above;
* child tax credit 2,000 per qualifying child, credit for other dependents 500 each, reduced by 50 per 1,000
  (or part of 1,000) of AGI above 200,000 (400,000 MFJ); refundable additional child tax credit at most
  1,700 per qualifying child, 15 % of earned income above 2,500.

Rounding: every line is rounded to whole dollars, half up (0.50 -> 1), as the form allows. The tax on an
amount under 100,000 follows the official Tax Table, i.e. the bracket formula applied to the midpoint of the
table row: 0 below $5; rows $5-15 and $15-25 (midpoints 10 and 20); $25 rows from $25 to $3,000 (midpoint =
row start + 12.50); $50 rows from $3,000 to $100,000 (midpoint = row start + 25). From 100,000 up the exact
bracket formula (Tax Computation Worksheet) is used. TaxCalcBench's gold values follow the official return,
hence the table rule.

Not modelled (their lines are 0 or the feature is simply absent): adjustments to income (line 10 = 0),
itemized deductions, the QBI deduction (line 13 = 0), Schedule 2 taxes (AMT, self-employment tax, additional
Medicare tax, NIIT, ...), credits other than the child tax credit / credit for other dependents (line 20 = 0),
the earned income credit (line 27 = 0), the American opportunity credit (line 29 = 0), other refundable credits
(line 31 = 0), capital losses and short-term gains (line 7 is a net long-term gain >= 0), social security
benefits, IRA / pension distributions, self-employment income, the "3 or more children" alternative ACTC
computation based on social security tax (Schedule 8812 Part II-B), dependents' eligibility rules, and applying
part of an overpayment to next year (line 36 = 0, so line 35a = line 34).
"""

from __future__ import annotations

import json
import logging
import math
import random
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from lit_credit.rewards.form_line import parse_dollars

__all__ = [
    "ADDITIONAL_STANDARD_DEDUCTION",
    "BRACKETS",
    "EVALUATED_LINES",
    "FILING_STATUSES",
    "MEF_LINE_ELEMENTS",
    "QUALIFIED_0_PCT_LIMIT",
    "QUALIFIED_15_PCT_LIMIT",
    "STANDARD_DEDUCTION",
    "TaxCalcBench",
    "TaxInput",
    "compute_1040",
    "engine_mismatches",
    "generate_case",
    "line_accuracy",
    "load_taxcalcbench",
    "normalize_line_key",
    "score_lines",
    "tax_on_income",
]

_log = logging.getLogger(__name__)

FILING_STATUSES: tuple[str, ...] = (
    "single",
    "married_filing_jointly",
    "married_filing_separately",
    "head_of_household",
)

#: Form 1040 lines evaluated by TaxCalcBench; :func:`compute_1040` returns exactly these keys.
EVALUATED_LINES: tuple[str, ...] = (
    "1a", "9", "10", "11", "12", "15", "16", "19", "24", "25d",
    "26", "27", "28", "29", "32", "33", "34", "35a", "37",
)  # fmt: skip

STANDARD_DEDUCTION: dict[str, int] = {
    "single": 14_600,
    "married_filing_jointly": 29_200,
    "married_filing_separately": 14_600,
    "head_of_household": 21_900,
}

#: Additional standard deduction per 65-or-older / blind box checked.
ADDITIONAL_STANDARD_DEDUCTION: dict[str, int] = {
    "single": 1_950,
    "married_filing_jointly": 1_550,
    "married_filing_separately": 1_550,
    "head_of_household": 1_950,
}

_RATES: tuple[float, ...] = (0.10, 0.12, 0.22, 0.24, 0.32, 0.35, 0.37)

#: Upper thresholds of the 10/12/22/24/32/35 % brackets (37 % above the last).
BRACKETS: dict[str, tuple[int, ...]] = {
    "single": (11_600, 47_150, 100_525, 191_950, 243_725, 609_350),
    "married_filing_jointly": (23_200, 94_300, 201_050, 383_900, 487_450, 731_200),
    "married_filing_separately": (11_600, 47_150, 100_525, 191_950, 243_725, 365_600),
    "head_of_household": (16_550, 63_100, 100_500, 191_950, 243_700, 609_350),
}

#: Qualified dividends and capital gain tax worksheet, line 6 (top of the 0 % band).
QUALIFIED_0_PCT_LIMIT: dict[str, int] = {
    "single": 47_025,
    "married_filing_jointly": 94_050,
    "married_filing_separately": 47_025,
    "head_of_household": 63_000,
}

#: Qualified dividends and capital gain tax worksheet, line 13 (top of the 15 % band).
QUALIFIED_15_PCT_LIMIT: dict[str, int] = {
    "single": 518_900,
    "married_filing_jointly": 583_750,
    "married_filing_separately": 291_850,
    "head_of_household": 551_350,
}

CTC_PER_CHILD = 2_000
ODC_PER_DEPENDENT = 500
ACTC_PER_CHILD = 1_700
ACTC_EARNED_INCOME_FLOOR = 2_500
ACTC_RATE = Decimal("0.15")
CTC_PHASEOUT_START: dict[str, int] = {
    "single": 200_000,
    "married_filing_jointly": 400_000,
    "married_filing_separately": 200_000,
    "head_of_household": 200_000,
}
CTC_PHASEOUT_PER_1000 = 50


def _round(x: Decimal | float | int) -> int:
    """Round to whole dollars, half up (e.g. 712.50 -> 713, -0.5 -> -1)."""
    return int(Decimal(str(x)).quantize(Decimal(1), rounding=ROUND_HALF_UP))


@dataclass(frozen=True)
class TaxInput:
    """The inputs of one synthetic (or TaxCalcBench) return. Amounts are US dollars (cents allowed).

    Attributes:
        filing_status: one of :data:`FILING_STATUSES`.
        w2s: ``(wages [box 1], federal income tax withheld [box 2])`` per Form W-2.
        taxable_interest: Form 1040 line 2b.
        ordinary_dividends: line 3b.
        qualified_dividends: line 3a, at most ``ordinary_dividends``.
        capital_gain: line 7, a net long-term capital gain (Schedule D lines 15/16 style), must be >= 0
            (losses and short-term gains are not modelled).
        num_qualifying_children: children under 17 qualifying for the child tax credit.
        num_other_dependents: other dependents (credit for other dependents, 500 each).
        estimated_payments: 2024 estimated tax payments (line 26).
        taxpayer_65_or_blind: number of 65-or-older / blind boxes checked (0-2; 0-4 for married filing
            jointly, which counts the spouse's boxes too); each adds
            :data:`ADDITIONAL_STANDARD_DEDUCTION` to the standard deduction.
    """

    filing_status: str
    w2s: tuple[tuple[float, float], ...] = ()
    taxable_interest: float = 0
    ordinary_dividends: float = 0
    qualified_dividends: float = 0
    capital_gain: float = 0
    num_qualifying_children: int = 0
    num_other_dependents: int = 0
    estimated_payments: float = 0
    taxpayer_65_or_blind: int = 0

    def __post_init__(self) -> None:
        if self.filing_status not in FILING_STATUSES:
            raise ValueError(f"filing_status {self.filing_status!r} is not one of {FILING_STATUSES}")
        w2s = tuple(tuple(w) for w in self.w2s)
        for w in w2s:
            if len(w) != 2 or any(not _is_number(v) or v < 0 for v in w):
                raise ValueError(
                    f"each W-2 must be a (wages, federal_withholding) pair of numbers >= 0, got {w!r}"
                )
        object.__setattr__(self, "w2s", w2s)
        for name in ("taxable_interest", "ordinary_dividends", "qualified_dividends", "capital_gain",
                     "estimated_payments"):  # fmt: skip
            value = getattr(self, name)
            if not _is_number(value) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if self.qualified_dividends > self.ordinary_dividends:
            raise ValueError(
                f"qualified_dividends ({self.qualified_dividends}) cannot exceed ordinary_dividends "
                f"({self.ordinary_dividends})"
            )
        for name in ("num_qualifying_children", "num_other_dependents", "taxpayer_65_or_blind"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        max_boxes = 4 if self.filing_status == "married_filing_jointly" else 2
        if self.taxpayer_65_or_blind > max_boxes:
            raise ValueError(
                f"taxpayer_65_or_blind must be at most {max_boxes} for {self.filing_status}, "
                f"got {self.taxpayer_65_or_blind}"
            )


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _bracket_tax(amount: Decimal, filing_status: str) -> Decimal:
    """Exact bracket formula: sum over brackets of rate * (part of ``amount`` inside the bracket)."""
    tax = Decimal(0)
    lower = Decimal(0)
    for rate, upper in zip(_RATES, (*BRACKETS[filing_status], None)):
        top = amount if upper is None else min(amount, Decimal(upper))
        if top > lower:
            tax += Decimal(str(rate)) * (top - lower)
        if upper is None or amount <= upper:
            break
        lower = Decimal(upper)
    return tax


def _tax_table_midpoint(amount: int) -> Decimal | None:
    """Midpoint of the 2024 Tax Table row holding ``amount`` (< 100,000); ``None`` for the $0-5 row."""
    if amount < 5:
        return None
    if amount < 15:
        return Decimal(10)
    if amount < 25:
        return Decimal(20)
    if amount < 3_000:
        return Decimal(amount - (amount - 25) % 25) + Decimal("12.5")
    return Decimal(amount - amount % 50 + 25)


def tax_on_income(amount: float | int, filing_status: str) -> int:
    """Whole-dollar 2024 regular tax on a taxable amount, as the form computes it.

    ``amount`` is first rounded to whole dollars. Below 100,000 the Tax Table applies: tax =
    round(bracket_formula(row midpoint)), 0 for amounts under $5. From 100,000 up: round(bracket_formula(amount)).
    """
    if filing_status not in BRACKETS:
        raise ValueError(f"filing_status {filing_status!r} is not one of {FILING_STATUSES}")
    whole = max(0, _round(amount))
    if whole < 100_000:
        mid = _tax_table_midpoint(whole)
        return 0 if mid is None else _round(_bracket_tax(mid, filing_status))
    return _round(_bracket_tax(Decimal(whole), filing_status))


def _qualified_dividends_worksheet(taxable: int, qualified: int, gain: int, status: str) -> int:
    """2024 Qualified Dividends and Capital Gain Tax Worksheet (lines 1-25), each line in whole dollars."""
    l1, l2, l3 = taxable, qualified, gain
    l4 = l2 + l3
    l5 = max(0, l1 - l4)
    l6 = QUALIFIED_0_PCT_LIMIT[status]
    l7 = min(l1, l6)
    l8 = min(l5, l7)
    l9 = l7 - l8  # taxed at 0 %
    l10 = min(l1, l4)
    l11 = l9
    l12 = l10 - l11
    l13 = QUALIFIED_15_PCT_LIMIT[status]
    l14 = min(l1, l13)
    l15 = l5 + l9
    l16 = max(0, l14 - l15)
    l17 = min(l12, l16)
    l18 = _round(Decimal(l17) * Decimal("0.15"))
    l19 = l9 + l17
    l20 = l10 - l19
    l21 = _round(Decimal(l20) * Decimal("0.20"))
    l22 = tax_on_income(l5, status)
    l23 = l18 + l21 + l22
    l24 = tax_on_income(l1, status)
    return min(l23, l24)


def compute_1040(inp: TaxInput) -> dict[str, int]:
    """The :data:`EVALUATED_LINES` of the 2024 Form 1040 for ``inp``, in whole dollars.

    Formulas (every line rounded half up to whole dollars):

    * 1a = sum of W-2 wages; 9 = 1a + 2b (interest) + 3b (ordinary dividends) + 7 (capital gain);
      10 = 0; 11 (AGI) = 9 - 10;
    * 12 = standard deduction + additional standard deduction * ``taxpayer_65_or_blind``;
    * 15 = max(0, 11 - 12 - 13) with 13 (QBI) = 0;
    * 16 = qualified dividends and capital gain tax worksheet if 3a > 0 or 7 > 0, else
      :func:`tax_on_income` (15) (Tax Table below 100,000);
    * Schedule 8812: credit = 2,000 * children + 500 * other dependents, minus 50 per 1,000 or part of AGI
      above 200,000 (400,000 MFJ), floored at 0; 19 = min(credit, 18) with 18 = 16 (no Schedule 2 taxes);
    * 24 = max(0, 16 - 19) (line 22; lines 20 and 23 are 0);
    * 25d = sum of W-2 withholding; 26 = estimated payments; 27 (EIC) = 0; 29 = 0;
    * 28 (ACTC, simple form) = min(credit - 19, 1,700 * children, 15% * max(0, 1a - 2,500)), 0 with no children;
    * 32 = 27 + 28 + 29 (+ 31 = 0); 33 = 25d + 26 + 32;
    * 34 = max(0, 33 - 24); 35a = 34; 37 = max(0, 24 - 33).
    """
    status = inp.filing_status
    line1a = _round(sum(Decimal(str(w)) for w, _ in inp.w2s))
    line2b = _round(inp.taxable_interest)
    line3a = _round(inp.qualified_dividends)
    line3b = _round(inp.ordinary_dividends)
    line7 = _round(inp.capital_gain)
    line9 = line1a + line2b + line3b + line7
    line10 = 0
    line11 = line9 - line10
    line12 = STANDARD_DEDUCTION[status] + ADDITIONAL_STANDARD_DEDUCTION[status] * inp.taxpayer_65_or_blind
    line13 = 0
    line15 = max(0, line11 - line12 - line13)
    if line3a > 0 or line7 > 0:
        line16 = _qualified_dividends_worksheet(line15, line3a, line7, status)
    else:
        line16 = tax_on_income(line15, status)
    line18 = line16

    # Schedule 8812, Part I.
    credit = CTC_PER_CHILD * inp.num_qualifying_children + ODC_PER_DEPENDENT * inp.num_other_dependents
    excess = max(0, line11 - CTC_PHASEOUT_START[status])
    reduction = CTC_PHASEOUT_PER_1000 * math.ceil(excess / 1_000)
    credit_after_phaseout = max(0, credit - reduction)
    line19 = min(credit_after_phaseout, line18)
    # Schedule 8812, Part II-A (simple form).
    line28 = 0
    if inp.num_qualifying_children > 0:
        unused = credit_after_phaseout - line19
        earned = max(0, line1a - ACTC_EARNED_INCOME_FLOOR)
        line28 = min(unused, ACTC_PER_CHILD * inp.num_qualifying_children, _round(ACTC_RATE * earned))

    line22 = max(0, line18 - line19)
    line24 = line22
    line25d = _round(sum(Decimal(str(wh)) for _, wh in inp.w2s))
    line26 = _round(inp.estimated_payments)
    line27 = 0
    line29 = 0
    line32 = line27 + line28 + line29
    line33 = line25d + line26 + line32
    line34 = max(0, line33 - line24)
    line35a = line34
    line37 = max(0, line24 - line33)
    lines = {
        "1a": line1a, "9": line9, "10": line10, "11": line11, "12": line12, "15": line15, "16": line16,
        "19": line19, "24": line24, "25d": line25d, "26": line26, "27": line27, "28": line28, "29": line29,
        "32": line32, "33": line33, "34": line34, "35a": line35a, "37": line37,
    }  # fmt: skip
    assert tuple(lines) == EVALUATED_LINES
    return lines


# --------------------------------------------------------------------------------------------- generation


def _money(rng: random.Random, low: int, high: int, step: int = 1) -> int:
    return rng.randrange(low, high + 1, step)


def generate_case(rng: random.Random, difficulty: int) -> TaxInput:
    """A random 2024 return; deterministic for a seeded ``rng``.

    * difficulty 1: single filer, one W-2 (wages 8,000-150,000, withholding 5-15 % of wages), nothing else;
    * difficulty 2: any filing status, 1-2 W-2s, plus taxable interest and/or ordinary (non-qualified)
      dividends, other dependents possible;
    * difficulty 3: 1-3 W-2s, any filing status, qualified dividends (part of ordinary dividends), long-term
      capital gains, 0-3 qualifying children, other dependents, estimated payments, 65-or-blind boxes.
    """
    if difficulty not in (1, 2, 3):
        raise ValueError(f"difficulty must be 1, 2 or 3, got {difficulty!r}")

    def w2() -> tuple[int, int]:
        wages = _money(rng, 8_000, 150_000, 50)
        return wages, round(wages * rng.uniform(0.05, 0.15))

    if difficulty == 1:
        return TaxInput(filing_status="single", w2s=(w2(),))
    status = rng.choice(FILING_STATUSES)
    if difficulty == 2:
        w2s = tuple(w2() for _ in range(rng.randint(1, 2)))
        interest = _money(rng, 0, 5_000) if rng.random() < 0.8 else 0
        dividends = _money(rng, 0, 8_000) if rng.random() < 0.6 else 0
        if interest == 0 and dividends == 0:
            interest = _money(rng, 1, 5_000)
        return TaxInput(
            filing_status=status,
            w2s=w2s,
            taxable_interest=interest,
            ordinary_dividends=dividends,
            num_other_dependents=rng.randint(0, 1) if status != "single" else 0,
        )
    w2s = tuple(w2() for _ in range(rng.randint(1, 3)))
    ordinary = _money(rng, 500, 20_000)
    qualified = _money(rng, 0, ordinary)
    max_boxes = 4 if status == "married_filing_jointly" else 2
    boxes = rng.randint(0, max_boxes) if rng.random() < 0.2 else 0
    return TaxInput(
        filing_status=status,
        w2s=w2s,
        taxable_interest=_money(rng, 0, 6_000),
        ordinary_dividends=ordinary,
        qualified_dividends=qualified,
        capital_gain=_money(rng, 0, 50_000) if rng.random() < 0.7 else 0,
        num_qualifying_children=rng.randint(0, 3) if status != "single" else 0,
        num_other_dependents=rng.randint(0, 2) if status != "single" else 0,
        estimated_payments=_money(rng, 0, 10_000, 100) if rng.random() < 0.5 else 0,
        taxpayer_65_or_blind=boxes,
    )


# ------------------------------------------------------------------------------------------------ loading

#: The MeF element under ``/Return/ReturnData/IRS1040/`` that holds each evaluated line in a TaxCalcBench
#: ``output.xml`` (the benchmark's own line -> XPath table); an absent element is 0.
MEF_LINE_ELEMENTS: dict[str, str] = {
    "1a": "WagesAmt", "9": "TotalIncomeAmt", "10": "TotalAdjustmentsAmt", "11": "AdjustedGrossIncomeAmt",
    "12": "TotalItemizedOrStandardDedAmt", "15": "TaxableIncomeAmt", "16": "TaxAmt", "19": "CTCODCAmt",
    "24": "TotalTaxAmt", "25d": "WithholdingTaxAmt", "26": "EstimatedTaxPaymentsAmt",
    "27": "EarnedIncomeCreditAmt", "28": "AdditionalChildTaxCreditAmt", "29": "RefundableAmerOppCreditAmt",
    "32": "RefundableCreditsAmt", "33": "TotalPaymentsAmt", "34": "OverpaidAmt", "35a": "RefundAmt",
    "37": "OwedAmt",
}  # fmt: skip
assert tuple(MEF_LINE_ELEMENTS) == EVALUATED_LINES

_MEF_FILING_STATUS = {"1": "single", "2": "married_filing_jointly", "3": "married_filing_separately",
                      "4": "head_of_household", "5": "qualifying_surviving_spouse"}  # fmt: skip
_FILING_STATUS = {
    "single": "single", "married_jointly": "married_filing_jointly",
    "married_filing_jointly": "married_filing_jointly", "married_separately": "married_filing_separately",
    "married_filing_separately": "married_filing_separately", "head_of_household": "head_of_household",
    "qualifying_widow": "qualifying_surviving_spouse", "qualifying_widower": "qualifying_surviving_spouse",
    "qualifying_surviving_spouse": "qualifying_surviving_spouse",
}  # fmt: skip
# Relationships of a qualifying child (IRC 152(c)(2)); the others listed make a dependent an "other dependent".
_CHILD_RELATIONSHIPS = {
    "son", "daughter", "child", "stepchild", "stepson", "stepdaughter", "fosterchild", "adoptedchild",
    "brother", "sister", "halfbrother", "halfsister", "stepbrother", "stepsister", "grandchild", "grandson",
    "granddaughter", "niece", "nephew",
}  # fmt: skip
_OTHER_RELATIONSHIPS = {
    "parent", "mother", "father", "stepparent", "stepmother", "stepfather", "grandparent", "grandmother",
    "grandfather", "aunt", "uncle", "cousin", "inlaw", "soninlaw", "daughterinlaw", "fatherinlaw",
    "motherinlaw", "brotherinlaw", "sisterinlaw", "otherrelative", "other", "none",
}  # fmt: skip
_BORN_BEFORE_65 = date(1960, 1, 2)  # 65 or older at the end of 2024
_BORN_FROM_UNDER_17 = date(2008, 1, 1)  # under 17 at the end of 2024 (child tax credit)
_UNCOLLECTED_TAX_CODES = {"A", "B", "M", "N"}  # W-2 box 12: uncollected SS / Medicare tax
_DEFERRAL_CODES = {"D", "E", "F", "G", "H", "S", "AA", "BB", "EE"}  # W-2 box 12: elective deferrals
_SAVERS_CREDIT_AGI_LIMIT = {"single": 38_250, "married_filing_jointly": 76_500,
                            "married_filing_separately": 38_250, "head_of_household": 57_375}  # fmt: skip
_ADDITIONAL_MEDICARE_THRESHOLD = {"single": 200_000, "married_filing_jointly": 250_000,
                                  "married_filing_separately": 125_000, "head_of_household": 200_000}  # fmt: skip
_SOCIAL_SECURITY_TAX_MAX = Decimal("10453.20")  # 6.2 % of the 2024 wage base 168,600

# Sections of ``return_data`` this loader maps; any other section that holds a non-zero amount or a true flag
# makes the case unrepresentable (what it stands for, where known).
_MAPPED_SECTIONS = frozenset({"irs1040", "w2", "irs1040_scheduleb", "irs8949", "irs1040_schedule_d"})
_UNMODELLED_SECTIONS = {
    "irs1040_schedule1": "Schedule 1 additional income / adjustments",
    "irs1040_schedule3": "Schedule 3 credits / payments",
    "irs1040_schedulec": "Schedule C business income",
    "irs1099_r": "Form 1099-R distributions",
    "ssa_1099": "social security benefits (SSA-1099)",
    "irs8863": "education credits (Form 8863)",
    "irs2441": "child and dependent care (Form 2441)",
    "irs8962": "premium tax credit (Form 8962)",
    "irs8995a_schedulec": "QBI deduction (Form 8995-A)",
    "depreciation": "depreciation (Form 4562)",
    "will_itemize": "itemized deductions (Schedule A)",
    "received_form_1099K": "Form 1099-K payments",
}
# Non-zero amounts on mapped forms that the engine cannot carry: (key, what it needs).
_INT_UNMODELLED = (
    ("interest_1099int_early_withdrawal", "1099-INT box 2 early withdrawal penalty (an adjustment)"),
    ("interest_1099int_fed_inc_tax_withheld", "1099-INT box 4 withholding (line 25b)"),
    ("interest_1099int_foreign_taxes_paid", "1099-INT box 6 foreign tax (foreign tax credit)"),
    ("interest_1099int_market_discount", "1099-INT box 10 market discount"),
    ("interest_1099int_bond_premium", "1099-INT box 11 bond premium"),
    ("interest_1099int_bond_premium_treasury_obligations", "1099-INT box 12 bond premium"),
)
_DIV_UNMODELLED = (
    (
        "dividend_1099div_unrecap_sec_1250_gain",
        "1099-DIV box 2b unrecaptured 1250 gain (Schedule D worksheet)",
    ),
    ("dividend_1099div_section_1202_gain", "1099-DIV box 2c section 1202 gain"),
    ("dividend_1099div_collectibles_gain", "1099-DIV box 2d 28 % gain (Schedule D worksheet)"),
    ("dividend_1099div_federal_inc_tax_withheld", "1099-DIV box 4 withholding (line 25b)"),
    ("dividend_1099div_section_199a_dividends", "1099-DIV box 5 section 199A dividends (QBI deduction)"),
    ("dividend_1099div_foreign_tax_paid", "1099-DIV box 7 foreign tax (foreign tax credit)"),
)
_W2_UNMODELLED = (
    ("allocated_tips", "W-2 box 8 allocated tips (Form 4137)"),
    ("dependent_care_benefits", "W-2 box 10 dependent care benefits (Form 2441)"),
)
_SCHEDULE_B_READ = {"irs1099_int", "irs1099_div", "foreign_accounts_input", "foreign_trust_input"}
_B_UNMODELLED = (
    ("wash_sale_loss", "1099-B wash sale adjustment"),
    ("accrued_market_discount", "1099-B accrued market discount"),
    ("fed_inc_tax_wh", "1099-B withholding (line 25b)"),
)
# Gold lines the engine fixes, and what a non-zero value there means.
_FIXED_LINES = {"10": "adjustments to income", "27": "the earned income credit",
                "29": "the American opportunity credit"}  # fmt: skip
_READ_ELEMENTS = {*MEF_LINE_ELEMENTS.values(), "IndividualReturnFilingStatusCd"}


_RD = "input.return_data"


class _Malformed(ValueError):
    """A file that does not have the TaxCalcBench layout (message names the file and the field)."""


class _Unmodelled(Exception):
    """A well-formed case holding something the engine cannot represent (args: the reasons)."""


@dataclass(frozen=True)
class TaxCalcBench:
    """What :func:`load_taxcalcbench` read from a TaxCalcBench ``test_data`` directory.

    Attributes:
        root: the directory whose sub-directories are the cases.
        cases: ``(case_name, TaxInput, {line: gold dollars})`` per case read, sorted by name; gold from
            ``output.xml``.
        skipped: ``{case_name: reason}`` for every other case directory: ``"not modelled: ..."`` (the input
            holds a form or amount the engine cannot represent, or ``output.xml`` has a non-zero line the
            engine fixes at 0), ``"engine differs from output.xml on line(s) ..."`` (cross-check) or
            ``"malformed: <file>: <field>: ..."``.
        mismatches: ``{case_name: {line: (engine, gold)}}`` for the cases read although the engine's
            :func:`compute_1040` differs from their gold (only with ``keep_mismatches=True``).
    """

    root: Path
    cases: list[tuple[str, TaxInput, dict[str, int]]]
    skipped: dict[str, str]
    mismatches: dict[str, dict[str, tuple[int, int]]]

    def summary(self) -> str:
        """``"TaxCalcBench <root>: read 3 of 6 cases, skipped 3"`` then one line per skipped or mismatched case."""
        total = len(self.cases) + len(self.skipped)
        head = (
            f"TaxCalcBench {self.root}: read {len(self.cases)} of {total} cases, skipped {len(self.skipped)}"
        )
        lines = [head, *(f"  skipped {name}: {why}" for name, why in sorted(self.skipped.items()))]
        lines += [
            f"  read {name} although {_describe_mismatch(diff)}"
            for name, diff in sorted(self.mismatches.items())
        ]
        return "\n".join(lines)


def load_taxcalcbench(directory: str | Path, keep_mismatches: bool = False) -> TaxCalcBench:
    """Read the TY2024 cases of the public TaxCalcBench benchmark (column-tax/tax-calc-bench).

    ``directory`` is the cases directory (``tax_calc_bench/ty24/test_data``), a directory above it (the
    repository root, ``tax_calc_bench`` or ``ty24``) or a single case directory. Each case is
    ``<case>/input.json`` + ``<case>/output.xml``:

    * ``input.json`` = ``{"input": {"return_header": {...}, "return_data": {...}}}``, every value a
      ``{"label": ..., "value": ...}`` leaf, one section per form. Mapped: ``irs1040`` (``filing_status``,
      ``tp_/sp_date_of_birth`` and ``tp_/sp_blind`` -> 65-or-blind boxes, the spouse's only when married
      filing jointly; ``dependent_detail[]`` -> a qualifying child when born in 2008 or later with a child
      relationship, else an other dependent; ``estimated_tax_payment_1..4`` + ``applied_from_prior_year`` ->
      line 26), ``w2[]`` (``wages``, ``withholding``), ``irs1040_scheduleb.irs1099_int[]`` (boxes 1 + 3 ->
      taxable interest), ``irs1040_scheduleb.irs1099_div[]`` (1a ordinary, 1b qualified, 2a -> capital gain),
      ``irs8949.irs1099_b_grp[].irs1099_b[]`` (long-term ``proceeds - cost_basis`` -> capital gain);
    * ``output.xml`` = the IRS MeF return; line ``l`` is the integer in
      ``/Return/ReturnData/IRS1040/<MEF_LINE_ELEMENTS[l]>`` (elements matched by local name, with or
      without the ``http://www.irs.gov/efile`` namespace), 0 when the element is absent.

    A case is skipped, with its reason in :attr:`TaxCalcBench.skipped`, when its input holds what the engine
    cannot represent (another section with a non-zero amount or true flag, e.g. Schedule C, Schedule 1,
    1099-R, SSA-1099; a qualifying surviving spouse; a filer who can be claimed as a dependent; short-term
    sales, a net capital loss, 1099 withholding, foreign tax, box 12 codes A/B/M/N, excess social security,
    Additional Medicare Tax, allocated tips, dependent care benefits, possible saver's credit), when
    ``output.xml`` has a non-zero line 10, 27 or 29 (adjustments, EIC, AOTC: fixed at 0 by the engine),
    when a file is malformed (the reason names the file and the field), or, unless ``keep_mismatches``,
    when :func:`compute_1040` disagrees with ``output.xml`` on any line (cross-check; with
    ``keep_mismatches`` the case is read and the difference recorded in :attr:`TaxCalcBench.mismatches`).
    One odd case never stops the others. Raises ``FileNotFoundError`` only when ``directory`` holds no
    case directory at all.
    """
    root = _cases_root(Path(directory))
    case_dirs = [root] if _is_case_dir(root) else sorted(p for p in root.iterdir() if _is_case_dir(p))
    cases: list[tuple[str, TaxInput, dict[str, int]]] = []
    skipped: dict[str, str] = {}
    mismatches: dict[str, dict[str, tuple[int, int]]] = {}
    for case_dir in case_dirs:
        name = case_dir.name
        try:
            inp, gold = _read_case(case_dir)
        except _Malformed as e:
            skipped[name] = f"malformed: {e}"
            continue
        except _Unmodelled as e:
            skipped[name] = "not modelled: " + "; ".join(e.args)
            continue
        diff = engine_mismatches(inp, gold)
        if diff and not keep_mismatches:
            skipped[name] = "engine " + _describe_mismatch(diff)
            continue
        if diff:
            mismatches[name] = diff
        cases.append((name, inp, gold))
    bench = TaxCalcBench(root, cases, skipped, mismatches)
    _log.info(bench.summary())
    return bench


def engine_mismatches(inp: TaxInput, gold: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """``{line: (engine, gold)}`` for each gold line where :func:`compute_1040` (``inp``) differs."""
    lines = compute_1040(inp)
    return {k: (lines[k], int(v)) for k, v in gold.items() if k in lines and lines[k] != int(v)}


def _describe_mismatch(diff: Mapping[str, tuple[int, int]]) -> str:
    parts = ", ".join(f"{k} (engine {e}, output.xml {g})" for k, (e, g) in diff.items())
    return f"differs from output.xml on line(s) {parts}"


def _is_case_dir(p: Path) -> bool:
    return (
        p.is_dir()
        and not p.name.startswith(".")
        and ((p / "input.json").exists() or (p / "output.xml").exists())
    )


def _cases_root(path: Path) -> Path:
    if not path.is_dir():
        raise FileNotFoundError(f"TaxCalcBench directory not found: {path}")
    for candidate in (path, path / "test_data", path / "ty24" / "test_data",
                      path / "tax_calc_bench" / "ty24" / "test_data"):  # fmt: skip
        if candidate.is_dir() and (_is_case_dir(candidate) or any(map(_is_case_dir, candidate.iterdir()))):
            return candidate
    raise FileNotFoundError(
        f"no TaxCalcBench case under {path}: expected <case>/input.json + <case>/output.xml there, or the "
        f"tax-calc-bench checkout (its tax_calc_bench/ty24/test_data)"
    )


def _read_case(case_dir: Path) -> tuple[TaxInput, dict[str, int]]:
    """The case's TaxInput and gold lines; ``_Malformed`` or ``_Unmodelled`` otherwise."""
    input_path, xml_path = case_dir / "input.json", case_dir / "output.xml"
    for path in (input_path, xml_path):
        if not path.is_file():
            raise _Malformed(f"missing file {path}")
    gold, xml_status = _read_output_xml(xml_path)
    try:
        data = json.loads(input_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _Malformed(f"{input_path}: not valid JSON ({e})") from e
    try:
        inp, status, reasons = _map_input(data)
    except _Malformed as e:
        raise _Malformed(f"{input_path}: {e}") from e
    if xml_status is not None and _MEF_FILING_STATUS.get(xml_status) != status:
        raise _Malformed(
            f"{xml_path}: IndividualReturnFilingStatusCd {xml_status} disagrees with input.json's filing "
            f"status {status!r}"
        )
    reasons += [f"line {k} ({what}) is {gold[k]} in output.xml; the engine has none" for k, what in
                _FIXED_LINES.items() if gold[k] != 0]  # fmt: skip
    if reasons:
        raise _Unmodelled(*reasons)
    return inp, gold


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _only_child(parent: ET.Element, name: str, path: Path) -> ET.Element:
    found = [c for c in parent if _local(c.tag) == name]
    if len(found) != 1:
        raise _Malformed(f"{path}: expected one <{name}> under <{_local(parent.tag)}>, found {len(found)}")
    return found[0]


def _read_output_xml(path: Path) -> tuple[dict[str, int], str | None]:
    """Gold ``{line: dollars}`` for every evaluated line (absent element = 0) and the filing-status code."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        raise _Malformed(f"{path}: not well-formed XML ({e})") from e
    if _local(root.tag) != "Return":
        raise _Malformed(f"{path}: the root element is <{_local(root.tag)}>, expected <Return>")
    form = _only_child(_only_child(root, "ReturnData", path), "IRS1040", path)
    values: dict[str, str] = {}
    for child in form:
        name = _local(child.tag)
        if name in values and name in _READ_ELEMENTS:
            raise _Malformed(f"{path}: <{name}> appears twice in /Return/ReturnData/IRS1040")
        values[name] = (child.text or "").strip()
    gold = {}
    for line, element in MEF_LINE_ELEMENTS.items():
        text = values.get(element, "")
        dollars = parse_dollars(text) if text else 0.0
        if dollars is None or dollars != int(dollars):
            raise _Malformed(f"{path}: /Return/ReturnData/IRS1040/{element} = {text!r} is not whole dollars")
        gold[line] = int(dollars)
    return gold, values.get("IndividualReturnFilingStatusCd") or None


# --- input.json -> TaxInput


def _leaf(node: object, where: str) -> object:
    """The ``value`` of a ``{"label": ..., "value": ...}`` leaf (a bare scalar passes as itself)."""
    if isinstance(node, Mapping):
        if "value" not in node:
            raise _Malformed(
                f"{where}: expected a {{'label': ..., 'value': ...}} leaf, got keys {sorted(node)}"
            )
        return node["value"]
    if isinstance(node, list):
        raise _Malformed(f"{where}: expected a {{'label': ..., 'value': ...}} leaf, got a list")
    return node


def _amount(section: Mapping, key: str, where: str) -> Decimal:
    raw = _leaf(section.get(key), f"{where}.{key}")
    if raw is None or raw == "":
        return Decimal(0)
    dollars = None if isinstance(raw, bool) else parse_dollars(raw)
    if dollars is None:
        raise _Malformed(f"{where}.{key}.value = {raw!r} is not a dollar amount")
    return Decimal(str(dollars))


def _flag(section: Mapping, key: str, where: str) -> bool:
    raw = _leaf(section.get(key), f"{where}.{key}")
    if raw is None or isinstance(raw, bool):
        return bool(raw)
    if isinstance(raw, str) and raw.strip().lower() in ("true", "false", "yes", "no", ""):
        return raw.strip().lower() in ("true", "yes")
    raise _Malformed(f"{where}.{key}.value = {raw!r} is not true or false")


def _text(section: Mapping, key: str, where: str) -> str:
    raw = _leaf(section.get(key), f"{where}.{key}")
    return "" if raw is None else str(raw).strip()


def _date(section: Mapping, key: str, where: str) -> date | None:
    raw = _text(section, key, where)
    if not raw:
        return None
    for fmt in ("%Y-%m-%d", "%Y/%m/%d", "%m/%d/%Y"):
        try:
            return datetime.strptime(raw, fmt).date()
        except ValueError:
            pass
    raise _Malformed(f"{where}.{key}.value = {raw!r} is not a date (YYYY-MM-DD, YYYY/MM/DD or MM/DD/YYYY)")


def _section(parent: Mapping, key: str, where: str) -> Mapping:
    node = parent.get(key)
    if node is None:
        return {}
    if not isinstance(node, Mapping):
        raise _Malformed(f"{where}.{key}: expected an object, got {type(node).__name__}")
    return node


def _forms(parent: Mapping, key: str, where: str) -> list[tuple[str, Mapping]]:
    """A repeated form (a list, or one object) as ``(where, form)`` pairs."""
    node = parent.get(key)
    items = [] if node is None else node if isinstance(node, list) else [node]
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise _Malformed(f"{where}.{key}[{i}]: expected an object, got {type(item).__name__}")
    return [(f"{where}.{key}[{i}]", item) for i, item in enumerate(items)]


def _substantive(node: object) -> bool:
    """Does ``node`` hold a non-zero number or a true flag anywhere (strings and nulls do not count)?"""
    if isinstance(node, Mapping):
        return any(_substantive(v) for v in node.values())
    if isinstance(node, list):
        return any(_substantive(v) for v in node)
    if isinstance(node, bool):
        return node
    return isinstance(node, (int, float)) and node != 0


def _map_input(data: object) -> tuple[TaxInput, str, list[str]]:
    """(TaxInput, the filing status as stated, reasons the engine cannot represent the case); raises
    ``_Malformed`` naming the field."""
    if not isinstance(data, Mapping) or not isinstance(data.get("input"), Mapping):
        raise _Malformed("expected a JSON object {'input': {'return_header': ..., 'return_data': ...}}")
    rd = _section(data["input"], "return_data", "input")
    if not rd:
        raise _Malformed("input.return_data is missing or empty")
    reasons: list[str] = []
    for key, node in rd.items():
        if key not in _MAPPED_SECTIONS and _substantive(node):
            leaf = not isinstance(node, Mapping) or ("value" in node and set(node) <= {"label", "value"})
            inner = "" if leaf else " (" + ", ".join(k for k, v in node.items() if _substantive(v)) + ")"
            reasons.append(
                f"{key}{inner}: {_UNMODELLED_SECTIONS.get(key, 'a section this loader does not map')}"
            )
    stated, boxes, children, others, estimated = _map_1040(_section(rd, "irs1040", _RD), reasons)
    status = "married_filing_jointly" if stated == "qualifying_surviving_spouse" else stated  # skipped anyway
    w2s, deferral = _map_w2s(rd, status, reasons)
    interest, ordinary, qualified, gain = _map_investments(rd, reasons)
    try:
        inp = TaxInput(
            filing_status=status, w2s=w2s, taxable_interest=float(interest), ordinary_dividends=float(ordinary),
            qualified_dividends=float(qualified), capital_gain=float(gain), num_qualifying_children=children,
            num_other_dependents=others, estimated_payments=float(estimated), taxpayer_65_or_blind=boxes,
        )  # fmt: skip
    except ValueError as e:
        raise _Malformed(f"{_RD}: values the engine rejects ({e})") from e
    if deferral and compute_1040(inp)["11"] <= _SAVERS_CREDIT_AGI_LIMIT[status]:
        reasons.append(
            "elective deferrals (W-2 box 12) at an AGI that may earn the saver's credit (Form 8880)"
        )
    return inp, stated, reasons


def _map_1040(f1040: Mapping, reasons: list[str]) -> tuple[str, int, int, int, Decimal]:
    """(filing status, 65-or-blind boxes, qualifying children, other dependents, line 26) from ``irs1040``."""
    fw = f"{_RD}.irs1040"
    raw = _text(f1040, "filing_status", fw)
    status = _FILING_STATUS.get(raw.lower().replace(" ", "_").replace("-", "_"))
    if status is None:
        raise _Malformed(f"{fw}.filing_status.value = {raw!r}: use one of {sorted(_FILING_STATUS)}")
    if status == "qualifying_surviving_spouse":
        reasons.append("filing status qualifying surviving spouse")
    for who in ("tp", "sp"):
        if _flag(f1040, f"{who}_dependent", fw):
            reasons.append(
                f"{fw}.{who}_dependent: a filer who can be claimed as a dependent (limited deduction)"
            )
    boxes = 0
    for who in ("tp", "sp") if status == "married_filing_jointly" else ("tp",):
        born = _date(f1040, f"{who}_date_of_birth", fw)
        boxes += int(born is not None and born < _BORN_BEFORE_65) + int(_flag(f1040, f"{who}_blind", fw))
    children = others = 0
    for dw, dep in _forms(f1040, "dependent_detail", fw):
        born = _date(dep, "dependent_date_of_birth", dw)
        if born is None or born > date(2024, 12, 31):
            raise _Malformed(f"{dw}.dependent_date_of_birth: missing or after 2024 ({born})")
        relation = "".join(c for c in _text(dep, "dependent_relationship", dw).lower() if c.isalpha())
        if relation not in _CHILD_RELATIONSHIPS | _OTHER_RELATIONSHIPS:
            raise _Malformed(f"{dw}.dependent_relationship.value {relation!r} is not a known relationship")
        child = relation in _CHILD_RELATIONSHIPS and born >= _BORN_FROM_UNDER_17
        children, others = children + child, others + (not child)
    estimated = sum((_amount(f1040, f"estimated_tax_payment_{q}", fw) for q in range(1, 5)), Decimal(0))
    return status, boxes, children, others, estimated + _amount(f1040, "applied_from_prior_year", fw)


def _map_w2s(rd: Mapping, status: str, reasons: list[str]) -> tuple[tuple[tuple[float, float], ...], bool]:
    """((wages, withholding) per W-2, any elective deferral in box 12) from ``w2``."""
    w2s, medicare, deferral = [], Decimal(0), False
    employers: dict[str, set[str]] = {}
    ss_tax: dict[str, Decimal] = {}
    for ww, w in _forms(rd, "w2", _RD):
        w2s.append((float(_amount(w, "wages", ww)), float(_amount(w, "withholding", ww))))
        person = "spouse" if _text(w, "who_applies_to", ww).lower() == "spouse" else "taxpayer"
        employers.setdefault(person, set()).add(_text(w, "ein", ww))
        ss_tax[person] = ss_tax.get(person, Decimal(0)) + _amount(w, "social_security_tax", ww)
        box5 = _amount(w, "medicare_wages_and_tips", ww)
        medicare += box5
        if box5 > 200_000:
            reasons.append(f"{ww}: Medicare wages over 200,000 (Form 8959)")
        reasons += [f"{ww}.{key}: {what}" for key, what in _W2_UNMODELLED if _amount(w, key, ww)]
        if _flag(w, "statutory_employee", ww):
            reasons.append(f"{ww}.statutory_employee: statutory employee (Schedule C)")
        for ew, entry in _forms(w, "employers_use_grp", ww):
            code = _text(entry, "box_12_code", ew).upper()
            if _amount(entry, "box_12_amount", ew) and code in _UNCOLLECTED_TAX_CODES:
                reasons.append(
                    f"{ew}: W-2 box 12 code {code}, uncollected social security / Medicare tax (Schedule 2)"
                )
            deferral |= code in _DEFERRAL_CODES and _amount(entry, "box_12_amount", ew) > 0
    for person, eins in employers.items():
        if len(eins) > 1 and ss_tax[person] > _SOCIAL_SECURITY_TAX_MAX:
            reasons.append(f"excess social security tax withheld for the {person} (Schedule 3 line 11)")
    if medicare > _ADDITIONAL_MEDICARE_THRESHOLD[status]:
        reasons.append("Medicare wages over the Additional Medicare Tax threshold (Form 8959)")
    return tuple(w2s), deferral


def _map_investments(rd: Mapping, reasons: list[str]) -> tuple[Decimal, Decimal, Decimal, Decimal]:
    """(taxable interest, ordinary dividends, qualified dividends, net long-term gain) from Schedule B's
    1099-INT / 1099-DIV and Form 8949's 1099-B sales."""
    sbw, bw = f"{_RD}.irs1040_scheduleb", f"{_RD}.irs8949"
    sb, f8949 = _section(rd, "irs1040_scheduleb", _RD), _section(rd, "irs8949", _RD)
    reasons += [f"{sbw}.{k}: not mapped by this loader" for k, v in sb.items()
                if k not in _SCHEDULE_B_READ and _substantive(v)]  # fmt: skip
    reasons += [f"{bw}.{k}: not mapped by this loader" for k, v in f8949.items()
                if k != "irs1099_b_grp" and _substantive(v)]  # fmt: skip
    if _substantive(_section(rd, "irs1040_schedule_d", _RD)):
        reasons.append(f"{_RD}.irs1040_schedule_d: capital loss carryover")
    interest = ordinary = qualified = gain = Decimal(0)
    for iw, form in _forms(sb, "irs1099_int", sbw):
        interest += _amount(form, "interest_1099int_interest", iw)
        interest += _amount(form, "interest_1099int_us_saving_bond_treasury_obligations", iw)
        reasons += [f"{iw}.{key}: {what}" for key, what in _INT_UNMODELLED if _amount(form, key, iw)]
    for dw, form in _forms(sb, "irs1099_div", sbw):
        ordinary += _amount(form, "dividend_1099div_ordinary_div", dw)
        qualified += _amount(form, "dividend_1099div_qualified_div", dw)
        gain += _amount(form, "dividend_1099div_capital_gain_distr", dw)
        reasons += [f"{dw}.{key}: {what}" for key, what in _DIV_UNMODELLED if _amount(form, key, dw)]
    for gw, group in _forms(f8949, "irs1099_b_grp", bw):
        for tw, sale in _forms(group, "irs1099_b", gw):
            term = _text(sale, "input_sale_term", tw).lower()
            if term not in ("long_term", "short_term"):
                raise _Malformed(
                    f"{tw}.input_sale_term.value = {term!r}: expected 'long_term' or 'short_term'"
                )
            if term == "short_term":
                reasons.append(f"{tw}: short-term sale (only net long-term gains are modelled)")
            gain += _amount(sale, "proceeds", tw) - _amount(sale, "cost_basis", tw)
            reasons += [f"{tw}.{key}: {what}" for key, what in _B_UNMODELLED if _amount(sale, key, tw)]
    if gain < 0:
        reasons.append(f"net capital loss {gain} (only gains are modelled)")
    return interest, ordinary, qualified, max(gain, Decimal(0))


# ------------------------------------------------------------------------------------------------ scoring


def normalize_line_key(key: str) -> str:
    """``"line_1a"``, ``"L1a"``, ``"Line 35a"``, ``"1A"`` -> ``"1a"``."""
    k = str(key).strip().lower().replace(" ", "_")
    for prefix in ("line_", "line", "l"):
        if k.startswith(prefix) and len(k) > len(prefix) and k[len(prefix)].isdigit():
            k = k[len(prefix) :]
            break
    return k


def score_lines(
    predicted: Mapping[str, float | int | str | None], gold: Mapping[str, int], lenient: bool = False
) -> dict[str, bool]:
    """Per gold line: correct? Strict = parsed prediction equals the gold dollars exactly; lenient = within $5.

    Keys of both mappings are normalised with :func:`normalize_line_key`. Missing or unparsable
    predictions are wrong.
    """
    pred = {normalize_line_key(k): v for k, v in predicted.items()}
    out: dict[str, bool] = {}
    for key, target in gold.items():
        line = normalize_line_key(key)
        value = parse_dollars(pred.get(line))
        if value is None:
            out[line] = False
        elif lenient:
            out[line] = abs(value - target) <= 5
        else:
            out[line] = value == target
    return out


def line_accuracy(
    predicted: Mapping[str, float | int | str | None], gold: Mapping[str, int], lenient: bool = False
) -> float:
    """Fraction of gold lines scored correct by :func:`score_lines`; ``ValueError`` for an empty ``gold``."""
    if not gold:
        raise ValueError("gold has no lines to score")
    scores = score_lines(predicted, gold, lenient)
    return sum(scores.values()) / len(scores)
