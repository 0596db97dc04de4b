"""The callbacks of the lineage docs (pytorch-accelerated, Lightning), written for schedtrain.

Each module trains a tiny model on CPU in a few seconds: ``python -m
examples.seeds.NAME`` from the repository root. ``tests/test_seeds_examples.py`` runs
every one.
"""
