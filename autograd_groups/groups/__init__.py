"""Annotate: the three ways to mark a group (decorator, ``with`` block, ``tag``) and the life of a
group instance, from its forward-time opening to the rule sites it installs."""
