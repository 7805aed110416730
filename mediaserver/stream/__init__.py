"""The stream core every streaming face shares: ``session`` (``StreamSession``: audio in, speech
events and transcripts out), with beside it ``partials`` (the partial decodes and their append-only
promises), ``turns`` (the turn check: the turn model's scoring of pauses), ``finals`` (final
transcriptions, started early and sent in order) and ``options`` (``StreamOptions``, and what the
parts read of their session, below them all)."""
