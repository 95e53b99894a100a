"""speczoo.models."""
