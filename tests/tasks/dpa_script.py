"""The scripted DPA roles both the game tests (tests/tasks/test_form_game.py) and the module tests
(tests/methods/test_dpa_module.py) play: one reply list per role, fixed by the line and whether the proposal x
is right, so every flag, case, reward and row is known by hand."""
from __future__ import annotations

from lit_credit.tasks.form import action_text, challenge_text


def script(role: str, row: dict, x: str) -> list[str]:
    """Decisions by (line, x right): 1a right -> NS (case 1); 1a wrong -> SAC, revisions [unparsable, wrong, right,
    right, unparsable] (first 0, first parsable 1, first right 2), REVISE (5a with gold_first); 15 right -> SAC, no
    parsable revision, REVISE (2); 15 wrong -> SAC, all revisions x again (wrong), KEEP (6a). ``x`` is the
    proposal's text."""
    gold, line = row["gold"], row["line"]
    right = x == str(gold)
    if role == "verifier":
        if line == "1a" and right:
            return [action_text(line, "NS")]
        return [action_text(line, "SAC") + "\n" + challenge_text({"claim": str(gold)})]
    if role == "reviser":
        if line == "1a":
            return ["n/a", str(gold + 7), str(gold), str(gold), "n/a"]
        return ["n/a"] * 5 if right else [str(gold + 1)] * 5
    return [action_text(line, "REVISE" if line == "1a" or right else "KEEP")]
