"""``fairseq-rope-serve``: the HTTP service (:mod:`~fairseq_rope_serve.server.app`), its batching
of concurrent requests (:mod:`~fairseq_rope_serve.server.batcher`) and its command line
(:mod:`~fairseq_rope_serve.server.cli`); what LibreTranslate's clients send, read
(:mod:`~fairseq_rope_serve.server.fields`) and checked (:mod:`~fairseq_rope_serve.server.validate`);
HTML text (:mod:`~fairseq_rope_serve.server.html`) and language detection
(:mod:`~fairseq_rope_serve.server.detect`)."""
