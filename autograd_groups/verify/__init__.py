"""Verify: ``ag.verify`` and ``autograd-groups verify``, which check each rule that fired against the
limits of the automatic derivative at nearby points (docs/verify.md)."""
