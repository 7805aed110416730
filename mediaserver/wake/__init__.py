"""Wake words: the models (``models``) and a detector per audio stream (``detector``)."""
