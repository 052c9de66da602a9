"""The seam that puts a rollout's images into TRL's forward passes, which TRL 1.16 does not do for ``rollout_func``.

TRL 1.16's ``GRPOTrainer._generate``, on its ``rollout_func`` branch, sets ``images = None`` and hands every extra
key of the rollout output to the reward functions; ``_generate_and_score_completions`` then builds pixel inputs only
from the dataset's own image columns, by re-rendering the dataset prompt as text. The screenshots an episode saw
never reach the logprobs TRL computes, so a vision-language model would be trained on the image tokens without
their pixels.

:class:`RolloutImagesGRPOTrainer` takes the ``images`` key of the rollout output (per sample, the images in
placeholder order across prompt and completion, whose expanded tokens the returned ids already hold) and builds the
vision inputs from the returned ids, as TRL's own tool-image path does (``ep_trl.trajectory.vision_inputs``). It extends
three methods of ``GRPOTrainer``, each calling TRL's own:

* ``_generate``: takes ``images`` out of the extra fields (reward functions do not receive PIL images);
* ``_get_per_token_logps_and_entropies``: adds the vision inputs to the forward passes TRL makes while scoring the
  batch (old and reference logprobs, hence the importance-sampling ratio and its
  ``sampling/sampling_logp_difference`` metric);
* ``_generate_and_score_completions``: adds ``pixel_values`` (and ``image_grid_thw``, ``pixel_attention_mask``,
  ``mm_token_type_ids`` as the model needs) with ``num_images`` to the batch it returns, which TRL's loss passes to
  the same forward and its batch splitting/shuffling already handles.

``tests/trainers/test_images.py`` pins this against the installed TRL, including that plain ``GRPOTrainer`` still
drops the images: when a TRL release takes images from ``rollout_func`` that test fails, and this module and the
``takes_rollout_images`` class attribute go.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, cast

from trl import GRPOTrainer

from ..adapters import trl_seam
from ..adapters.output import IMAGES_KEY
from ..errors import VersionError
from ..trajectory.vision_inputs import VisionInputs, vision_inputs

if TYPE_CHECKING:
    import torch

    from ..trajectory.types import Image, MultimodalProcessingClass, Prompt

#: The forward keywords of ``GRPOTrainer._get_per_token_logps_and_entropies`` the vision inputs go through.
FORWARD_KEYWORDS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "mm_token_type_ids")

#: ``GRPOTrainer._generate`` returns (prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields,
#: images, tool_images) in TRL 1.16.
_GENERATE_RESULT_SIZE = 8
_EXTRA_FIELDS_AT = 5


class RolloutImagesGRPOTrainer(GRPOTrainer):
    """A ``GRPOTrainer`` whose forward passes see the images a ``rollout_func`` returns under ``images``.

    Use it in place of ``GRPOTrainer`` with a vision-language model and an eval whose observations carry images;
    everything else is TRL's. Without images in the rollout output it behaves exactly like ``GRPOTrainer``.
    """

    #: Read by ep_trl's rollout function (``trl_seam.GRPOTrainerCaller.takes_rollout_images``): images it renders
    #: into episodes reach this trainer's forward passes.
    takes_rollout_images = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        trl_seam.require_tested("images", "RolloutImagesGRPOTrainer")
        missing = [
            k
            for k in FORWARD_KEYWORDS
            if k not in inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).parameters
        ]
        if missing:
            raise VersionError(
                f"GRPOTrainer._get_per_token_logps_and_entropies in this TRL takes no {missing}; ep_trl's image seam "
                "(ep_trl.trainers.images) cannot attach. Use the TRL versions pyproject.toml names."
            )
        super().__init__(*args, **kwargs)
        self._rollout_images: list[list[Image]] | None = None
        self._rollout_vision: VisionInputs | None = None

    def _generate(self, prompts: list[Prompt]) -> tuple[object, ...]:
        result = super()._generate(prompts)
        if len(result) != _GENERATE_RESULT_SIZE or not isinstance(result[_EXTRA_FIELDS_AT], dict):
            raise VersionError(
                "GRPOTrainer._generate in this TRL returns another shape than TRL 1.16's; ep_trl's "
                "image seam (ep_trl.trainers.images) cannot find the rollout's images."
            )
        images = result[_EXTRA_FIELDS_AT].pop(IMAGES_KEY, None)
        if images is not None:
            if len(images) != len(result[0]):
                raise ValueError(
                    f"rollout_func returned images for {len(images)} samples and ids for "
                    f"{len(result[0])}; it must return one list of images per sample"
                )
            self._rollout_images = [list(sample) for sample in images]
        return result

    def _generate_and_score_completions(self, inputs: list[dict[str, object]]) -> dict[str, object]:
        self._rollout_images = None
        self._rollout_vision = None
        try:
            output = super()._generate_and_score_completions(inputs)
            if self._rollout_images is not None:
                import torch

                vision = self._vision(torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1))
                if vision is not None:
                    output.update(vision.model_kwargs)
                    output["num_images"] = vision.num_images
            return output
        finally:
            self._rollout_images = None
            self._rollout_vision = None

    def _get_per_token_logps_and_entropies(
        self,
        model: torch.nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        *args: object,
        **kwargs: object,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        if self._rollout_images is not None and kwargs.get("pixel_values") is None:
            vision = self._vision(input_ids)  # scoring the batch being generated: TRL passes no images
            if vision is not None:
                kwargs.update(vision.model_kwargs)
                kwargs["num_images"] = vision.num_images
        return super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )

    def _vision(self, prompt_completion_ids: torch.Tensor) -> VisionInputs | None:
        """The batch's vision inputs, built once per generation batch (on the trainer's device)."""
        if self._rollout_vision is None:
            assert self._rollout_images is not None
            vision = vision_inputs(
                cast("MultimodalProcessingClass", self.processing_class), prompt_completion_ids, self._rollout_images
            )
            if vision is None:
                return None
            device = self.accelerator.device
            self._rollout_vision = VisionInputs(
                {k: v.to(device) for k, v in vision.model_kwargs.items()}, vision.num_images
            )
        return self._rollout_vision
