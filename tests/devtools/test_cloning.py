"""Behaviour cloning of the tiny model on demonstrations: every answer ends up with its fair share, the result is
cached by its inputs, and the measured probabilities are the model's own (teacher-forced, recomputed here)."""

from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from ep_trl.devtools.cloning import CloningRecipe, CloningTarget, answer_probabilities, clone_on_demonstrations

DEMONSTRATIONS = (
    CloningTarget(messages=({"role": "user", "content": "Press the button."},), answers=("click('3')", "hover('3')")),
    CloningTarget(messages=({"role": "user", "content": "Scroll."},), answers=("scroll(0, 200)",)),
)


def test_every_answer_gets_its_fair_share_and_the_result_is_cached(tiny_model_dir: Path, tmp_path: Path) -> None:
    recipe = CloningRecipe(fair_share=0.8)
    cloned = clone_on_demonstrations(tiny_model_dir, tmp_path / "a", DEMONSTRATIONS, recipe, cache_dir=tmp_path / "c")
    assert not cloned.cached and cloned.steps > 0
    assert all(p >= 0.8 * 0.5 for p in cloned.answer_probabilities[0]) and cloned.answer_probabilities[1][0] >= 0.8
    model = AutoModelForCausalLM.from_pretrained(cloned.path)
    measured = answer_probabilities(model, AutoTokenizer.from_pretrained(cloned.path), DEMONSTRATIONS)
    flat = [p for group in cloned.answer_probabilities for p in group]
    assert [p for group in measured for p in group] == pytest.approx(flat, abs=1e-3)
    untrained = answer_probabilities(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        AutoTokenizer.from_pretrained(tiny_model_dir),
        DEMONSTRATIONS,
    )
    assert max(max(p) for p in untrained) < 0.01  # random weights write none of them

    again = clone_on_demonstrations(tiny_model_dir, tmp_path / "b", DEMONSTRATIONS, recipe, cache_dir=tmp_path / "c")
    assert again.cached and again.answer_probabilities == cloned.answer_probabilities
    other = clone_on_demonstrations(
        tiny_model_dir, tmp_path / "d", DEMONSTRATIONS[:1], recipe, cache_dir=tmp_path / "c"
    )
    assert not other.cached  # other inputs, another entry


def test_a_recipe_that_cannot_converge_says_what_to_change(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="did not converge in 1 steps.*raise CloningRecipe.max_steps"):
        clone_on_demonstrations(
            tiny_model_dir, tmp_path / "a", DEMONSTRATIONS, CloningRecipe(max_steps=1), cache_dir=tmp_path / "c"
        )


def test_bad_input_is_refused_naming_the_fix() -> None:
    with pytest.raises(ValueError, match="distinct, non-empty answers"):
        CloningTarget(messages=({"role": "user", "content": "x"},), answers=("a", "a"))
    with pytest.raises(ValueError, match="between 0 and 1"):
        CloningRecipe(fair_share=1.0)


def test_answers_branched_off_one_prompt_get_the_log_probabilities_of_whole_sequences(tiny_model_dir: Path) -> None:
    """Cloning runs a demonstration's prompt once and its answers off the prompt's cache: each answer's log-probability
    is what the model gives the whole sequence, prompt and answer, and gradients reach the weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from ep_trl.devtools.cloning import _answer_log_probs, _batch

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    examples = [([5, 6, 7, 8], [[9, 10, 2], [11, 2]]), ([3, 4, 5], [[12, 2]])]
    branched = _answer_log_probs(model, _batch(examples, 0))
    whole = []
    for prompt, answers in examples:
        for answer in answers:
            with torch.no_grad():
                log_probs = torch.log_softmax(model(torch.tensor([prompt + answer])).logits[0], dim=-1)
            whole.append(sum(log_probs[len(prompt) - 1 + i, token].item() for i, token in enumerate(answer)))
    assert torch.allclose(branched, torch.tensor(whole), atol=1e-4), (branched, whole)
    branched.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
