"""The rule catalog, installed as ``speedfix.rules``: one rule per module.

There is no list to update: ``speedfix.engine.registry`` imports every module here and takes the one
``Rule`` subclass each defines. Helper modules shared by rules start with an underscore.
"""
