"""Analyzers: pure functions from facts (and the inventory) to findings.

They hold all diagnostic knowledge, never touch the network, and are tested
on recorded raw outputs.  See ``findings.py`` for the result type and
``registry.py`` for how an analyzer is declared and run.
"""
