"""The engine: the rule base class and the catalog, one file's analysis in one batched walk,
findings and their fixes as data, ``# noqa`` suppressions.
"""
