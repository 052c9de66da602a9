"""Held-out episodes of an environment eval: the model's turns read back from the sampled ids, and the three figures
(task success, well-formed actions, success among well-formed episodes)."""

from types import SimpleNamespace

import pytest

from ep_trl.cli.heldout import HeldOutEpisode, HeldOutEpisodes, _sampled_turns, play_held_out
from ep_trl.devtools.miniwob_demonstrations import page_actions_of


def test_each_run_of_sampled_ids_is_one_model_turn():
    assert _sampled_turns([1, 2, 9, 9, 3, 4, 9], [1, 1, 0, 0, 1, 1, 0]) == [[1, 2], [3, 4]]
    assert _sampled_turns([5], [0]) == []


def test_success_among_well_formed_episodes_leaves_out_any_episode_with_a_fallen_back_action():
    played = HeldOutEpisodes((
        HeldOutEpisode("click-button", ("click('12')",), (True,), 1.0, "finished"),
        HeldOutEpisode("click-button", ("click('13')",), (True,), 0.0, "finished"),
        HeldOutEpisode("enter-text", ("fill('14', 'Ann')", "I would"), (True, False), 0.0, "finished",
                       instance={"seed": 14}),
        HeldOutEpisode("enter-text", (), (), None, "error"),
    ))
    assert played.success == pytest.approx(0.25)
    assert played.well_formed_rate == pytest.approx(3 / 4)
    assert played.success_when_well_formed == pytest.approx(0.5)
    assert played.per_task() == {"click-button": 0.5, "enter-text": 0.0}
    assert HeldOutEpisodes(()).success_when_well_formed is None
    assert played.summary("after training") == (
        "held-out after training: task success 0.250 (click-button 0.500, enter-text 0.000); well-formed actions "
        "0.750; success among well-formed episodes 0.500 (4 episodes, greedy)")
    assert "success among well-formed episodes n/a (0 episodes" in HeldOutEpisodes(()).summary("before training")
    assert played.rows()[2] == {"task": "enter-text", "instance": {"seed": 14},
                                "turns": ["fill('14', 'Ann')", "I would"],
                                "parsed": [True, False], "score": 0.0, "status": "finished", "prompt_tokens": 0,
                                "completion_tokens": 0}
    assert played.rows()[3]["instance"] is None


class FakeRollout:
    """Named fake: stands in for a rollout function's output, to check how play_held_out reads it."""

    def __init__(self):
        self.calls = []

    def run(self, prompts, caller, first_group=None):
        self.calls.append((prompts, caller, first_group))
        return {"prompt_ids": [[1, 2, 3], [1, 2]], "completion_ids": [[7, 8, 0, 9], [7]], "env_mask": [[1, 1, 0, 1], [1]],
                "eval_score": [1.0, 0.0],
                "episode_status": ["finished", "finished"], "instance": [{"seed": 3, "wording": "locked"}, None]}


def test_play_held_out_plays_greedily_one_episode_per_group_and_rotates_tasks():
    tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens: {(7, 8): "click('1')", (9,): "done",
                                                                         (7,): "hm"}[tuple(ids)])
    rollout = FakeRollout()
    played = play_held_out(rollout, "P", tasks=["a", "b"], episodes=2, tokenizer=tokenizer, base_url="http://x",
                           parsed=lambda text: "(" in text, max_episode_tokens=64)
    (prompts, caller, first_group), = rollout.calls
    assert prompts == ["P", "P"] and first_group == 0
    assert caller.config.sampling.temperature == 0.0 and caller.config.num_generations == 1
    assert caller.synced_server().url == "http://x"
    assert [(e.task, e.turns, e.parsed, e.score) for e in played.episodes] == [
        ("a", ("click('1')", "done"), (True, False), 1.0), ("b", ("hm",), (False,), 0.0)]
    assert [(e.prompt_tokens, e.completion_tokens) for e in played.episodes] == [(3, 4), (2, 1)]
    assert [e.instance for e in played.episodes] == [{"seed": 3, "wording": "locked"}, None]  # what each reset said


def test_the_format_demonstrated_on_a_page_is_every_click_and_every_fill_with_the_goal_s_text():
    page = SimpleNamespace(clickable_bids=["14", "15"], goal='Enter "Kanesha" into the text field and press Submit.',
                           axtree_txt="RootWebArea\n\t[14] textbox '', clickable\n\t[15] button 'Submit', clickable")
    assert page_actions_of(page) == ("click('14')", "click('15')", "fill('14', 'Kanesha')")
    no_text = SimpleNamespace(clickable_bids=["13"], goal="Click the button.", axtree_txt="[13] button 'Click Me!'")
    assert page_actions_of(no_text) == ("click('13')",)
