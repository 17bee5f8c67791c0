"""``fairseq-rope-serve``: the HTTP service (:mod:`~fairseq_rope_serve.server.app`), its batching
of concurrent requests (:mod:`~fairseq_rope_serve.server.batcher`) and its command line
(:mod:`~fairseq_rope_serve.server.cli`)."""
