"""The micro world: generated small repositories for the embedded default (see generate.py)."""
