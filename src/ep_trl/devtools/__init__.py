"""Development tooling, not the training API: what the scripts, tests and benchmarks use.

* ``tiny_model``: a tiny Qwen2-style model and tokenizer built offline (``build_tiny_model``);
* ``scripts``: the training scripts' progress printer and local environment server context manager;
* ``training_modes``: the training scripts' generation flags (``--vllm-base-url``, ``--vllm-mode colocate``,
  ``--async``), the combinations they refuse, and the config and trainer of each mode.
"""
