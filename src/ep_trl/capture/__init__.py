"""Capturing the model calls of an eval's own rollout processor as token-exact trajectories.

* ``endpoint``: the OpenAI-compatible endpoint the processor calls (``/v1/chat/completions``);
* ``placement``: one rollout's calls placed against the tokens it holds (first, extend, fork) and generated;
* ``wire``: chat messages as the wire carries them, compared canonically and rendered in template form;
* ``parsing``: tool calls read with TRL's parser for the model's chat template.

``ep_trl.sources.processor`` runs the processor and turns each capture into an episode.
"""
