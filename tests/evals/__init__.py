"""Eval modules used as fixtures by the bridge's tests.

Files are named ``eval_*.py`` so pytest does not collect them. Import them as
modules (``import tests.evals.eval_letters as ev``), never ``from ... import
test_*``: a decorated eval imported by name into a test module would be
collected and run as a pytest test there. No ``from __future__ import
annotations`` here: eval-protocol checks annotations by identity.
"""
