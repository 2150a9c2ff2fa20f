"""What `speedfix scan` and `speedfix apply` do over a tree of files, for the command line and
the editor server alike.
"""
