"""API tokens: a role and a scope each, stored only as hashes (docs/security.md)."""
