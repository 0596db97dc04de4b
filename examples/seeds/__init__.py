"""The callbacks of the lineage docs (pytorch-accelerated, Lightning), written for schedtrain.

Each module trains a tiny model on CPU in a few seconds: ``python
examples/seeds/NAME.py`` (or ``python -m examples.seeds.NAME``) from the repository root.
``tests/docs/test_seeds_examples.py`` checks what each one shows, and
``tests/docs/test_examples_run.py`` runs each as a user does, twice.
"""
