"""task=textarena against the real textarena package: for five games a known-good action sequence (the task's own
demonstrator) and known-bad ones get exactly the rewards the package gives when driven directly with ta.make; the
episodes of a row are independent copies of one board; state keys follow the board; held-out layouts never train;
nothing is fetched; the process's random streams are left alone; and two steps run through the entry point."""
from __future__ import annotations

import copy
import itertools
import random
import subprocess
import sys
import textwrap

import pytest

ta = pytest.importorskip("textarena")

from hydra.utils import instantiate  # noqa: E402

from lit_credit.interfaces import Environment, Episode, fork, resume  # noqa: E402
from lit_credit.tasks import TextArenaTask  # noqa: E402
from lit_credit.tasks.textarena import (  # noqa: E402
    TextArenaEnvironment,
    TextArenaEpisode,
    TextArenaReward,
    base_env,
    board,
    content_key,
    frozenlake_plan,
    hanoi_moves,
    replay,
)

GAMES = ["Sokoban-v0", "FrozenLake-v0", "Minesweeper-v0-small", "TowerOfHanoi-v0", "Mastermind-v0"]


@pytest.fixture(scope="module")
def tasks():
    return {g: TextArenaTask(g, num_train=12, num_test=4, max_turns=30, demo_boards=8) for g in GAMES}


def direct(env_id: str, board_seed: int, actions: list[str], towers=None) -> tuple[float | None, int, bool]:
    """The package driven directly: ta.make, reset with the board seed, the actions in turn until the game ends;
    returns (player 0's reward from env.close(), the game's invalid-move notices, done)."""
    env = ta.make(env_id)
    env.reset(num_players=1, seed=board_seed)
    if towers is not None:  # the scrambled TowerOfHanoi start, set as the task sets it
        base_env(env).state.game_state["towers"] = copy.deepcopy(towers)
    notices, done = 0, False
    for action in actions:
        done, _ = env.step(action=action)
        _, messages = base_env(env).get_observation()
        notices += sum("You attempted an invalid move" in m for _, m, _ in messages)
        if done:
            break
    if not done:
        return None, notices, False
    rewards, info = env.close()
    return float(rewards[0]), notices + bool(info[0]["invalid_move"]), True


def start_towers(row):
    return board(row["env_id"], row["board_seed"], row["start"]).base.state.game_state["towers"] \
        if row["env_id"].startswith("TowerOfHanoi") else None


def good_actions(task, row) -> list[str]:
    return [m["content"] for m in task.demonstrate(row) if m["role"] == "assistant"]


def bad_actions(env_id: str, row, good: list[str]) -> list[list[str]]:
    """Known-bad sequences: two unparsable replies (the game's error allowance is one), a partial good game then two
    invalid moves (the game's progress is the reward), and a game-specific loss."""
    bad = [["[?]", "[?]"], [*good[:min(2, len(good) - 1)], "nonsense", "[?]"]]
    template = board(row["env_id"], row["board_seed"], row["start"])
    if env_id.startswith("FrozenLake"):  # walk into a hole
        gs = template.base.state.game_state
        hole = next((r, c) for r, line in enumerate(gs["grid"]) for c, cell in enumerate(line) if cell == "H"
                    and frozenlake_plan([[" " if (i, j) == (r, c) else x for j, x in enumerate(ln)]
                                         for i, ln in enumerate(gs["grid"])], gs["player_pos"], (r, c)))
        grid = [[" " if (i, j) == hole else x for j, x in enumerate(ln)] for i, ln in enumerate(gs["grid"])]
        bad.append(frozenlake_plan(grid, gs["player_pos"], hole))
    elif env_id.startswith("TowerOfHanoi"):  # a larger disk on a smaller one, twice
        towers = template.base.state.game_state["towers"]
        tops = {p: d[-1] for p, d in towers.items() if d}
        big, small = max(tops, key=tops.get), min(tops, key=tops.get)
        bad.append([f"[{big} {small}]"] * 2 if big != small else ["[A B]", "[A B]"])
    elif env_id.startswith("Mastermind"):  # the same guess three times: the repeats are invalid
        bad.append([good[0]] * 3 if len(good) > 1 else ["[1 2 3 4]", "[1 2 3 4]", "[1 2 3 4]"])
    elif env_id.startswith("Minesweeper"):  # a safe first move, then a mine twice
        probe = TextArenaEpisode(row)
        probe.reset()
        probe.step(good[0])
        mine = next((r, c) for r in range(probe.base.rows) for c in range(probe.base.cols)
                    if probe.base.grid[r][c] == -1)
        bad.append([good[0], f"[{mine[0]} {mine[1]}]", f"[{mine[0]} {mine[1]}]"])
    elif env_id.startswith("Sokoban"):  # into the wall around the room, twice
        bad.append(["[up]"] * 8)
    return bad


# ------------------------------------------------------------------------------------------------ rewards
@pytest.mark.parametrize("env_id", GAMES)
def test_good_and_bad_sequences_get_the_packages_own_rewards(env_id, tasks):
    task, reward = tasks[env_id], TextArenaReward()
    for row in [*task.dataset("test"), *list(task.dataset("train"))[:2]]:
        good = good_actions(task, row)
        expected, notices, done = direct(env_id, row["board_seed"], good, start_towers(row))
        result = reward(row, good)
        assert done and expected == 1.0 and result.score == 1.0, (env_id, row["id"], good)
        assert result.parts["win"] == 1.0 and result.parts["invalid_moves"] == notices
        assert result.parts["turns"] == len(good) and result.parts["truncated"] == 0.0
        for bad in bad_actions(env_id, row, good):
            expected, notices, done = direct(env_id, row["board_seed"], bad, start_towers(row))
            result = reward(row, bad)
            assert done, (env_id, bad)  # every bad sequence ends the game by its rules
            assert result.score == expected < 1.0, (env_id, row["id"], bad, result)
            assert result.parts["win"] == 0.0 and result.parts["invalid_moves"] == notices
            assert sum(result.turns["invalid"]) == notices


@pytest.mark.parametrize("env_id", GAMES)
def test_the_episode_ends_as_the_game_does_and_at_the_turn_cap(env_id, tasks):
    task = tasks[env_id]
    row = task.dataset("test")[0]
    good = good_actions(task, row)
    episode = TextArenaEnvironment(max_turns=30).episode(row, seed=5)
    assert isinstance(episode, Episode) and isinstance(TextArenaEnvironment(3), Environment)
    assert episode.reset() == row["prompt"]
    feedback = [episode.step(a) for a in good]
    assert [f.done for f in feedback] == [False] * (len(good) - 1) + [True]
    assert feedback[-1].info["outcome"]["win"] and feedback[-1].info["outcome"]["reward"] == 1.0
    assert all(f.score is None for f in feedback)  # these games score only at their end
    with pytest.raises(RuntimeError, match="ended"):
        episode.step(good[0])
    # The turn cap: one reply before the end, the episode stops, scored as the game scores its own turn limit.
    if len(good) > 1:
        capped = TextArenaEnvironment(max_turns=len(good) - 1).episode(row, seed=0)
        capped.reset()
        last = [capped.step(a) for a in good[:-1]][-1]
        progress = capped.base._get_percentage_completion()
        assert last.done and last.info["outcome"] == {"reward": progress, "win": False, "truncated": True,
                                                      "invalid_loss": False, "reason": "task.max_turns reached"}
        result = TextArenaReward()(row, good[:-1])
        assert result.score == progress and result.parts["truncated"] == 1.0
        assert TextArenaReward(truncated="zero")(row, good[:-1]).score == 0.0


def test_the_reward_refuses_other_rows_and_bad_settings():
    with pytest.raises(ValueError, match="task=textarena"):
        TextArenaReward()({"prompt": [{"role": "user", "content": "What is 1 + 2?"}], "id": "x"}, ["3"])
    with pytest.raises(ValueError, match=r"reward\.truncated"):
        TextArenaReward(truncated="half")


# ------------------------------------------------------------------------------------------------ episodes
@pytest.mark.parametrize("env_id", GAMES)
def test_episodes_of_a_row_are_independent_and_keys_follow_the_board(env_id, tasks):
    task = tasks[env_id]
    row = task.dataset("test")[0]
    good = good_actions(task, row)
    env = task.environment()
    a, b = env.episode(row, 1), env.episode(row, 2)
    assert a.reset() == b.reset() == row["prompt"]  # the row fixes the start, whatever the seed
    assert a.state_key() == b.state_key()
    start = a.state_key()
    a.step(good[0])
    assert a.state_key() != start and b.state_key() == start  # b's board did not move
    b.step("[?]")  # an invalid move: the board stays, the game's warning is part of the state
    assert b.state_key() != start and b.state_key() != a.state_key()
    # Replay (the loop's resume) and clone reach the same state and go on alike.
    again = resume(env, row, 1, good[:1])
    assert again.state_key() == a.state_key()
    twin = fork(a)
    assert twin is not a and twin.state_key() == a.state_key()
    if len(good) > 2:
        fa, ft = a.step(good[1]), twin.step(good[1])
        assert fa == ft and a.state_key() == twin.state_key()
        a.step(good[2])
        assert a.state_key() != twin.state_key()  # independent copies
    # Another board starts in another state.
    other = env.episode(task.dataset("test")[1], 1)
    other.reset()
    assert other.state_key() != start
    assert repr(start) == repr(copy.deepcopy(start))  # a deterministic repr (state_hash)


def test_state_keys_are_the_games_boards():
    task = TextArenaTask("Sokoban-v0", num_train=2, num_test=2)
    episode = TextArenaEpisode(task.dataset("test")[0])
    episode.reset()
    room, warned = episode.state_key()
    assert room == tuple(tuple(int(x) for x in line) for line in episode.base.room_state) and warned == 0
    hanoi = TextArenaEpisode(TextArenaTask("TowerOfHanoi-v0", num_train=2, num_test=2).dataset("test")[0])
    hanoi.reset()
    towers = hanoi.base.state.game_state["towers"]
    assert hanoi.state_key() == (tuple((p, tuple(d)) for p, d in sorted(towers.items())), 0)


def test_the_processs_random_streams_are_left_alone(tasks):
    row = tasks["Minesweeper-v0-small"].dataset("test")[0]
    random.seed(123)
    before = random.getstate()
    episode = TextArenaEpisode(row)
    episode.reset()
    episode.step("[2 2]")  # places the mines from the game's own stream
    assert random.getstate() == before
    # ... and the game is the row's, whatever the process drew in between.
    other = TextArenaEpisode(row)
    other.reset()
    random.random()
    other.step("[2 2]")
    assert other.base.grid == episode.base.grid


def test_the_rollout_loop_plays_the_episodes(tasks):
    from lit_credit.models import build_tokenizer
    from lit_credit.rollout import ChatCodec, run_episodes, to_batch
    from lit_credit.types import Completion, SamplingParams, state_hash

    task = tasks["FrozenLake-v0"]
    row = task.dataset("test")[0]
    good = good_actions(task, row)
    codec = ChatCodec(build_tokenizer(list(task.corpus(20)), 300))

    class Scripted:
        """Rollout 0 plays the good game, rollout 1 two invalid moves."""

        def __init__(self):
            self.turn = 0

        def generate(self, prompts, sampling, seeds=None):
            def completion(text):
                ids = [*codec.tokenizer(text, add_special_tokens=False)["input_ids"], codec.tokenizer.eos_token_id]
                return Completion(ids, [-0.5] * len(ids), text)
            if sampling.n > 1:
                out = [[completion(good[0]), completion("[?]")]]
            else:
                texts = {2: [good[self.turn] if self.turn < len(good) else "[?]", "[?]"], 1: [good[self.turn]]}
                out = [[completion(t)] for t in texts[len(prompts)]]
            self.turn += 1
            return out

    trajectories = run_episodes(Scripted(), codec, task.environment(), [row], [0], SamplingParams(n=2),
                                max_turns=task.max_turns, seeds=[7])
    rewards = [TextArenaReward()(row, t.replies) for t in trajectories]
    batch = to_batch(trajectories, rewards, codec.pad_id)
    assert trajectories[0].replies == good and rewards[0].score == 1.0
    assert trajectories[1].replies == ["[?]", "[?]"] and rewards[1].parts["invalid_loss"] == 1.0
    assert batch.state_keys[0, 0] == batch.state_keys[1, 0]  # one start
    keys = [state_hash(k) for k in [replay(row, good[:k]).state_key() for k in range(len(good))]]
    assert batch.state_keys[0, :len(good)].tolist() == keys
    assert batch.observations[0][0] == row["prompt"][0]["content"]


# ------------------------------------------------------------------------------------------------ splits, demos
@pytest.mark.parametrize("env_id", GAMES)
def test_held_out_layouts_never_train_nor_demonstrate(env_id, tasks):
    task = tasks[env_id]
    test, train = task.dataset("test"), task.dataset("train")
    held = {content_key(r) for r in test}
    assert len(held) == len(test) == 4 and not held & {content_key(r) for r in train}
    assert {"prompt", "id", "env_id", "board_seed", "start", "layout"} <= set(test.column_names)
    # deterministic, and the test split does not depend on num_train
    again = TextArenaTask(env_id, num_train=3, num_test=4, max_turns=30)
    assert again.dataset("test")["id"] == test["id"]
    demos = list(task.demonstrations(20, seed=1))
    assert len(demos) == 20
    if env_id.split("-")[0] in ("Sokoban", "FrozenLake", "TowerOfHanoi"):  # the first observation shows the board
        prompts = {r["prompt"][0]["content"] for r in test}
        assert not prompts & {d["messages"][0]["content"] for d in demos}
    for demo in demos[:4]:  # observation, action, observation, ..., the winning action
        roles = [m["role"] for m in demo["messages"]]
        assert roles[0] == "user" and roles[-1] == "assistant"
        assert all(x != y for x, y in itertools.pairwise(roles))


def test_the_layout_is_the_hidden_board_where_the_first_observation_shows_none():
    # Mastermind and Minesweeper boards all look alike at the start; their layouts (the code, the mines) differ.
    for env_id in ("Mastermind-v0", "Minesweeper-v0-small"):
        rows = TextArenaTask(env_id, num_train=2, num_test=6).dataset("test")
        assert len({r["prompt"][0]["content"] for r in rows}) == 1 and len({content_key(r) for r in rows}) == 6
    mm = [board("Mastermind-v0", s).base.state.game_state["secret_code"] for s in range(3)]
    assert len({tuple(c) for c in mm}) == 3


def test_tower_of_hanoi_starts_and_the_recursion():
    task = TextArenaTask("TowerOfHanoi-v0", num_train=30, num_test=8)
    starts = {r["layout"] for r in [*task.dataset("test"), *task.dataset("train")]}
    assert len(starts) <= 26
    assert hanoi_moves({"A": [3, 2, 1], "B": [], "C": []}, 3) == [("A", "C"), ("A", "B"), ("C", "B"), ("A", "C"),
                                                                  ("B", "A"), ("B", "C"), ("A", "C")]
    assert hanoi_moves({"A": [], "B": [], "C": [3, 2, 1]}, 3) == []
    with pytest.raises(ValueError, match=r"task\.env_id=TowerOfHanoi-v0.*task\.num_test=30"):
        TextArenaTask("TowerOfHanoi-v0", num_train=5, num_test=30).dataset("test")  # 26 boards
    with pytest.raises(ValueError, match=r"task\.num_test"):
        TextArenaTask("TowerOfHanoi-v0", num_train=5, num_test=2, hanoi_start="standard").dataset("test")


def test_bad_games_and_settings_name_the_key():
    with pytest.raises(ValueError, match=r"task\.env_id='Sokoban-v9'.*Sokoban-v0"):
        TextArenaTask("Sokoban-v9")
    with pytest.raises(ValueError, match="downloads nltk data"):
        TextArenaTask("Wordle-v0")  # TextArena's word games fetch nltk data when made: refused
    with pytest.raises(ValueError, match="single-player"):
        TextArenaTask("TicTacToe-v0")
    with pytest.raises(ValueError, match=r"task\.hanoi_start"):
        TextArenaTask("TowerOfHanoi-v0", hanoi_start="random")
    with pytest.raises(ValueError, match="no demonstrator"):
        list(TextArenaTask("LightsOut-v0", num_train=2, num_test=2).demonstrations(2, 0))


def test_nothing_is_fetched():
    """Importing textarena, making the five games, drawing rows and demonstrations: no connection attempted."""
    code = textwrap.dedent(f"""
        import socket
        def refuse(*args, **kwargs):
            raise AssertionError(f"network access attempted: {{args}}")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        socket.getaddrinfo = refuse
        import textarena as ta
        from lit_credit.tasks.textarena import TextArenaTask
        for env_id in {GAMES!r}:
            env = ta.make(env_id)
            env.reset(num_players=1, seed=0)
            task = TextArenaTask(env_id, num_train=2, num_test=2, demo_boards=2)
            list(task.demonstrations(2, 0))
        print("offline")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "offline" in out.stdout, out.stderr[-2000:]


# ------------------------------------------------------------------------------------------------ entry point
def test_the_task_conf_composes_with_its_reward(make_cfg):
    cfg = make_cfg("task=textarena", fast_task=False)
    assert isinstance(instantiate(cfg.reward), TextArenaReward)
    task = instantiate(cfg.task)
    assert isinstance(task, TextArenaTask) and task.env_id == "Sokoban-v0"
    cfg = make_cfg("task=textarena", "task.env_id=Mastermind-v0", "reward=exact_match", fast_task=False)
    assert not isinstance(instantiate(cfg.reward), TextArenaReward)  # reward=... still wins


def test_two_steps_through_the_entry_point(make_cfg):
    """`lit-credit task=textarena task.env_id=Sokoban-v0 trainer.max_steps=2`, smaller (about 15 s with the build)."""
    from lit_credit.train import train

    cfg = make_cfg("task=textarena", "task.env_id=Sokoban-v0", "trainer.max_steps=2", "task.num_train=8",
                   "task.num_test=2", "task.demo_boards=8", "data.max_turns=3", "data.prompts_per_step=2",
                   "data.val_prompts=2", "data.sampling.n=2", "data.sampling.max_new_tokens=8",
                   "model.embedded.sft_steps=10", "model.embedded.sft_batch_size=8", fast_task=False)
    metrics = train(cfg)
    assert "train/reward/win" in metrics and "train/reward/invalid_moves" in metrics, sorted(metrics)
    assert 0.0 <= metrics["train/reward/game_reward"] <= 1.0
