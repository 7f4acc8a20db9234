"""Synthetic tax-year-2024 US Form 1040 engine (pure Python, no ML).

Computes the Form 1040 lines that TaxCalcBench evaluates (:data:`EVALUATED_LINES`) for a deliberately small
input model (:class:`TaxInput`), generates random cases of graded difficulty (:func:`generate_case`), loads
TaxCalcBench-style case directories (:func:`load_taxcalcbench`) and scores predicted lines strictly (exact
dollars) or leniently (within $5) (:func:`score_lines`, :func:`line_accuracy`).

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
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, fields
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

__all__ = [
    "ADDITIONAL_STANDARD_DEDUCTION",
    "BRACKETS",
    "EVALUATED_LINES",
    "FILING_STATUSES",
    "QUALIFIED_0_PCT_LIMIT",
    "QUALIFIED_15_PCT_LIMIT",
    "STANDARD_DEDUCTION",
    "TaxInput",
    "compute_1040",
    "generate_case",
    "line_accuracy",
    "load_taxcalcbench",
    "normalize_line_key",
    "parse_dollars",
    "score_lines",
    "tax_on_income",
]

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

_TAXINPUT_FIELDS = tuple(f.name for f in fields(TaxInput))


def normalize_line_key(key: str) -> str:
    """``"line_1a"``, ``"L1a"``, ``"Line 35a"``, ``"1A"`` -> ``"1a"``."""
    k = str(key).strip().lower().replace(" ", "_")
    for prefix in ("line_", "line", "l"):
        if k.startswith(prefix) and len(k) > len(prefix) and k[len(prefix)].isdigit():
            k = k[len(prefix) :]
            break
    return k


def _parse_w2s(raw: object, case: str) -> tuple[tuple[float, float], ...]:
    if not isinstance(raw, list):
        raise ValueError(
            f"case {case!r}: field 'w2s' must be a list of [wages, federal_withholding] pairs "
            f"or {{'wages': ..., 'federal_withholding': ...}} objects"
        )
    out = []
    for i, w in enumerate(raw):
        if isinstance(w, Mapping):
            unknown = set(w) - {"wages", "federal_withholding"}
            if unknown:
                raise ValueError(
                    f"case {case!r}: unknown field(s) {sorted(unknown)} in w2s[{i}]; "
                    f"fix: use only 'wages' and 'federal_withholding'"
                )
            out.append((w.get("wages", 0), w.get("federal_withholding", 0)))
        elif isinstance(w, list) and len(w) == 2:
            out.append((w[0], w[1]))
        else:
            raise ValueError(f"case {case!r}: w2s[{i}] = {w!r} is not a [wages, federal_withholding] pair")
    return tuple(out)


def load_taxcalcbench(directory: str | Path) -> list[tuple[str, TaxInput, dict[str, int]]]:
    """Load TaxCalcBench-style cases: one sub-directory per case, sorted by name.

    Each ``<directory>/<case>/`` must hold

    * ``input.json``: a JSON object whose keys are :class:`TaxInput` field names (all but ``filing_status``
      optional), e.g. ``{"filing_status": "single", "w2s": [[50000, 5000]], "taxable_interest": 120,
      "num_qualifying_children": 1}``; ``w2s`` items are ``[wages, federal_withholding]`` pairs or
      ``{"wages": ..., "federal_withholding": ...}`` objects;
    * ``expected.json``: a JSON object mapping line -> dollars, keys like ``"1a"``, ``"line_1a"`` or ``"L1a"``
      (normalised by :func:`normalize_line_key`); values are numbers or strings such as ``"$1,234"``.

    Returns ``(case_name, TaxInput, {line: dollars})`` per case. Raises ``FileNotFoundError`` naming the path of
    a missing directory / file and ``ValueError`` naming the case, the field and the fix for unknown fields or
    bad values.
    """
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"TaxCalcBench directory not found: {root}")
    cases = []
    for case_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        case = case_dir.name
        raw_input = _read_json_object(case_dir / "input.json", case)
        raw_expected = _read_json_object(case_dir / "expected.json", case)
        unknown = sorted(set(raw_input) - set(_TAXINPUT_FIELDS))
        if unknown:
            raise ValueError(
                f"case {case!r}: unknown field(s) {unknown} in input.json; "
                f"fix: remove them or rename to one of {list(_TAXINPUT_FIELDS)}"
            )
        if "filing_status" not in raw_input:
            raise ValueError(
                f"case {case!r}: input.json lacks 'filing_status'; fix: add one of {FILING_STATUSES}"
            )
        kwargs = dict(raw_input)
        if "w2s" in kwargs:
            kwargs["w2s"] = _parse_w2s(kwargs["w2s"], case)
        try:
            inp = TaxInput(**kwargs)
        except ValueError as e:
            raise ValueError(f"case {case!r}: invalid input.json: {e}") from e
        gold: dict[str, int] = {}
        for key, value in raw_expected.items():
            dollars = parse_dollars(value)
            if dollars is None or dollars != int(dollars):
                raise ValueError(
                    f"case {case!r}: expected.json line {key!r} = {value!r} is not whole dollars; "
                    f"fix: give an integer such as 1234"
                )
            gold[normalize_line_key(key)] = int(dollars)
        cases.append((case, inp, gold))
    return cases


def _read_json_object(path: Path, case: str) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"case {case!r}: missing file {path}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"case {case!r}: {path} is not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"case {case!r}: {path} must hold a JSON object, got {type(data).__name__}")
    return data


# ------------------------------------------------------------------------------------------------ scoring


def parse_dollars(value: object) -> float | None:
    """Parse ``1234``, ``1234.0``, ``"$1,234"``, ``"1234.00"``, ``"-$5"`` -> float; ``None`` if unparsable."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    s = value.strip().replace(",", "").replace(" ", "")
    negative = s.startswith("-")
    s = s.lstrip("-").lstrip("$")
    try:
        x = float(s)
    except ValueError:
        return None
    if not math.isfinite(x):
        return None
    return -x if negative else x


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
