"""Rules: the three kinds of special case, the expression language of ``when``/``grad``, and the
registry that maps group names to their rules."""
