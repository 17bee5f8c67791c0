"""Registered fairseq models of the plugin (imported for their registration)."""

from fairseq_rope.models import transformer_alibi, transformer_rope, transformer_rpe  # noqa: F401
