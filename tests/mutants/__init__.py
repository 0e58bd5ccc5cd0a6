"""Histories to mutate (issue 17, item 11): small but realistic journals per family, and the judge
that reads a journal exactly as ``pdchaos check`` does (tests/harness/test_journal_mutants.py)."""
