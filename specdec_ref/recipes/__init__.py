"""Training recipes: how the models in ``zoo/`` were made, apart from the library that loads them.

Each is a command (``python -m specdec_ref.recipes.<name> --help``):

- ``train``       the course zoo from scratch: corpus, two tokenizers, ``target``, ``draft``,
                  ``draft-xtok`` and the chat variants
- ``distill``     ``smollm2-draft``, distilled from SmolLM2-135M-Instruct's own outputs
- ``eagle_head``  ``smollm2-eagle``, an EAGLE draft head on SmolLM2's features (its data
                  stages, from prompts to training batches, are in ``eagle_data``)
- ``evaluate``    the zoo's quality figures (zoo/MODELS.md)

Recipes sit above everything else: they import the library, its tools and ``specdec_ref.zoo``,
and nothing outside this package imports them. What the library and the lessons share with
them lives below: SmolLM2's prompt sets in ``specdec_ref.zoo.prompts``, the corpus in
``specdec_ref.zoo.corpus``, ``loop_period`` in ``specdec_ref.stats``.
"""
