"""Development tooling, not the training API: what the scripts, tests and benchmarks use.

* ``tiny_model``: a tiny Qwen2-style model and tokenizer built offline (``build_tiny_model``);
* ``tiny_vlm``: a tiny Idefics3 vision-language model and its processing class, built offline;
* ``real_model``: SmolLM2-135M-Instruct as a Hugging Face checkpoint, built offline (``build_smollm2``);
* ``cpu_vllm``: a CPU vLLM server started and stopped by PID;
* ``batches``: training rows interleaved by ground truth (``interleave_by_ground_truth``);
* ``cloning``: behaviour cloning on demonstrations, the tiny model's warm start;
* ``miniwob_demonstrations``: demonstrations of BrowserGym's action format on MiniWoB pages;
* ``miniwob_instances``: which MiniWoB++ instances a run trains on and which it holds out;
* ``doors_houses``: the doors game's held-out sign wordings, and the chance that a GRPO run trains nothing;
* ``frozen_lake_rows``: rows for eval-protocol's FrozenLake benchmark, one lake per seed (``--input-dataset``);
* ``record_demonstrations``: demonstrations of an eval's tool calls by a scripted player (``--warm-start``);
* ``run_record``: what a result file records about its run (command, commit, clean tree or not, machine, load),
  written by the benchmarks, the training scripts and ``ep-trl train``.
"""
