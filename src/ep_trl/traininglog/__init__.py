"""The training log: the rows of training rollouts that ``ep logs`` shows, and the writer that stores them
(docs/ep-logs.md)."""
