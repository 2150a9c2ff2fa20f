"""The user's project on disk: its configuration, the files a scan reads, the scan cache, and
notebooks as Python sources.
"""
