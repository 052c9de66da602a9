"""The training log (docs/ep-logs.md):

* ``rows``: the eval-protocol rows of training rollouts that ``ep logs`` shows;
* ``writer``: the background writer that stores them, and their token view.
"""
