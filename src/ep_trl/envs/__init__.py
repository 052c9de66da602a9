"""Environments of ep_trl's own, served as local OpenEnv processes (``python -m ep_trl.envs.<name>``):

* ``letters``: the letters game, a deterministic multi-turn text environment;
* ``doors``: the doors game, a seeded multi-turn text environment whose rooms must be read to leave them;
* ``browsergym``: BrowserGym MiniWoB++ in Chromium, with its action parser and prompts;
* ``serving``: the command line every environment server shares.
"""
