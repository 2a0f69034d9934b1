"""Playbooks: a declarative bring-up sequence in YAML, loaded, validated and run with the deploy engine's pieces, with their custom gates."""
