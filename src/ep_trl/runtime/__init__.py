"""The process runtime (docs/architecture.md):

* ``threads``: blocking calls in reused pooled threads;
* ``processes``: local server processes started and stopped by PID, under the watchdog;
* ``guard``: the watchdog every started process runs under (run by path, standard library only);
* ``shutdown``: what is closed when the process ends, at exit and on SIGTERM;
* ``grace``: the stop grace, how long a SIGTERM'd process may take to end by itself;
* ``runner``: the one long-lived event loop the rollout calls run on;
* ``versions``: installed-version checks against the ranges in ``pyproject.toml``.
"""
