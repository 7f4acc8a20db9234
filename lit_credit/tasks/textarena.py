"""Task ``textarena``: any registered single-player `TextArena <https://github.com/LeonGuertler/TextArena>`_ game
(``task.env_id=Sokoban-v0``, ``FrozenLake-v0``, ``Minesweeper-v0-small``, ``TowerOfHanoi-v0``, ``Mastermind-v0``, ...)
played by the package's own rules, rendering and outcome; nothing is fetched at run time.

A row is a board: the game's reset seed (``board_seed``) fixes it, so every episode of a row plays the same game.
Each rollout is its own :class:`TextArenaEpisode` (``lit_credit.interfaces``): a deep copy of the row's game after
``reset(num_players=1, seed=board_seed)`` (made once per row and cached), whose first observation (the game's
prompt and board) is the prompt; each reply goes to the game as the action (``env.step(action=reply)``, through the
game's registered wrappers, so ``up`` is read as ``[up]`` as the package does); the next user message is what the game
said since (its messages but the echo of the action, each stripped, separated by a blank line). The episode ends
when the game does or after ``task.max_turns`` replies. TextArena draws its randomness from Python's global
``random`` (seeded at reset: ``State.__init__`` calls ``random.seed``) and Minesweeper places its mines there at the
first move; every episode runs the package on its own copy of the global ``random`` and ``numpy.random`` streams,
taken right after the row's reset, and puts the process's streams back after each call. So a game is a function of
its row and the replies: the episode's ``seed`` is recorded, not used (the n rollouts of a row play one game and
differ only by their replies), and the reward replays the replies to read the outcome.

Invalid moves count as the game counts them: TextArena's single-player state warns on the first invalid move
(the game says why; the turn is not counted) and ends the game on a second one in a row, with the reward the game
gives then (these five games: their progress, e.g. Sokoban's share of boxes on targets). Hitting a mine in
Minesweeper is one of its invalid moves.

Three parts:

- :class:`TextArenaTask`: rows (the held-out split by layout, :func:`content_key`), demonstrations from a solver
  where the game has one (:data:`ADAPTERS`), the tokenizer corpus;
- :class:`TextArenaEnvironment` / :class:`TextArenaEpisode`: the stateful episodes (``state_key()``: the game's board
  where an adapter reads one, else the last observation text; ``clone()``: a deep copy);
- :class:`TextArenaReward` (``reward=textarena``, the task's default): the game's own reward, from a replay.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import itertools
import random
from collections import deque
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import datasets
import numpy as np

from lit_credit.tasks.base import Task, heldout_split, optional_package
from lit_credit.types import Feedback, RewardResult

INSTALL = "textarena==0.7.4"
DEMO_OFFSET = 1_000_000_007  # demonstration boards come from seeds this far from the split's
SEED_STRIDE = 10_000_000  # task.seed s draws board seeds s * SEED_STRIDE, s * SEED_STRIDE + 1, ...
FIX = "lower task.num_train / task.num_test (the game has few distinct boards), or pick a larger variant"


def _ta():
    return optional_package("textarena", "textarena", INSTALL)


# ------------------------------------------------------------------------------------------------ random streams
class Streams:
    """A game's own copy of Python's global ``random`` and ``numpy.random`` states: :meth:`active` runs package code
    on them and puts the process's states back afterwards (TextArena reseeds and draws from the global ones)."""

    def __init__(self, py: tuple, np_state: tuple) -> None:
        self.py, self.np = py, np_state

    @classmethod
    def seeded(cls, seed: int) -> Streams:
        py, np_state = random.getstate(), np.random.get_state()
        try:
            random.seed(seed)
            np.random.seed(seed % 2 ** 32)
            return cls(random.getstate(), np.random.get_state())
        finally:
            random.setstate(py)
            np.random.set_state(np_state)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        saved_py, saved_np = random.getstate(), np.random.get_state()
        random.setstate(self.py)
        np.random.set_state(self.np)
        try:
            yield
        finally:
            self.py, self.np = random.getstate(), np.random.get_state()
            random.setstate(saved_py)
            np.random.set_state(saved_np)

    def copy(self) -> Streams:
        return Streams(self.py, copy.deepcopy(self.np))


def _plain(value: Any) -> Hashable:
    """A canonical, hashable copy of game state (arrays and lists as tuples, dicts as sorted item tuples)."""
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _plain(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return tuple(sorted(_plain(v) for v in value))
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def base_env(game: Any) -> Any:
    """The game under its wrappers (``ta.make`` wraps it in observation and action wrappers)."""
    ta = _ta()
    while isinstance(game, ta.Wrapper):
        game = game.env
    return game


def drain(game: Any) -> str:
    """What the game said to the player since the last call (its pending messages but the echo of the player's
    own action), each stripped, separated by a blank line."""
    ta = _ta()
    _, messages = base_env(game).get_observation()
    return "\n\n".join(str(m).strip() for _, m, kind in messages
                       if kind != ta.ObservationType.PLAYER_ACTION and str(m).strip())


# ------------------------------------------------------------------------------------------------ per-game adapters
class Adapter:
    """What lit-credit knows of one game beyond TextArena's interface (:data:`ADAPTERS`, by the game class's name).
    The default knows nothing: the state key is the observation text, the layout the first observation with the
    game's ``state.game_state``, no start change and no demonstrator."""

    def state_key(self, base: Any, layout: str) -> Hashable | None:
        """The game's state (``layout``: the row's, for a state that does not show its board); None: none."""
        return None

    def layout(self, base: Any, streams: Streams, first: str) -> Hashable:
        return first, _plain(getattr(base.state, "game_state", None))

    def prepare(self, base: Any, board_seed: int, start: str) -> None:
        """Change the start after reset (TowerOfHanoi's scrambled starts); the default keeps the game's."""

    def demonstrate(self, base: Any) -> Iterator[str] | None:
        """Actions that win from the current state, read lazily (the game moves on between them); None: no
        demonstrator for this game."""
        return None


DIRECTIONS = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


class SokobanAdapter(Adapter):
    """Sokoban: the state is the room (walls, targets, boxes, player); the demonstrator is a breadth-first search
    over (player, boxes) states, bounded by ``max_states``, so its plans are shortest in moves."""

    max_states = 200_000

    def state_key(self, base: Any, layout: str) -> Hashable:
        return _plain(base.room_state)

    def demonstrate(self, base: Any) -> Iterator[str] | None:
        plan = sokoban_plan(base.room_fixed, base.room_state, self.max_states)
        return None if plan is None else iter(plan)


def sokoban_plan(room_fixed: np.ndarray, room_state: np.ndarray, max_states: int = 200_000) -> list[str] | None:
    """A shortest push-and-walk plan (``[up]`` ...) that puts every box on a target, by the package's rules
    (walls 0, floor 1, targets 2; boxes 3 / 4, player 5); None when none is found within ``max_states`` states."""
    rows, cols = room_fixed.shape
    walls = {(r, c) for r in range(rows) for c in range(cols) if room_fixed[r, c] == 0}
    targets = frozenset((r, c) for r in range(rows) for c in range(cols) if room_fixed[r, c] == 2)
    boxes = frozenset((r, c) for r in range(rows) for c in range(cols) if room_state[r, c] in (3, 4))
    (player,) = [(int(r), int(c)) for r, c in np.argwhere(room_state == 5)]
    goal = targets if len(targets) == len(boxes) else None
    start = (player, boxes)
    parents: dict[tuple, tuple | None] = {start: None}
    queue = deque([start])

    def inside(p):
        return 0 <= p[0] < rows and 0 <= p[1] < cols and p not in walls

    while queue:
        state = queue.popleft()
        pos, bx = state
        if (goal is not None and bx == goal) or (goal is None and bx <= targets):
            plan = []
            while parents[state] is not None:
                state, move = parents[state]
                plan.append(f"[{move}]")
            return plan[::-1]
        for move, (dr, dc) in DIRECTIONS.items():
            nxt = (pos[0] + dr, pos[1] + dc)
            if not inside(nxt):
                continue
            nbx = bx
            if nxt in bx:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if not inside(beyond) or beyond in bx:
                    continue
                nbx = (bx - {nxt}) | {beyond}
            new = (nxt, nbx)
            if new not in parents:
                parents[new] = (state, move)
                if len(parents) > max_states:
                    return None
                queue.append(new)
    return None


class FrozenLakeAdapter(Adapter):
    """FrozenLake: the state is the grid and the player's position; the demonstrator a shortest path (breadth-first
    search over the grid, around the holes)."""

    def state_key(self, base: Any, layout: str) -> Hashable:
        gs = base.state.game_state
        return _plain(gs["grid"]), _plain(gs["player_pos"])

    def demonstrate(self, base: Any) -> Iterator[str] | None:
        gs = base.state.game_state
        plan = frozenlake_plan(gs["grid"], tuple(gs["player_pos"]), tuple(gs["goal_pos"]))
        return None if plan is None else iter(plan)


def frozenlake_plan(grid: Sequence[Sequence[str]], start: tuple[int, int], goal: tuple[int, int]) -> list[str] | None:
    """A shortest path from ``start`` to ``goal`` that steps on no hole ``H``, as actions ``[down]`` ...; None when
    there is none."""
    size = len(grid)
    parents: dict[tuple[int, int], tuple | None] = {start: None}
    queue = deque([start])
    while queue:
        pos = queue.popleft()
        if pos == goal:
            plan = []
            while parents[pos] is not None:
                pos, move = parents[pos]
                plan.append(f"[{move}]")
            return plan[::-1]
        for move, (dr, dc) in DIRECTIONS.items():
            nxt = (pos[0] + dr, pos[1] + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and grid[nxt[0]][nxt[1]] != "H" and nxt not in parents:
                parents[nxt] = (pos, move)
                queue.append(nxt)
    return None


class MinesweeperAdapter(Adapter):
    """Minesweeper: the mines are placed at the first move (around the first cell, from the game's random stream),
    so a board's layout is its mine layout under every possible first move; the state is the mines (once placed)
    and the revealed cells, with the board's layout (before the first move the mines are still in the game's
    random stream). No solver: the demonstrator is an oracle that knows the mines (a safe first move in the
    middle, then the first hidden safe cell in reading order), so its demonstrations teach the format and the
    rules, not inference."""

    def state_key(self, base: Any, layout: str) -> Hashable:
        return layout, _plain(base.grid), _plain(base.revealed)  # the mines are unplaced before the first move

    def layout(self, base: Any, streams: Streams, first: str) -> Hashable:
        layouts = []
        for r, c in itertools.product(range(base.rows), range(base.cols)):
            probe = copy.deepcopy(base)
            probe.grid = [[0] * base.cols for _ in range(base.rows)]
            with streams.copy().active():
                probe.setup_mines(r, c)
            layouts.append(tuple((i, j) for i in range(base.rows) for j in range(base.cols) if probe.grid[i][j] == -1))
        return first, tuple(layouts)

    def demonstrate(self, base: Any) -> Iterator[str]:
        def moves():
            yield f"[{base.rows // 2} {base.cols // 2}]"
            while True:
                hidden = [(r, c) for r in range(base.rows) for c in range(base.cols)
                          if not base.revealed[r][c] and base.grid[r][c] != -1]
                if not hidden:
                    return
                yield f"[{hidden[0][0]} {hidden[0][1]}]"
        return moves()


class TowerOfHanoiAdapter(Adapter):
    """TowerOfHanoi: the state is the towers. The game always starts with every disk on A, one board, so no
    held-out board could differ from a training one: with ``task.hanoi_start=scrambled`` (the task default) a row
    starts from a legal placement of the disks drawn from its board seed (any but the solved one: 26 boards with 3
    disks), played by the package's rules from there (its turn limit counts from that start). The demonstrator is
    the classic recursion, from any legal placement (move the disks above the largest misplaced one out of the way,
    move it, then stack the rest on it): the shortest solution."""

    def state_key(self, base: Any, layout: str) -> Hashable:
        return _plain(base.state.game_state["towers"])

    def prepare(self, base: Any, board_seed: int, start: str) -> None:
        if start == "standard":
            return
        n, goal = base.num_disks, list(range(base.num_disks, 0, -1))
        rng = random.Random(f"hanoi:{board_seed}")
        while True:
            pegs = {d: rng.choice("ABC") for d in range(n, 0, -1)}
            towers = {p: [d for d in range(n, 0, -1) if pegs[d] == p] for p in "ABC"}
            if towers["C"] != goal:
                break
        base.state.game_state["towers"] = towers
        ta = _ta()
        pending = base.state.observations[0]
        board = f"Current Board: \n{base._render_board()}."
        base.state.observations[0] = [(f, board if kind == ta.ObservationType.GAME_BOARD else m, kind)
                                      for f, m, kind in pending]

    def demonstrate(self, base: Any) -> Iterator[str]:
        towers = base.state.game_state["towers"]
        return iter(f"[{a} {b}]" for a, b in hanoi_moves(towers, base.num_disks))


def hanoi_moves(towers: Mapping[str, Sequence[int]], num_disks: int, target: str = "C") -> list[tuple[str, str]]:
    """The shortest move list that stacks every disk on ``target`` from any legal placement ``towers`` (peg ->
    disks bottom to top): the classic recursion generalised to any start."""
    where = {d: peg for peg, disks in towers.items() for d in disks}
    moves: list[tuple[str, str]] = []

    def put(k: int, peg: str) -> None:  # disks 1..k onto peg
        if k == 0:
            return
        if where[k] == peg:
            put(k - 1, peg)
            return
        spare = ({"A", "B", "C"} - {where[k], peg}).pop()
        put(k - 1, spare)
        moves.append((where[k], peg))
        where[k] = peg
        put(k - 1, peg)

    put(num_disks, target)
    return moves


class MastermindAdapter(Adapter):
    """Mastermind: the state is the secret code and the guesses with their pegs; the board (the layout) is the
    secret code, which the game keeps in its state (the first observation is the same for every code). The
    demonstrator guesses the first code, in lexicographic order, consistent with every answer so far."""

    def state_key(self, base: Any, layout: str) -> Hashable:
        gs = base.state.game_state
        return _plain(gs["secret_code"]), tuple((tuple(h["guess"]), h["black"], h["white"]) for h in gs["history"])

    def demonstrate(self, base: Any) -> Iterator[str]:
        gs = base.state.game_state
        digits = range(1, gs["num_numbers"] + 1)
        pool = itertools.product(digits, repeat=gs["code_length"]) if gs["duplicate_numbers"] else \
            itertools.permutations(digits, gs["code_length"])
        codes = [list(c) for c in pool]

        def pegs(secret, guess):
            black = sum(a == b for a, b in zip(secret, guess))
            common = sum(min(secret.count(d), guess.count(d)) for d in set(guess))
            return black, common - black

        def moves():
            while True:
                history = gs["history"]
                code = next((c for c in codes if all(pegs(c, h["guess"]) == (h["black"], h["white"])
                                                     for h in history) and c not in [h["guess"] for h in history]),
                            None)
                if code is None:
                    return
                yield "[" + " ".join(map(str, code)) + "]"
        return moves()


ADAPTERS: dict[str, Adapter] = {"SokobanEnv": SokobanAdapter(), "FrozenLakeEnv": FrozenLakeAdapter(),
                                "MinesweeperEnv": MinesweeperAdapter(), "TowerOfHanoiEnv": TowerOfHanoiAdapter(),
                                "MastermindEnv": MastermindAdapter()}


def adapter_of(base: Any) -> Adapter:
    return ADAPTERS.get(type(base).__name__, Adapter())


# ------------------------------------------------------------------------------------------------ games of rows
class Board:
    """A row's game right after reset (and the start change of its adapter): the game, its random streams, the
    first observation and the layout. Episodes deep-copy it."""

    def __init__(self, env_id: str, board_seed: int, start: str) -> None:
        ta = _ta()
        if env_id not in ta.envs.registration.ENV_REGISTRY:
            import difflib
            close = difflib.get_close_matches(env_id, list(ta.envs.registration.ENV_REGISTRY), n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "see textarena.envs.registration.ENV_REGISTRY"
            raise ValueError(f"task.env_id={env_id!r}: not a registered TextArena game ({hint})")
        if fetches(env_id):
            raise ValueError(f"task.env_id={env_id!r}: this game downloads nltk data when it is made (nltk.download: "
                             "a network fetch at run time); task=textarena plays games that run offline, e.g. "
                             f"{', '.join(GAMES)}")
        self.streams = Streams.seeded(board_seed)
        with self.streams.active():
            self.game = ta.make(env_id)
            try:
                self.game.reset(num_players=1, seed=board_seed)
            except AssertionError as err:  # TextArena's single-player state asserts num_players == 1
                raise ValueError(f"task.env_id={env_id!r}: not a single-player game ({err}); task=textarena plays "
                                 "single-player games") from err
            self.base = base_env(self.game)
            self.adapter = adapter_of(self.base)
            self.adapter.prepare(self.base, board_seed, start)
            self.first = drain(self.game)
        self.layout = self.adapter.layout(self.base, self.streams, self.first)

    def progress(self) -> float:
        """The game's own share of completion (what these games score at their turn limit), 0 without one."""
        fn = getattr(self.base, "_get_percentage_completion", None)
        return float(fn()) if fn is not None else 0.0


GAMES = ("Sokoban-v0", "FrozenLake-v0", "Minesweeper-v0-small", "TowerOfHanoi-v0", "Mastermind-v0")  # tested


@functools.lru_cache(maxsize=256)
def fetches(env_id: str) -> bool:
    """Whether the game's module downloads data when the game is made (TextArena's word games call
    ``nltk.download``; their shared ``EnglishDictionary`` too): read from its source, before importing it."""
    import importlib.util
    import pathlib
    entry = _ta().envs.registration.ENV_REGISTRY[env_id].entry_point
    if not isinstance(entry, str):
        return False
    spec = importlib.util.find_spec(entry.split(":")[0])
    if spec is None or spec.origin is None:
        return False
    source = pathlib.Path(spec.origin).read_text(errors="replace")
    return "nltk" in source or "EnglishDictionary" in source


@functools.lru_cache(maxsize=4096)
def board(env_id: str, board_seed: int, start: str = "scrambled") -> Board:
    """The (cached) :class:`Board` of ``env_id`` reset with ``board_seed``; never stepped, only copied."""
    return Board(env_id, board_seed, start)


def layout_key(value: Hashable) -> str:
    """A layout as a short stable string (BLAKE2b of its ``repr``): the rows' ``layout`` column."""
    return hashlib.blake2b(repr(value).encode(), digest_size=12).hexdigest()


def content_key(row: Mapping[str, Any]) -> str:
    """A row's content key: its board's layout (:meth:`Adapter.layout`: the first observation with the game's
    state after reset, the mines under every first move for Minesweeper), as the row keeps it."""
    return row["layout"]


# ------------------------------------------------------------------------------------------------ episodes
class TextArenaEpisode:
    """One rollout's game (:class:`~lit_credit.interfaces.Episode`): a deep copy of the row's :class:`Board` with
    its own random streams. ``step`` ends the episode at the game's end or after ``max_turns`` replies; the last
    feedback's ``info["outcome"]`` holds the game's result (``reward``, ``win``, ``invalid_loss``, ``truncated``,
    ``reason``); every feedback's ``info["invalid"]`` says whether the game took the reply as an invalid move."""

    def __init__(self, row: Mapping[str, Any], seed: int = 0, max_turns: int | None = None) -> None:
        self.row, self.seed, self.max_turns = row, seed, max_turns

    def reset(self) -> list[dict[str, str]]:
        template = board(self.row["env_id"], int(self.row["board_seed"]), self.row.get("start", "scrambled"))
        copied = copy.deepcopy(template)
        self.board, self.game, self.streams = copied, copied.game, copied.streams
        self.base, self.adapter = copied.base, copied.adapter
        self.observation, self.turns, self.invalid = template.first, 0, []
        self.done, self.outcome = False, None
        return [{"role": "user", "content": template.first}]

    def step(self, reply: str) -> Feedback:
        if self.done:
            raise RuntimeError("the episode has ended")
        with self.streams.active():
            done, _ = self.game.step(action=reply)
            text = drain(self.game)
        self.turns += 1
        state = self.base.state
        game_info = state.game_info.get(0, {}) if isinstance(getattr(state, "game_info", None), dict) else {}
        invalid = bool(getattr(state, "error_count", 0)) or bool(done and game_info.get("invalid_move"))
        self.invalid.append(invalid)
        truncated = not done and self.max_turns is not None and self.turns >= self.max_turns
        info: dict[str, Any] = {"invalid": invalid}
        if done or truncated:
            self.done = True
            if done:
                with self.streams.active():
                    rewards, final = self.game.close()
                reward = float((rewards or {}).get(0, 0.0))
                self.outcome = {"reward": reward, "win": reward >= 1.0, "truncated": False,
                                "invalid_loss": bool(final.get(0, {}).get("invalid_move")),
                                "reason": str(final.get(0, {}).get("reason", ""))}
            else:
                self.outcome = {"reward": self.board.progress(), "win": False, "truncated": True,
                                "invalid_loss": False, "reason": "task.max_turns reached"}
            info["outcome"] = dict(self.outcome)
        self.observation = text
        return Feedback(done=self.done, messages=[{"role": "user", "content": text}] if text else [], info=info)

    def state_key(self) -> Hashable:
        key = self.adapter.state_key(self.base, self.row.get("layout", ""))
        if key is None:
            return self.observation
        return key, int(getattr(self.base.state, "error_count", 0))  # a warned player is one invalid move from losing

    def clone(self) -> TextArenaEpisode:
        return copy.deepcopy(self)


class TextArenaEnvironment:
    """The episodes of a TextArena game (:class:`~lit_credit.interfaces.Environment`), each up to ``max_turns``
    replies."""

    def __init__(self, max_turns: int) -> None:
        self.max_turns = max_turns

    def episode(self, row: dict[str, Any], seed: int) -> TextArenaEpisode:
        return TextArenaEpisode(row, seed, self.max_turns)


def replay(row: Mapping[str, Any], replies: Sequence[str]) -> TextArenaEpisode:
    """The row's game played with ``replies`` (those after its end ignored), with no turn cap: a game is a function
    of its row and the replies."""
    episode = TextArenaEpisode(row)
    episode.reset()
    for reply in replies:
        if episode.done:
            break
        episode.step(reply)
    return episode


class TextArenaReward:
    """``reward=textarena``: the game's own reward (``env.close()``'s reward of player 0), read by replaying the
    episode's replies on the row's game (the game is a function of its row and the replies; the loop keeps no
    ``info`` of a last feedback). An episode the game did not end (``task.max_turns``, or the rollout's own limits)
    scores ``truncated``: ``progress`` (default) the game's completion share, what these games give at their own
    turn limit (``_get_percentage_completion``), or ``zero``.

    Parts: ``win`` (the game's reward is 1: solved), ``game_reward`` (the score), ``invalid_moves`` (replies the game
    took as invalid, warnings included), ``invalid_loss`` (the game ended on an invalid move), ``turns`` (replies),
    ``truncated``; per turn: ``invalid``."""

    def __init__(self, truncated: str = "progress") -> None:
        if truncated not in ("progress", "zero"):
            raise ValueError(f"reward.truncated={truncated!r}: use progress or zero")
        self.truncated = truncated

    def __call__(self, row: dict[str, Any], replies: list[str], tool_responses: Sequence[str] | None = None,
                 turn_scores: Sequence[float | None] | None = None) -> RewardResult:
        if "env_id" not in row or "board_seed" not in row:
            raise ValueError("reward=textarena scores rows of task=textarena (they name their game and board seed); "
                             "use it with task=textarena, or another reward for this task")
        episode = replay(row, replies)
        if episode.outcome is None:  # not ended by the game
            episode.outcome = {"reward": episode.board.progress(), "win": False, "truncated": True,
                               "invalid_loss": False}
        out = episode.outcome
        score = 0.0 if out["truncated"] and self.truncated == "zero" else out["reward"]
        parts = {"win": float(out["win"]), "game_reward": score, "invalid_moves": float(sum(episode.invalid)),
                 "invalid_loss": float(out["invalid_loss"]), "turns": float(len(replies)),
                 "truncated": float(out["truncated"])}
        return RewardResult(score, parts, turns={"invalid": [float(x) for x in episode.invalid]})


# ------------------------------------------------------------------------------------------------ the task
class TextArenaTask(Task):
    """Boards of the single-player TextArena game ``env_id``, one per row.

    The draw walks board seeds ``seed * SEED_STRIDE``, ``+1``, ...; test is the first ``num_test`` distinct layouts
    (:func:`content_key`), train the next ``num_train`` boards whose layout is not held out (a training layout may
    repeat under another seed: small games have few boards, TowerOfHanoi's scrambled starts 26)
    (:func:`~lit_credit.tasks.base.heldout_split`). Each row: ``prompt`` (the game's first observation),
    ``id`` (``env_id/board_seed``), ``env_id``, ``board_seed``, ``start`` and ``layout``.

    ``max_turns``: the episode's turn cap (replies, valid or not). Demonstrations (the embedded policy's warm start)
    play the game's demonstrator (:class:`Adapter`: shortest paths for FrozenLake and Sokoban, the recursion for
    TowerOfHanoi, consistent guesses for Mastermind, a mine-aware oracle for Minesweeper) on up to ``demo_boards``
    boards that are not held out, keeping the games it wins within ``max_turns`` moves, cycled to the number asked
    for; a game without a demonstrator is an error there (use a model of your own: ``model.path=...``).
    """

    name = "textarena"

    def __init__(self, env_id: str = "Sokoban-v0", num_train: int = 256, num_test: int = 16, max_turns: int = 12,
                 demo_boards: int = 128, hanoi_start: str = "scrambled", seed: int = 0) -> None:
        if num_train < 1 or num_test < 1:
            raise ValueError(f"task.num_train={num_train}, task.num_test={num_test}: both must be >= 1")
        if max_turns < 1:
            raise ValueError(f"task.max_turns={max_turns}: must be >= 1")
        if demo_boards < 1:
            raise ValueError(f"task.demo_boards={demo_boards}: must be >= 1")
        if hanoi_start not in ("scrambled", "standard"):
            raise ValueError(f"task.hanoi_start={hanoi_start!r}: use scrambled (26 boards with 3 disks) or standard "
                             "(the game's one start: no held-out board can differ from a training one)")
        self.env_id, self.num_train, self.num_test, self.max_turns = str(env_id), num_train, num_test, max_turns
        self.demo_boards, self.hanoi_start, self.seed = demo_boards, hanoi_start, seed
        self.ta_version = _ta_version()
        board(self.env_id, 0, self.hanoi_start)  # an unknown or multi-player game fails here, by name
        self._splits: dict[str, datasets.Dataset] = {}

    def row(self, board_seed: int) -> dict[str, Any]:
        b = board(self.env_id, board_seed, self.hanoi_start)
        return {"prompt": [{"role": "user", "content": b.first}], "id": f"{self.env_id}/{board_seed}",
                "env_id": self.env_id, "board_seed": board_seed, "start": self.hanoi_start,
                "layout": layout_key(b.layout)}

    def _rows(self, base: int) -> Iterator[dict[str, Any]]:
        for i in itertools.count():
            yield self.row(base + i)

    def dataset(self, split: str) -> datasets.Dataset:
        if split not in ("train", "test"):
            raise ValueError(f"split={split!r}: use 'train' or 'test'")
        if not self._splits:
            # A game with few boards runs dry fast: give up after 2,000 + 10 x the counts repeated layouts.
            splits = heldout_split(self._rows(self.seed * SEED_STRIDE), content_key, self.num_train, self.num_test,
                                   fix=FIX, where=f"task.env_id={self.env_id}, task.num_train={self.num_train}, "
                                                  f"task.num_test={self.num_test}",
                                   max_misses=2_000 + 10 * (self.num_train + self.num_test))
            self._splits = {k: datasets.Dataset.from_list(v) for k, v in splits.items()}
        return self._splits[split]

    def environment(self) -> TextArenaEnvironment:
        return TextArenaEnvironment(self.max_turns)

    def demonstrate(self, row: Mapping[str, Any]) -> list[dict[str, str]] | None:
        """The demonstrator's game on the row's board as chat messages (observation, action, observation, ...,
        the winning action), or None when it has no demonstrator or does not win within ``max_turns`` moves."""
        episode = TextArenaEpisode(row, max_turns=self.max_turns)
        messages = episode.reset()
        moves = episode.adapter.demonstrate(episode.base)
        if moves is None:
            return None
        for action in moves:
            feedback = episode.step(action)
            messages.append({"role": "assistant", "content": action})
            if feedback.done:
                break
            messages += feedback.messages
        return messages if episode.outcome is not None and episode.outcome["win"] else None

    def demonstrations(self, num: int, seed: int) -> Iterable[dict[str, Any]]:
        """``num`` winning games of the demonstrator on up to ``demo_boards`` boards (seeds ``DEMO_OFFSET`` x
        (seed + 1) away from the split's) whose layout is not held out, cycled."""
        if num <= 0:
            return
        held_out = {content_key(row) for row in self.dataset("test")}
        games: list[list[dict[str, str]]] = []
        tried = 0
        for row in self._rows(self.seed * SEED_STRIDE + DEMO_OFFSET * (seed + 1)):
            if tried >= 20 * self.demo_boards or len(games) >= min(num, self.demo_boards):
                break
            tried += 1
            if content_key(row) in held_out:
                continue
            if type(board(self.env_id, row["board_seed"], self.hanoi_start).adapter).demonstrate is Adapter.demonstrate:
                raise ValueError(f"task.env_id={self.env_id}: no demonstrator for this game, so the embedded policy "
                                 f"has no warm start; games with one: {', '.join(sorted(ADAPTERS))}; or use a model "
                                 "of your own (model.path=...)")
            messages = self.demonstrate(row)
            if messages is not None:
                games.append(messages)
        if not games:
            raise ValueError(f"task.env_id={self.env_id}: the demonstrator won no game within task.max_turns="
                             f"{self.max_turns} moves on {tried} boards; raise task.max_turns")
        for i in range(num):
            yield {"messages": games[i % len(games)]}

    def corpus(self, num: int = 2000) -> Iterable[str]:
        """The rendered demonstrations, and the game's answers to invalid moves (the texts the policy reads when
        it errs)."""
        yield from super().corpus(min(num, 2 * self.demo_boards))
        row = self.row(self.seed * SEED_STRIDE + DEMO_OFFSET)
        episode = TextArenaEpisode(row, max_turns=self.max_turns)
        episode.reset()
        yield episode.step("[?]").observation_text()


def _ta_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    _ta()
    try:
        return version("textarena")
    except PackageNotFoundError:
        return "unknown"
